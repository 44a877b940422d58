"""The documentation is executable: docs cannot drift from the API.

* Every ```python block in ``docs/**/*.md`` runs, in a fresh namespace per file and in order within a file
  (later blocks see earlier blocks' names), in a temporary working directory. A block fenced
  ```python no-run (code that needs a real checkpoint or the hub) is only compiled, and its
  ``vrh_interp`` imports are resolved, so renamed or removed names still fail here.
* Every ``vrh ...`` command line in a ```bash block is parsed by the real argument parser (not run).
* ``docs/families.md`` equals what ``docs/_generate_families.py`` renders from the adapter classes.
* ``docs/api.md`` names every public export and every CLI subcommand and option, names no option a subcommand
  lacks, and its ``vrh --help`` block is what the parser prints.
* README's runnable examples are blocks of the quickstart (so they run here); relative links in the docs and
  README resolve.
* ``docs/reference/`` (the mkdocstrings pages) is current, and ``mkdocs.yml``'s nav lists every page; the
  strict site build itself runs in ``.ci/run``.

Blocks are compiled under a synthetic file name registered in ``linecache`` and padded so that line numbers
are those of the Markdown file: a failing block's traceback points at ``docs/<file>.md`` line N, and nnsight,
which reads a ``with model.trace(...)`` block's own source back, finds it.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import linecache
import re
import shlex
import sys
import time
import types
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
RUN_OPTIONS = {"no-run"}
SECONDS_PER_BLOCK = 60.0  # generous (shared CPUs): catches a doc example that trains or loads a real model


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first code line in the Markdown file
    language: str
    options: frozenset[str]
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    """Fenced code blocks of a Markdown file (indented fences inside lists included)."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        indent, fence, info = match.group("indent"), match.group("fence"), match.group("info").strip()
        words = info.split()
        body: list[str] = []
        index += 1
        while index < len(lines):
            closing = FENCE.match(lines[index])
            if (closing and closing.group("fence").startswith(fence[0] * len(fence))
                    and not closing.group("info").strip()):
                break
            line = lines[index]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            index += 1
        else:
            raise AssertionError(f"{path.relative_to(ROOT)}: unclosed code fence opened with {fence}{info}")
        start = index - len(body) + 1  # 1-based line of the first body line
        blocks.append(Block(path, start, words[0] if words else "", frozenset(words[1:]), "\n".join(body) + "\n"))
        index += 1
    return blocks


def doc_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def python_blocks(path: Path) -> list[Block]:
    return [b for b in code_blocks(path) if b.language == "python"]


def compiled(block: Block):
    """Compile a block so that tracebacks and nnsight see the Markdown file's line numbers."""
    filename = f"<{block.where}>"
    source = "\n" * (block.line - 1) + block.code
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return compile(source, filename, "exec")


def test_docs_exist():
    names = {p.relative_to(DOCS).as_posix() for p in doc_files()}
    expected = {"quickstart.md", "families.md", "scoring.md", "api.md", "recipes/trace-and-ablate.md",
                "recipes/attention-readout.md", "recipes/new-family.md"}
    assert expected <= names, f"missing docs: {sorted(expected - names)}"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_python_blocks_are_fenced_correctly(path: Path):
    for block in python_blocks(path):
        unknown = block.options - RUN_OPTIONS
        assert not unknown, f"{block.where}: unknown fence option(s) {sorted(unknown)} (allowed: {sorted(RUN_OPTIONS)})"
        compiled(block)  # syntax errors fail here, also for no-run blocks


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run a file's blocks in order, in one fresh namespace, in a scratch working directory."""
    blocks = [b for b in python_blocks(path) if "no-run" not in b.options]
    if not blocks:
        pytest.skip("no executable python blocks")
    monkeypatch.chdir(tmp_path)
    # the file runs as a module of its own, as a script would (a dataclass in a block looks its module up)
    module = types.ModuleType(f"docs_{path.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for block in blocks:
        started = time.perf_counter()
        failure = None
        try:
            exec(compiled(block), namespace)  # noqa: S102 - executing our own documentation is the point
        except Exception:  # report the block and a traceback whose doc frames carry Markdown line numbers
            failure = traceback.format_exc()
        if failure is not None:
            pytest.fail(f"the python block at {block.where} failed:\n{failure}", pytrace=False)
        elapsed = time.perf_counter() - started
        assert elapsed < SECONDS_PER_BLOCK, f"{block.where}: block took {elapsed:.1f} s; keep doc examples tiny"


SESSION_NAMES = ("vlm", "scores", "result", "pairs", "samples", "model", "heads", "batch")  # what users name theirs


def bound_names(code: str) -> set[str]:
    """Names a block assigns at its top level (``x = ``, ``a, b = ``, ``with ... as x``, ``for x in``)."""
    found: set[str] = set()
    for node in ast.parse(code).body:
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)):
            targets = [node.target]
        elif isinstance(node, ast.With):
            targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
        found |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    return found


