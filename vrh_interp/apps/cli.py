"""The ``vrh`` command line: a command per experiment declared with a spec (``experiments.declared``: detect, sweep,
vqa-sweep, scan, design-space, transfer, reproduce, demo, patch, localize, grid, steer; ``cmd_spec`` runs every one),
and families, merge and report.

Every long command takes ``--out`` (a run folder: rerunning the same command resumes it), shows progress
bars, prints a summary table at the end, and ``--json`` prints the machine-readable result instead.
``detect``, ``sweep``, ``vqa-sweep``, ``design-space`` and ``reproduce`` take ``--shard i/n`` (one of n machines,
its own ``--out``); ``vrh merge OUT SHARD_FOLDERS...`` joins the shards and writes what the unsharded command
writes (``apps.merging``, each experiment's declared ``merge``).
``detect``, ``sweep``, ``design-space`` and ``reproduce`` take ``--remote``: run the model on NDIF with nnsight's
configured host and API key (``nnsight.CONFIG``, ``NDIF_HOST`` / ``NDIF_API_KEY``); the key is never printed or stored.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn, Sequence

from vrh_interp.apps import show
from vrh_interp.experiments.spec import positive_int, preset, unit_interval


def _placement(args: argparse.Namespace) -> Any:
    """Where the command runs the model (``core.description.model.Placement``): ``--backend`` and ``--remote`` where
    it has them."""
    from vrh_interp.core.description.model import Placement

    return Placement(getattr(args, "backend", "nnsight"), getattr(args, "remote", False))


def _load_model(spec: str, device: str | None, dtype: str | None) -> Any:
    from vrh_interp.specs import load_spec

    return load_spec(spec, device, dtype)


def _placed_model(args: argparse.Namespace) -> Any:
    """``--model`` loaded (``--device``, ``--dtype``) and placed once (``_placement``): every step reads the handle."""
    return _load_model(args.model, args.device, args.dtype).on(_placement(args))


def _check_backend(chosen: str, *, ablation: str | None = None, operations: Sequence[str] = ()) -> None:
    """Refuse what ``--backend`` cannot run (``--ablation`` where the command has it, ``operations``) before the
    model loads: one line naming what is unsupported and the alternative (``backends.base.check_supported``)."""
    from vrh_interp.core.execution.backends.base import check_supported
    from vrh_interp.core.execution.backends.select import backend_type

    check_supported(backend_type(chosen), ablation_kinds=[ablation] if ablation else [], operations=operations)


def cmd_families(args: argparse.Namespace) -> int:
    """Static tables read from the registries (data modules): no model code, torch or pandas is imported."""
    from vrh_interp.core.description.families.paper_models import PAPER_MODELS
    from vrh_interp.core.description.families.registry import FAMILIES

    if args.paper:
        rows = [{"model": m.name, "backbone": m.backbone, "checkpoint": m.checkpoint,
                 "heads": "?" if m.geometry is None else f"{m.geometry.num_layers}x{m.geometry.num_heads}",
                 "status": m.status} for m in PAPER_MODELS]
        title = "The paper's eleven models (docs/families.md says how each is verified)"
    else:
        rows = [{"family": row.name, "name": row.display_name, "model_types": ", ".join(row.model_types),
                 "box_format": row.box_format} for row in FAMILIES]
        title = "Supported VLM families"
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"\n{title}")
        print(_text_table(rows))
    return 0


def _text_table(rows: list[dict[str, Any]], width: int = 100) -> str:
    """Rows as aligned columns within ``width``; the last column wraps under itself, nothing is cut."""
    import textwrap

    columns = list(rows[0])
    widths = [max(len(column), *(len(str(row[column])) for row in rows)) for column in columns[:-1]]
    indent = sum(widths) + 2 * len(widths)
    if width - indent < 50:  # the last column on its own lines, indented, when the others leave it little room
        head = "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()
        lines = [head, f"    {columns[-1]}"]
        for row in rows:
            lines.append("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths)).rstrip())
            lines += textwrap.wrap(str(row[columns[-1]]), width, initial_indent="    ", subsequent_indent="    ",
                                   break_long_words=False)
        return "\n".join(lines)
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)) + "  " + columns[-1]]
    for row in rows:
        left = "  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths)) + "  "
        wrapped = textwrap.wrap(str(row[columns[-1]]), width - indent, break_long_words=False) or [""]
        lines += [left + wrapped[0], *(" " * indent + more for more in wrapped[1:])]
    return "\n".join(lines)


def cmd_merge(args: argparse.Namespace) -> int:
    """``vrh merge``: the declared ``merge`` of the experiment the first shard folder holds
    (``experiments.merge.shard_experiment``; ``apps.merging``)."""
    from vrh_interp.apps import merging
    from vrh_interp.experiments.merge import shard_experiment

    out, shards = Path(args.out), [Path(d) for d in args.shards]
    declared = shard_experiment(shards[0])
    merge = declared.resolve("merge") if declared is not None and declared.merge else merging.records
    return int(merge(out, shards, args))


def cmd_report(args: argparse.Namespace) -> int:
    from vrh_interp.apps.report import sweep_result, verdict_lines, write_report

    paths = write_report(Path(args.run))
    show.bullets(verdict_lines(sweep_result(Path(args.run))))  # the k-sweep's verdict, as `vrh sweep` printed it
    print(f"report: {paths['html']}\nsummary: {paths['markdown']}")
    return 0


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help with each option's default (left out when it is None or a flag's False, or the help states it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line on stderr and exit status 2, the option and the fault (argparse's own error prints the usage, a
        dozen lines, before it)."""
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


