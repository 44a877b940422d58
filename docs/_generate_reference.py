"""Writes docs/reference/*.md: one API reference page per top-level module or subpackage of ``vrh_interp``,
rendered by mkdocstrings from the docstrings (run: python docs/_generate_reference.py; tests/test_docs.py
checks the pages are current, so a new module cannot be left out of the reference)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vrh_interp"
OUT = Path(__file__).resolve().parent / "reference"
SKIP = ("checkpoints",)
LAYER_PACKAGES = ("core", "data", "experiments", "apps", "viz")  # see CHANGELOG 0.2.0
# subpackages of a layer package that get a page per module too (core's three parts)
NESTED_LAYER_PACKAGES = ("core.description", "core.execution", "core.bookkeeping")


def _is_package(path: Path) -> bool:
    return path.is_dir() and path.name not in SKIP and any(path.glob("*.py"))


def modules(path: Path) -> list[str]:
    """Dotted names of the public modules at or under ``path`` (a module file or a package folder)."""
    if path.is_file():
        return [".".join(path.relative_to(ROOT).with_suffix("").parts)]
    # a namespace package (no __init__.py) has no docstring of its own: only its modules are listed
    names = [".".join(path.relative_to(ROOT).parts)] if (path / "__init__.py").exists() else []
    for child in sorted(path.iterdir()):
        if child.name.startswith("_") or child.name in SKIP or child.name == "__pycache__":
            continue
        if child.suffix == ".py" or _is_package(child):
            names += modules(child)
    return names


def pages() -> dict[str, str]:
    """File name -> Markdown, one page per top-level entry of the package (the package itself: index.md)."""
    out = {"index.md": "# `vrh_interp`\n\nThe top-level exports (`import vrh_interp as vrh`); every module has its "
                       "own page in this section.\n\n::: vrh_interp\n    options:\n      show_submodules: false\n"}
    for child in _entries(PACKAGE):
        _add_pages(child, out)
    return out


def _add_pages(path: Path, out: dict[str, str]) -> None:
    """A layer package (``LAYER_PACKAGES``, ``NESTED_LAYER_PACKAGES``): a page of its docstring, then a page per
    entry; anything else: one page for the module or the package with all its modules."""
    dotted = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    if dotted in LAYER_PACKAGES + NESTED_LAYER_PACKAGES:
        out[f"{dotted}.md"] = f"# `vrh_interp.{dotted}`\n\n::: vrh_interp.{dotted}\n"
        for child in _entries(path):
            _add_pages(child, out)
    else:
        out[f"{dotted}.md"] = _page(path)


def _entries(folder: Path) -> list[Path]:
    return [child for child in sorted(folder.iterdir()) if not child.name.startswith("_")
            and child.name != "__pycache__" and (child.suffix == ".py" or _is_package(child))]


def _page(path: Path) -> str:
    dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return "\n".join([f"# `{dotted}`", ""] + [line for name in modules(path) for line in (f"::: {name}", "")])


def nav() -> list[str]:
    """The reference section of mkdocs.yml's nav, in page order (tests/test_docs.py compares)."""
    return [f"reference/{name}" for name in pages()]


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for stale in OUT.glob("*.md"):
        stale.unlink()
    for name, text in pages().items():
        (OUT / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