@pytest.mark.parametrize("path", sorted((DOCS / "recipes").glob("*.md")), ids=lambda p: p.name)
def test_recipes_say_which_session_names_they_rebind(path: Path):
    # issue 55: a recipe pasted into a session overwrote the user's `scores`; each page says what it rebinds
    bound = set().union(*(bound_names(b.code) for b in python_blocks(path)))
    rebinds = [name for name in SESSION_NAMES if name in bound]
    note = next((line for line in path.read_text(encoding="utf-8").splitlines()[:5]
                 if line.startswith("> **Names:**")), "")
    if rebinds:
        assert note, f"{path.name} binds {rebinds}: say so in a '> **Names:**' line under its title"
    assert re.findall(r"`(\w+)`", note) == rebinds, (path.name, note, rebinds)


def _vrh_imports(code: str) -> list[tuple[str, str | None]]:
    """(module, name) pairs of ``import vrh_interp...`` / ``from vrh_interp... import name`` statements."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "vrh_interp"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vrh_interp":
            found += [(node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_no_run_blocks_import_existing_names(path: Path):
    for block in python_blocks(path):
        if "no-run" not in block.options:
            continue
        for module_name, name in _vrh_imports(block.code):
            module = importlib.import_module(module_name)
            if name is not None and not hasattr(module, name):
                importlib.import_module(f"{module_name}.{name}")  # a submodule imported by name


def _cli_commands(code: str) -> list[str]:
    """``vrh ...`` command lines of a shell block (continuations joined, prompts and comments dropped)."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|;", line.split(" #")[0]):
            part = part.strip().removeprefix("$ ").strip()
            if part.startswith("vrh ") or part == "vrh":
                commands.append(part)
    return commands


@pytest.mark.parametrize("path", [*doc_files(), ROOT / "README.md"], ids=lambda p: p.name)
def test_cli_examples_parse(path: Path):
    from vrh_interp.apps.cli import build_parser

    for block in code_blocks(path):
        if block.language not in ("bash", "sh", "shell", "console"):
            continue
        for command in _cli_commands(block.code):
            argv = shlex.split(command)[1:]
            if "--help" in argv or "-h" in argv:
                continue
            try:
                build_parser().parse_args(argv)
            except SystemExit as error:
                raise AssertionError(f"{block.where}: `{command}` does not parse with vrh's argument parser") from error


def _load_generator():
    spec = importlib.util.spec_from_file_location("_generate_families", DOCS / "_generate_families.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_families_doc_is_up_to_date():
    rendered = _load_generator().render()
    current = (DOCS / "families.md").read_text(encoding="utf-8")
    assert current == rendered, "docs/families.md is stale: run `python docs/_generate_families.py`"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from vrh_interp.apps.cli import build_parser

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices)


def test_api_doc_covers_public_api_and_cli():
    import vrh_interp

    text = (DOCS / "api.md").read_text(encoding="utf-8")
    missing = [name for name in vrh_interp.__all__ if f"`{name}" not in text and f"vrh.{name}" not in text]
    assert not missing, f"docs/api.md does not document {missing}"
    sections = re.split(r"^#{2,4} ", text, flags=re.MULTILINE)
    shared_start = text.index("Options shared by")
    shared = text[shared_start:text.index("\n### ", shared_start)]  # the table of options several commands share
    for name, sub in _subcommands().items():
        section = next((s for s in sections if s.startswith(f"`vrh {name}`")), None)
        assert section is not None, f"docs/api.md has no section headed `vrh {name}`"
        section = " ".join(section.split())
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    documented = option in section or ("the shared ones" in section and f"`{option}`" in shared)
                    assert documented, f"docs/api.md section `vrh {name}` does not mention {option}"


LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("path", [*doc_files(), ROOT / "README.md"], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path: Path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    for match in LINK.finditer(text):
        target = match.group("target").split("#")[0]
        if not target or re.match(r"^[a-z]+:", target):
            continue
        resolved = (path.parent / target).resolve()
        assert resolved.exists(), f"{path.relative_to(ROOT)}: link to {target} does not resolve"


def test_api_doc_cli_help_is_the_parsers(monkeypatch: pytest.MonkeyPatch):
    """The `vrh --help` block of docs/api.md is what the parser prints (at 80 columns)."""
    from vrh_interp.apps.cli import build_parser

    monkeypatch.setenv("COLUMNS", "80")
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    block = next(b for b in code_blocks(DOCS / "api.md") if b.language == "text" and b.code.startswith("usage: vrh"))
    assert block.code == build_parser().format_help(), \
        "docs/api.md: the `vrh --help` block is stale: paste the output of `COLUMNS=80 vrh --help`"
    assert text.count("usage: vrh") == 1


def test_api_doc_mentions_only_options_the_cli_has():
    """The reverse of test_api_doc_covers_public_api_and_cli: an option named in a `vrh X` section exists."""
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    subcommands = _subcommands()
    for section in re.split(r"^#{2,4} ", text, flags=re.MULTILINE):
        match = re.match(r"`vrh ([a-z-]+)`", section)
        if match is None:
            continue
        known = {option for action in subcommands[match.group(1)]._actions for option in action.option_strings}
        prose = re.sub(r"```.*?```", "", section, flags=re.DOTALL)  # command lines: test_cli_examples_parse
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", prose))
        assert named <= known, f"docs/api.md section `vrh {match.group(1)}` names options it lacks: {named - known}"


def test_readme_python_examples_are_run_by_the_quickstart():
    """README's runnable examples are verbatim blocks of docs/quickstart.md, which the tests above run."""
    quickstart = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    readme = [b for b in python_blocks(ROOT / "README.md") if "no-run" not in b.options]
    assert readme, "README.md has no runnable python example"
    for block in readme:
        assert block.code in quickstart, f"{block.where}: not a block of docs/quickstart.md (copy it from there)"


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_pages_are_current():
    """docs/reference/ has one mkdocstrings page per top-level module of vrh_interp, no more, no less."""
    pages = _load_script("_generate_reference").pages()
    current = {p.name: p.read_text(encoding="utf-8") for p in (DOCS / "reference").glob("*.md")}
    assert current == pages, "docs/reference/ is stale: run `python docs/_generate_reference.py`"


def _nav_pages(entries) -> list[str]:
    found = []
    for entry in entries:
        if isinstance(entry, str):
            found.append(entry)
        else:
            for value in entry.values():
                found += [value] if isinstance(value, str) else _nav_pages(value)
    return found


def test_site_nav_lists_every_page():
    """mkdocs.yml's nav names every page and only pages that exist (the strict build in .ci/run checks the rest:
    links, anchors, docstrings; it skips where mkdocs is not installed)."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    missing = [page for page in nav if not (DOCS / page).exists()]
    assert not missing, f"mkdocs.yml names pages that do not exist: {missing}"
    pages = {p.relative_to(DOCS).as_posix() for p in doc_files()}
    notebooks = {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert sorted((pages | notebooks) - set(nav)) == [], "pages missing from mkdocs.yml's nav"


BUDGET_MENTION = re.compile(r"(?:budget[^.]{0,60}?\(?default|default budget)\s+(\d+(?:\.\d+)?)(?: s\b|:|\)|,)")


def test_no_page_quotes_a_default_demo_budget():
    """The demo's sizes are fixed (``experiments.demo_plan.DEFAULT_SIZES``, never chosen from a clock);
    ``--budget-seconds`` is an optional cap without a default, so no page may quote a default budget."""
    from vrh_interp.apps import cli
    from vrh_interp.experiments import demo

    assert not hasattr(demo, "DEFAULT_BUDGET_SECONDS") and not hasattr(cli, "DEMO_BUDGET_SECONDS")
    assert "fixed sizes" in cli.START_HERE
    quoted = {}
    for path in [*doc_files(), ROOT / "README.md"]:
        if "results" in path.relative_to(ROOT).parts:  # results pages record the cap of the run they show
            continue
        for match in BUDGET_MENTION.finditer(path.read_text(encoding="utf-8")):
            quoted.setdefault(match.group(1), []).append(path.relative_to(ROOT).as_posix())
    assert not quoted, f"pages quote a default demo budget: {quoted}"


NOTEBOOKS = ROOT / "notebooks"


def notebook_links() -> list[tuple[str, str]]:
    import json

    found = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                found += [(path.name, m.group("target")) for m in LINK.finditer("".join(cell["source"]))]
    return found


def test_notebook_links_resolve_in_jupyter_and_on_the_site():
    """A notebook's relative links resolve from notebooks/ (where Jupyter opens it); links into docs/ are written
    ``../docs/PAGE.md``, which docs/_hooks.py rewrites to the page's URL on the site (it renders the notebooks
    from docs/notebooks/)."""
    links = notebook_links()
    assert links, "the notebooks link no page: this test checks nothing"
    hooks = _load_script("_hooks")
    for name, target in links:
        if re.match(r"^[a-z]+:", target):
            continue
        path = target.split("#")[0]
        assert (NOTEBOOKS / path).resolve().exists(), f"notebooks/{name}: link to {target} does not resolve"
        assert path.startswith("../docs/") and path.endswith(".md"), \
            f"notebooks/{name}: link to {target}: link the docs as ../docs/PAGE.md (the site rewrites only those)"
    html = '<a href="../docs/results/toy-a.md#claims">x</a> <a href="../docs/nowhere.md">y</a>'
    rewritten, missing = hooks.rewrite_notebook_links(html, {"results/toy-a.md": "../../results/toy-a/"}.get)
    assert rewritten == '<a href="../../results/toy-a/#claims">x</a> <a href="../docs/nowhere.md">y</a>'
    assert missing == ["nowhere.md"]


def test_ci_builds_the_docs_strict_and_shows_the_warnings():
    """``--quiet`` hides the warnings that ``--strict`` turns into a failure: the gate must not pass it."""
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "mkdocs build" in line]
    assert lines and all("--strict" in line and "--quiet" not in line and " -q" not in line for line in lines)