START_HERE = """start here (a shipped toy whose retrieval heads are known; CPU, no network, 1-2 minutes each):
  vrh detect --model toy:planted --data synthetic:detect:20 --out runs/first --top 5
  vrh sweep --model toy:planted --scores runs/first/scores-vrh.json \\
      --data synthetic:eval:20 --ks 0,3 --out runs/first-sweep
  vrh report runs/first-sweep
then the same on your own model: --model Qwen/Qwen2.5-VL-3B-Instruct (a hub id) or a folder,
--data jsonl:PATH or refcoco:ROOT (docs/datasets.md).
The whole pipeline at fixed sizes (no clock in any verdict; ~3 minutes on a quiet 2-core
machine): vrh demo"""


def _families_parser(sub: Any) -> None:
    """``vrh families``."""
    p = sub.add_parser("families", help="list supported VLM families")
    p.add_argument("--paper", action="store_true",
                   help="list the paper's eleven models instead: backbone, checkpoint, head grid, support status")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_families)


def _merge_parser(sub: Any) -> None:
    """``vrh merge``."""
    from vrh_interp.experiments.declared import merged_commands

    commands = merged_commands()
    p = sub.add_parser("merge", help=f"join the --out folders of a sharded {', '.join(commands[:-1])} or "
                                     f"{commands[-1]} run")
    p.add_argument("out", help="new folder for the merged run")
    p.add_argument("shards", nargs="+", help="the --out folders of every shard 0/N .. N-1/N")
    p.add_argument("--preset", type=preset, default="vrh",
                   help="detect runs: scoring preset of the scores file written")
    p.add_argument("--top", type=positive_int, default=20, help="detect runs: heads printed")
    p.add_argument("--iou", type=unit_interval, default=0.5, help="sweep runs: correctness threshold of the summary")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_merge)


def _report_parser(sub: Any) -> None:
    """``vrh report``."""
    p = sub.add_parser("report", help="write an HTML + Markdown report for a run folder")
    p.add_argument("run", help="run folder")
    p.set_defaults(func=cmd_report)


# one function per subcommand's parser; `vrh --help` lists them in this order
SUBCOMMAND_PARSERS = (_merge_parser, _report_parser)


def _spec_command(sub: Any, declared: Any) -> None:
    """``vrh COMMAND`` of an experiment declared with a spec: one option per spec field (``RunSpec.add_options``)
    and ``--json``; it runs ``cmd_spec``."""
    p = sub.add_parser(declared.command, help=declared.help)
    spec_class = declared.resolve("spec")
    spec_class.add_options(p)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_spec, spec_class=spec_class)


def cmd_spec(args: argparse.Namespace) -> int:
    """A declared experiment's command: its spec (checked whole in ``_check_inputs``), the model loaded and placed
    where the spec says, the declaration's ``run(spec, vlm, folder)`` and ``show``."""
    from vrh_interp.experiments.declared import by_command
    from vrh_interp.experiments.spec import ExperimentSpec

    declared, spec = by_command(args.command), args.spec
    vlm = None
    if isinstance(spec, ExperimentSpec):
        _check_backend(spec.backend, ablation=getattr(spec, "ablation", None),
                       operations=spec.operations)
        vlm = _load_model(spec.model, spec.device, spec.dtype).on(_placement(spec))
    result = declared.resolve("run")(spec, vlm, Path(spec.out))
    return int(declared.resolve("show")(result, spec, args.json)) if declared.show is not None else 0


def build_parser() -> argparse.ArgumentParser:
    """The ``vrh`` parser: ``families``, a subparser per experiment declared with a spec
    (``experiments.declared``), in their order, then one per ``SUBCOMMAND_PARSERS`` entry."""
    from vrh_interp.experiments.declared import spec_commands

    parser = _Parser(prog="vrh", description="Find and test Visual Retrieval Heads in VLMs.", epilog=START_HERE)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    _families_parser(sub)
    for declared in spec_commands():
        _spec_command(sub, declared)
    for add in SUBCOMMAND_PARSERS:
        add(sub)
    return parser


def _resumable(command: str) -> bool:
    """Whether ``--out`` of ``vrh COMMAND`` is a run folder that the same command resumes (its experiment's
    declaration says so): held under the folder's lock while it runs."""
    from vrh_interp.experiments.declared import resumable_commands

    return command in resumable_commands()


# what a full disk, a read-only or foreign folder, or a failing device raises while writing
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}


