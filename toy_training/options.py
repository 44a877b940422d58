"""The command line of ``python -m toy_training.train``: its parser and every check that needs no model.

Standard library only (and ``vrh_interp.core.description.heads``, which imports no torch), so that ``train.py`` refuses
a wrong command line before torch and transformers load: every number finite and in range (``--threads 0``,
``--tower-lr-scale nan``), ``--out`` where training needs it, the options that need another. Each fault is one
line, ``python -m toy_training.train: error: ...``, with exit status 2, as argparse reports its own.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from vrh_interp.experiments.spec import whole_number

PROG = "python -m toy_training.train"
DESCRIPTION = "Train a toy grounding VLM on CPU: dense vision pretraining, then grounding fine-tuning."
MODEL_NAMES = ("a", "b", "c", "d", "planted", "planted-b", "planted-x")  # train.MODEL_PRESETS' keys (a test checks)
MAX_THREADS = 1024
# each model's language backbone: (layers, query heads per layer), its preset's text_shape (a test checks), so that
# --split-heads and --share-attention beyond it are refused before torch loads
HEAD_GRIDS = {"a": (4, 8), "b": (4, 8), "c": (8, 16), "d": (8, 16), "planted": (4, 16), "planted-b": (4, 16),
              "planted-x": (4, 16)}
# what a run folder of this trainer holds (train writes them): an --out holding none of them is not one
RUN_FILES = ("train_config.json", "trainer_state.safetensors", "history.json", "training_log.json", "best", "final")


class OptionError(SystemExit):
    """A command line that cannot run, found after parsing (``train.training_config``): a ``SystemExit`` whose text
    names the option; ``train.main`` reports it as the parser reports its own faults (one line, exit status 2)."""


class CommandLineError(SystemExit):
    """A refused command line, already reported on stderr: exit status 2; its text is the fault (for tests)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line on stderr and exit status 2 (argparse's own error prints the whole 12-line usage first)."""
        print(f"{self.prog}: error: {message} (--help lists the options)", file=sys.stderr)
        raise CommandLineError(message)


def _number(low: float, high: float, *, above_low: bool = False, below_high: bool = False,
            meaning: str = "") -> Callable[[str], float]:
    """argparse type: a finite number between ``low`` and ``high`` (``above_low`` / ``below_high``: the bound
    excluded); nan and inf are refused (a NaN learning rate trains nothing and says nothing)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
        inside = (low < value if above_low else low <= value) and (value < high if below_high else value <= high)
        if not (math.isfinite(value) and inside):  # NaN fails every comparison
            bounds = f"{low:g} {'<' if above_low else '<='} x {'<' if below_high else '<='} {high:g}"
            raise argparse.ArgumentTypeError(f"{text[:40]} is out of range: use a finite number {bounds}{meaning}")
        return value
    return parse


def _finite(text: str) -> float:
    """argparse type: a finite number (its range is checked with the options it depends on: ``config_problem``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text[:40]} is not a finite number")
    return value


def _scene_count(text: str) -> int:
    """argparse type of the per-step scene counts: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of scenes (a whole number >= 0)")
    return value


def _layer_pairs(text: str) -> tuple[tuple[int, int], ...]:
    """argparse type of ``--share-attention``: comma-separated ``LAYER:SOURCE`` pairs of layer numbers."""
    pairs = []
    for item in text.split(","):
        layer, _, source = item.strip().partition(":")
        if not (layer.isdigit() and source.isdigit()):
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not LAYER:SOURCE (two layer numbers, e.g. 7:6)")
        pairs.append((int(layer), int(source)))
    return tuple(pairs)


def _folder(text: str) -> Path:
    """argparse type of a folder option: a path that is not empty (``Path("")`` is the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name a folder")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("--model", choices=MODEL_NAMES, default="a")
    parser.add_argument("--out", type=_folder, help="run folder (training; required to train)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--steps", type=whole_number(0), default=None, help="grounding (stage-2) steps")
    parser.add_argument("--vision-steps", type=whole_number(0), default=None,
                        help="dense vision pretraining (stage-1) steps")
    parser.add_argument("--seed", type=whole_number(0), default=0)
    parser.add_argument("--eval-every", type=whole_number(1), default=None)
    parser.add_argument("--init-backbone", default=None,
                        help="trained toy checkpoint folder whose language backbone initialises this model")
    parser.add_argument("--warm-start", default=None,
                        help="trained toy checkpoint folder (same family) that a grounding-only run continues from: "
                             "no stage 1, fresh optimiser and schedule")
    parser.add_argument("--lr", type=_number(0.0, 1.0, above_low=True), default=None,
                        help="peak grounding (stage-2) learning rate (0 < lr <= 1)")
    parser.add_argument("--revive-floor", type=_number(0.0, 1.0, meaning=" (0: off)"), default=None,
                        help="with --warm-start: revive heads whose output norm is under this share of the "
                             "90th-percentile head's (toy_training.grow) before training")
    parser.add_argument("--fp32", action="store_true",
                        help="train in float32 (no bf16 autocast: on CPUs without native bf16, e.g. AVX2 only, "
                             "bf16 autocast is several times slower)")
    parser.add_argument("--head-dropout", type=_number(0.0, 1.0, below_high=True), default=None,
                        help="per-row head dropout probability (0 <= p < 1)")
    parser.add_argument("--split-heads", default=None, metavar="HEADS",
                        help="with --warm-start: heads with no job (e.g. L7H12,L7H14) that become splits of their "
                             "KV group's largest head before training (toy_training.grow.split_heads)")
    parser.add_argument("--share-attention", type=_layer_pairs, default=None, metavar="LAYER:SOURCE,...",
                        help="with --warm-start: each LAYER takes SOURCE's attention (input norm, q/k/v/o), both "
                             "output projections halved, before training (toy_training.grow.share_attention; e.g. 7:6)")
    parser.add_argument("--vqa-scenes", type=_scene_count, default=None,
                        help="scenes per grounding step whose synthetic VQA items join the batch")
    parser.add_argument("--grounding-scenes", type=_scene_count, default=None,
                        help="scenes per grounding step (their grounding rows; 0: none, and no query probe)")
    parser.add_argument("--text-scenes", type=_scene_count, default=None,
                        help="scenes per grounding step whose text-only items (toy_training.text_tasks) join the batch")
    parser.add_argument("--contrast-scenes", type=_scene_count, default=None,
                        help="extra level-1 scenes per grounding step whose referents that colour decides (the named "
                             "colour tells them apart from another object) join the batch")
    parser.add_argument("--vqa-query-probe", action="store_true",
                        help="apply the query-probe scaffold to one-object VQA rows too")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and step counts (tests)")
    parser.add_argument("--relabel", type=_folder, default=None,
                        help="with --model planted-x and --out: make the negative transfer control's run folder from "
                             "this planted-b run (heads relabelled, no training), then --ship it")
    parser.add_argument("--ship", type=_folder, default=None,
                        help="copy RUN/best into DEST/<model> (--dest) and measure it")
    parser.add_argument("--dest", type=_folder, default=None,
                        help="with --ship: the checkpoints folder to write into; vrh_interp/toy/checkpoints updates "
                             "the shipped toy models")
    parser.add_argument("--evaluate", action="store_true",
                        help="print held-out metrics of the shipped checkpoint of --model (or of --folder)")
    parser.add_argument("--scenes-from", type=_scene_count, default=None, metavar="N",
                        help="with --evaluate: level-1 metrics on the 200 eval scenes from N instead (400: the "
                             "confirmation scenes, which no training or selection rule reads)")
    parser.add_argument("--folder", type=_folder, default=None,
                        help="with --evaluate: a checkpoint folder of --model's family (e.g. RUN/final) instead of the "
                             "shipped one")
    parser.add_argument("--lineage", default="",
                        help="with --ship: how the run was produced (stored in training_log.json)")
    parser.add_argument("--checkpoint", choices=("best", "final"), default="best",
                        help="with --ship: the best checkpoint by level-1 accuracy on eval scenes 0-31, or the "
                             "finished run's last weights")
    parser.add_argument("--tower-lr-scale", type=_finite, default=None,
                        help="stage 2 also trains the vision tower, at this fraction of the grounding learning rate "
                             "(>= 0; default 0: the tower stays frozen after stage 1)")
    parser.add_argument("--threads", type=whole_number(1, MAX_THREADS), default=2,
                        help="torch CPU threads (1 each when two runs share 2 cores)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Each option parsed and checked alone (types and ranges); the checks between options: ``check_command``."""
    return build_parser().parse_args(argv)


def config_problem(args: argparse.Namespace) -> str | None:
    """The first fault of the options that shape a training run's config and need no model (``train.
    training_config`` raises it as an ``OptionError``), or None."""
    growth = [option for option, value in (("--revive-floor", args.revive_floor), ("--split-heads", args.split_heads),
                                           ("--share-attention", args.share_attention)) if value is not None]
    if growth and args.warm_start is None:  # they change a trained model's weights: without one they did nothing
        return f"{', '.join(growth)} need --warm-start: the trained checkpoint whose heads they change"
    if args.split_heads is not None:
        from vrh_interp.core.description.heads import HeadSet, HeadSpecError

        try:
            heads = HeadSet.parse(args.split_heads)
        except HeadSpecError as error:
            return f"--split-heads: {error}"
        layers, width = HEAD_GRIDS[args.model]
        off = [str(h) for h in heads if not (h.layer < layers and h.head < width)]
        if off:
            return (f"--split-heads {args.split_heads}: {', '.join(off)} is not a head of the {args.model} model "
                    f"({layers} layers x {width} heads: L0H0 .. L{layers - 1}H{width - 1})")
    if args.share_attention is not None:
        layers = HEAD_GRIDS[args.model][0]
        for layer, source in args.share_attention:
            if max(layer, source) >= layers or layer == source:
                return f"--share-attention {layer}:{source}: name two different layers of the {args.model} model's " \
                       f"0..{layers - 1}"
    if args.tower_lr_scale is not None and args.tower_lr_scale < 0:
        return (f"--tower-lr-scale {args.tower_lr_scale}: give a fraction >= 0 of the grounding learning rate (0: the "
                "vision tower stays frozen)")
    return None


def mode(args: argparse.Namespace) -> str:
    """What the command does: evaluate, relabel, ship or train."""
    return "evaluate" if args.evaluate else "relabel" if args.relabel is not None else \
        "ship" if args.ship is not None else "train"


def command_problem(args: argparse.Namespace) -> str | None:
    """The first fault between the options of a parsed command line (what it does and what that needs), or None."""
    what = mode(args)
    if args.scenes_from is not None and what != "evaluate":
        return "--scenes-from chooses the scenes --evaluate measures: add --evaluate"
    if args.folder is not None and what != "evaluate":
        return "--folder names the checkpoint --evaluate measures: add --evaluate"
    if what == "relabel" and (args.model != "planted-x" or args.out is None):
        return "--relabel makes toy planted-x's run folder: use it with --model planted-x --out RUN"
    if what == "ship" and args.dest is None:
        return ("--ship needs --dest: the checkpoints folder to write into (vrh_interp/toy/checkpoints updates the "
                "shipped toy models)")
    if what == "train" and args.out is None:
        return ("--out is required to train: the run folder, e.g. --out runs/toy-a (--evaluate, --ship and --relabel "
                "need no --out of their own)")
    for option, path in (("--relabel", args.relabel), ("--ship", args.ship), ("--folder", args.folder)):
        if path is not None and not path.is_dir():
            return f"{option} {str(path)!r} is {'not a folder' if path.exists() else 'not there'}: name a run folder"
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        return f"--out {str(args.out)!r} is a file: name a folder for the run"
    if args.out is not None and args.out.is_dir() and not os.access(args.out, os.W_OK | os.X_OK):
        return f"--out {str(args.out)!r}: no permission to write in this folder"
    problem = config_problem(args) if what == "train" else None
    return problem or (_path_problem(args) if what in ("train", "relabel") else None)


def _path_problem(args: argparse.Namespace) -> str | None:
    """The first fault of the folders a training (or relabelling) run reads and writes: a checkpoint folder it starts
    from that is not there, ``--out`` naming that folder (the run would write over the weights it starts from), and
    an ``--out`` that holds files but no trainer run (``RUN_FILES``; a new or empty folder, or a run to resume, is
    fine)."""
    sources = [(option, Path(value)) for option, value in (("--warm-start", args.warm_start),
                                                          ("--init-backbone", args.init_backbone)) if value]
    for option, path in sources:
        if not path.is_dir():
            return (f"{option} {str(path)!r} is {'not a folder' if path.exists() else 'not there'}: name a trained toy "
                    "checkpoint folder (RUN/best, RUN/final or vrh_interp/toy/checkpoints/NAME)")
    out = args.out
    if out is None:
        return None
    for option, path in sources:
        if os.path.realpath(path) == os.path.realpath(out):
            return (f"--out {str(out)!r} is the {option} folder: the run would write over the checkpoint it starts "
                    "from: pass a new --out")
    if out.is_dir():
        entries = sorted(e for e in os.listdir(out) if not e.startswith("."))
        if entries and not any(e in RUN_FILES for e in entries):
            return (f"--out {str(out)!r} holds {', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''} but no "
                    f"trainer run ({', '.join(RUN_FILES[:3])}, ...): pass a new or empty folder, or a run to --resume")
    return None


def parse_command(argv: Sequence[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the parsed command line, every check above passed; a fault ends the process in one line with
    exit status 2."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    problem = command_problem(args)
    if problem:
        parser.error(problem)
    return parser, args