def _resume_hint(args: argparse.Namespace, argv: Sequence[str]) -> str:
    """Where the work done is kept and the command that resumes it; nothing when the run folder is not there (a
    run that failed before its first result leaves none)."""
    from vrh_interp.core.bookkeeping.runs import LOCK_FILE

    out = Path(args.out)
    if not _resumable(args.command) or not out.is_dir() or not set(os.listdir(out)) - {LOCK_FILE}:
        return ""
    return f"; what is done is kept in {args.out}: rerun the same command to resume it: vrh {shlex.join(argv)}"


def _path_options(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """Every path the command was given, as (option, path or data spec, role): ``out`` a folder it writes,
    ``file`` / ``folder`` one it reads, ``data`` / ``vqa`` a data spec (a spec command's: its spec's ``inputs``;
    the others' are their run folders)."""
    spec = getattr(args, "spec", None)
    if spec is None and getattr(args, "spec_class", None) is not None:  # not checked yet
        spec = args.spec_class.from_args(args)
    if spec is not None:
        return spec.inputs()
    if args.command == "merge":
        return [("OUT", args.out, "out"), *(("SHARD_FOLDER", d, "folder") for d in args.shards)]
    return [("RUN", args.run, "folder")] if args.command == "report" else []


def _check_inputs(args: argparse.Namespace) -> None:
    """Everything that can be checked without a model, before anything heavy loads (a mistyped path fails in well
    under a second, not after torch and the model): a spec command's spec, whole (``Spec.check``: every fault at
    once); the others' folders (``core.bookkeeping.paths``: empty, missing, a file where a folder is needed and
    back, symlink loops, permissions)."""
    from vrh_interp.core.bookkeeping import paths

    if getattr(args, "spec_class", None) is not None:
        spec = args.spec_class.from_args(args)
        if args.json and spec.quiet_under_json:  # its progress lines would mix with the JSON on stdout
            spec = spec.replace(progress=False)
        args.spec = spec.check()
        return
    checks = {"out": paths.output_folder, "folder": paths.input_folder}
    for option, path, role in _path_options(args):
        checks[role](path, option)


def _option_of(filename: Any, args: argparse.Namespace) -> str:
    """``" (--scores PATH)"``: the option whose path is ``filename`` or holds it, '' when none does."""
    from vrh_interp.data.sources import parse_spec

    if not filename:
        return ""
    target = os.path.abspath(os.fsdecode(filename))
    for option, path, role in _path_options(args):
        if role in ("data", "vqa"):
            parsed = parse_spec(path)
            candidates = [*parsed.positional, *parsed.options.values()]
        else:
            candidates = [path]
        for candidate in candidates:
            if candidate.strip() and os.path.commonpath([target, os.path.abspath(candidate)]) == \
                    os.path.abspath(candidate):
                return f" ({option} {path})"
    return ""


def _run(args: argparse.Namespace) -> int:
    """``args.func`` under the lock of its run folder; a folder this call created and left empty is removed."""
    if not _resumable(args.command):
        return int(args.func(args))
    from vrh_interp.core.bookkeeping.runs import LOCK_FILE, lock_run_folder

    out = Path(args.out)
    created = not out.exists()
    lock = lock_run_folder(out)  # outside the try: a folder another run holds is never cleaned up by this one
    try:
        return int(args.func(args))
    finally:
        if created and os.listdir(out) == [LOCK_FILE]:  # failed before writing anything: leave no trace
            (out / LOCK_FILE).unlink()
            out.rmdir()
        del lock


def _close_progress_bars() -> None:
    """End every open progress bar, so that a failure's message starts on its own line after them."""
    tqdm_module = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm_module, "tqdm", None), "_instances", ())):
        bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Every failure ends in one line on stderr, never a traceback (``VRH_DEBUG=1`` shows it for unexpected ones):
    the library's errors (they name the problem and the fix), a full disk or unwritable folder, and Ctrl-C name
    the run folder and the command that resumes it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    name = f"vrh {args.command}"
    try:
        with warnings.catch_warnings():  # a warning is one line too (e.g. scores of another model: a transfer)
            warnings.showwarning = lambda message, *_, **__: print(f"{name}: warning: {message}", file=sys.stderr)
            _check_inputs(args)
            return _run(args)
    except KeyboardInterrupt:
        _close_progress_bars()
        print(f"{name}: interrupted{_resume_hint(args, argv)}", file=sys.stderr)
        return 130
    except OSError as error:
        _close_progress_bars()
        option = _option_of(error.filename, args)
        if error.errno in WRITE_ERRNOS:
            print(f"{name}: error: cannot write {error.filename or 'its output'}{option} ({error.strerror}): free "
                  f"space, make the folder writable or pick another --out{_resume_hint(args, argv)}", file=sys.stderr)
        elif error.strerror and error.filename:
            print(f"{name}: error: {error.filename}{option}: {error.strerror}", file=sys.stderr)
        else:
            print(f"{name}: error: {error}{option}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as error:
        _close_progress_bars()
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        if os.environ.get("VRH_DEBUG"):
            raise
        _close_progress_bars()
        print(f"{name}: unexpected {type(error).__name__}: {error}. This is a bug in vrh-interp: please report it "
              "with the command (VRH_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
