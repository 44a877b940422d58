"""An experiment's spec: everything one run takes, typed, and checked whole before any work.

A spec is a frozen dataclass next to its experiment's declaration (``experiments.declared``), each field made with
``option(...)``: its default, its help line, the parser of its value (one for the command line and GRID.toml
alike: ``--ks 0,1%`` and ``ks = "0,1%"`` are refused with the same words) and the role a path plays (the model,
the run folder, a file or a data spec it reads). From the fields alone come ``vrh COMMAND``'s options
(``add_options``), the spec of parsed arguments (``from_args``) or of a GRID.toml cell (``from_table``), and
``faults()``: every fault that can be known without loading weights (model names and folders, files present and
readable, the run folder ours, then the experiment's own ``plan_faults``: k in range, detection and evaluation
disjoint, ...). ``check()`` raises them all at once, before any model loads or any cell starts; the drivers
(``vrh``, the grid) run a checked spec with the experiment's ``run(spec, vlm, folder)``.

Why the parsers are here (the experiments layer) and not in the CLI: a spec made in Python or read from GRID.toml
must be refused exactly as the command line refuses it; so the command line is generated from the spec, not the
other way round. This module imports no torch or pandas: ``vrh --help`` and every refusal stay under a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Collection, Iterator, Mapping, Sequence

SPEC_KEY = "vrh_option"


class SpecError(ValueError):
    """A spec that cannot run: the message names every fault, each with its option (or GRID.toml field)."""


# ------------------------------------------------------------------------------------------------ value parsers
# argparse types (``argparse.ArgumentTypeError`` with one line); ``from_table`` uses them on GRID.toml values

def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number in ``minimum`` .. ``maximum`` (``--top -5`` is an error, not "all but five")."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            size = "too small" if value < minimum else "too large"
            raise argparse.ArgumentTypeError(f"{value} is {size}: use a whole number {bounds}")
        return value
    return parse


positive_int, non_negative_int = whole_number(1), whole_number(0)


def scene_count(minimum: int) -> Callable[[str], int]:
    """A number of synthetic scenes, ``minimum`` .. ``sources.MAX_SYNTHETIC_SCENES`` (scenes are rendered eagerly:
    an unbounded count would run without end)."""
    at_least = whole_number(minimum)

    def parse(text: str) -> int:
        from vrh_interp.data.sources import MAX_SYNTHETIC_SCENES

        value = at_least(text)
        if value > MAX_SYNTHETIC_SCENES:
            raise argparse.ArgumentTypeError(f"{value} scenes is above the limit of {MAX_SYNTHETIC_SCENES} "
                                             "(vrh_interp.data.sources.MAX_SYNTHETIC_SCENES)")
        return value
    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """A finite number in [``low``, ``high``]."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
        if not low <= value <= high:  # NaN fails too
            raise argparse.ArgumentTypeError(f"{text[:40]} is outside {low:g} .. {high:g}")
        return value
    return parse


unit_interval = float_in(0.0, 1.0)


def seconds(text: str) -> float:
    """A cap in seconds, finite and > 0 (0 would mean "skip every step", not "no cap": leave the option out)."""
    value = float_in(0.0, 1e9)(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]} is not a positive number of seconds (leave the option out "
                                         "for no cap)")
    return value


def _checked(check: Callable[[str], Any], *errors: type[BaseException]) -> Callable[[str], str]:
    """A parser that runs ``check`` on the text and keeps the text (its one-line error as argparse's)."""
    def parse(text: str) -> str:
        try:
            check(text)
        except errors as error:
            raise argparse.ArgumentTypeError(str(error).strip('"')) from None
        return text
    return parse


def _heads(text: str) -> None:
    from vrh_interp.core.description.published import parse_heads

    parse_heads(text)


def _ks(text: str) -> None:
    from vrh_interp.experiments.ks import parse_ks

    parse_ks(text, total_heads=1_000_000)


def _preset(text: str) -> None:
    from vrh_interp.scoring.design import resolve_design

    resolve_design(text)


def _data(vqa: bool) -> Callable[[str], None]:
    def check(text: str) -> None:
        from vrh_interp.data.sources import check_spec

        check_spec(text, vqa=vqa)
    return check


head_spec = _checked(_heads, KeyError, TypeError, ValueError)  # L2H6,L2H7 or published:MODEL/BENCHMARK
ks_spec = _checked(_ks, ValueError)  # 0,1,5 or 0,1%,2.5%
preset = _checked(_preset, ValueError)  # a scoring preset name
data_spec = _checked(_data(vqa=False), ValueError)  # a --data spec: its kind and synthetic arguments
vqa_spec = _checked(_data(vqa=True), ValueError)  # a --vqa spec


def seed_list(text: str) -> str:
    """Distinct whole-number seeds >= 0 separated by commas (``0,1,2``), kept as text."""
    parts = [p.strip() for p in text.split(",")]
    numbers = all(p.isascii() and p.isdigit() and len(p) < 19 for p in parts)
    if not numbers or len({int(p) for p in parts}) != len(parts):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a list of distinct seeds: write whole numbers >= 0 "
                                         "separated by commas, e.g. 0,1,2")
    return text


def shard(text: str) -> Any:
    """``I/N``: shard I (0-based) of N (``core.bookkeeping.shards.Shard``)."""
    from vrh_interp.core.bookkeeping.shards import Shard

    try:
        return Shard.parse(text)
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def ablation_kinds() -> tuple[str, ...]:
    from vrh_interp.core.execution.ablation_kinds import ABLATION_KINDS  # data only: no torch

    return tuple(ABLATION_KINDS)


def backends() -> tuple[str, ...]:
    from vrh_interp.core.execution.backends import BACKENDS  # data only: no torch

    return tuple(BACKENDS)


# --------------------------------------------------------------------------------------------------- the fields

@dataclass(frozen=True)
class Option:
    """What a spec field is besides its value (``option``). ``role``: "model", "out" (the run folder), "file" /
    "folder" (read), "data" / "vqa" (a data spec whose files are read); ``grid``: what a grid cell fills in
    ("model", "detect" / "eval" (the benchmark's samples), "vqa", "scores" (the cell's detection), "out"), the other
    fields coming from GRID.toml's ``[options]``; ``group``: fields of which exactly one is given."""

    help: str
    parse: Callable[[str], Any] | None = None
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    choices: Callable[[], tuple[str, ...]] | tuple[str, ...] | None = None
    role: str | None = None
    grid: str | None = None
    group: str | None = None
    repeat: bool = False
    required: bool = False
    cli: bool = True
    positional: bool = False  # a command-line argument without a flag (``vrh grid GRID.toml``)
    keywords: tuple[str, ...] = ()  # values that name no model or path (``--transfer-model auto``): not checked as one


def option(default: Any = None, help: str = "", **details: Any) -> Any:
    """A spec field: its default, its help line and what ``Option`` says of it."""
    return field(default=default, metadata={SPEC_KEY: Option(help, **details)})


def _option(item: dataclasses.Field) -> Option | None:
    return item.metadata.get(SPEC_KEY)


def _choices(opt: Option) -> tuple[str, ...] | None:
    return opt.choices() if callable(opt.choices) else opt.choices


def _text(value: Any) -> str:
    """A GRID.toml value as the command line would give it (a list as ``a,b``)."""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


@dataclass(frozen=True, kw_only=True)
class Spec:
    """Typed fields made by ``option``, read from a command line or a GRID.toml table with the same parsers and
    checked whole (``faults``, ``check``): the base of every experiment's spec (``RunSpec``) and of the grid's
    ``[options]`` (``experiments.grid.GridOptions``)."""

    command: ClassVar[str] = ""  # the ``vrh`` command (the declaration's), for messages
    # ``--json`` turns the spec's ``progress`` off (a runner whose progress lines go to stdout, where the JSON goes)
    quiet_under_json: ClassVar[bool] = False

    # ------------------------------------------------------------------------------------------ the fields
    @classmethod
    def options(cls) -> Iterator[tuple[dataclasses.Field, Option]]:
        for item in dataclasses.fields(cls):
            opt = _option(item)
            if opt is not None:
                yield item, opt

    @classmethod
    def same_option(cls, name: str) -> Any:
        """Field ``name`` of this spec (default, help, parser), to declare the same option in another spec."""
        item = next(f for f in dataclasses.fields(cls) if f.name == name)
        return field(default=item.default, metadata=item.metadata)

    @classmethod
    def flag(cls, name: str) -> str:
        """The command-line flag of field ``name`` (``--no-live`` for a flag that turns a default True off)."""
        item = next(f for f in dataclasses.fields(cls) if f.name == name)
        opt = _option(item)
        if opt is not None and opt.flag:
            return opt.flag
        if opt is not None and opt.positional:
            return name.upper()
        prefix = "--no-" if item.default is True else "--"
        return prefix + name.replace("_", "-")

    @classmethod
    def add_options(cls, parser: argparse.ArgumentParser) -> None:
        """``parser``'s options, one per field (its flag, parser, default, help)."""
        groups: dict[str, Any] = {}
        for item, opt in cls.options():
            if not opt.cli:
                continue
            target = parser
            if opt.group is not None:
                if opt.group not in groups:
                    groups[opt.group] = parser.add_mutually_exclusive_group(required=True)
                target = groups[opt.group]
            if opt.positional:
                target.add_argument(item.name, help=opt.help, metavar=cls.flag(item.name))
                continue
            names = [cls.flag(item.name), *opt.aliases]
            if isinstance(item.default, bool):
                action = "store_false" if item.default else "store_true"
                target.add_argument(*names, dest=item.name, action=action, help=opt.help)
                continue
            kwargs: dict[str, Any] = {"dest": item.name, "help": opt.help}
            if opt.repeat:
                kwargs.update(action="append", default=list(item.default or ()))
            elif opt.required:
                kwargs["required"] = True
            elif opt.group is None:
                kwargs["default"] = item.default
            if opt.parse is not None:
                kwargs["type"] = opt.parse
            if opt.metavar:
                kwargs["metavar"] = opt.metavar
            if _choices(opt):
                kwargs["choices"] = _choices(opt)
            target.add_argument(*names, **kwargs)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Spec":
        """The spec of parsed arguments (fields the command line does not set keep their defaults)."""
        values = {item.name: getattr(args, item.name) for item, opt in cls.options()
                  if opt.cli and hasattr(args, item.name)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str, **given: Any) -> "Spec":
        """The spec of a GRID.toml table (``where`` names it in messages) and the values a grid cell fills in
        (``given``); a key that is no field, a value of the wrong kind or refused by the field's parser is a
        ``SpecError`` naming ``where`` and the key."""
        known = {item.name: (item, opt) for item, opt in cls.options()}
        values = dict(given)
        for key, value in table.items():
            if key not in known:
                raise SpecError(f"{where}: unknown key {key!r}; the keys are {', '.join(known)}")
            item, opt = known[key]
            if isinstance(item.default, bool) or isinstance(value, bool):
                if not (isinstance(value, bool) and isinstance(item.default, bool)):
                    raise SpecError(f"{where}: {key} = {value!r} is not " + (
                        "true or false" if isinstance(item.default, bool) else "a value of this key"))
                values[key] = value
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecError(f"{where}: {key} = {value} must be a finite number")
            texts = [_text(v) for v in value] if opt.repeat and isinstance(value, list) else [_text(value)]
            try:
                parsed = [opt.parse(text) if opt.parse is not None else text for text in texts]
                if _choices(opt) and any(p not in _choices(opt) for p in parsed):
                    raise argparse.ArgumentTypeError(f"use one of {', '.join(_choices(opt))}")
            except argparse.ArgumentTypeError as error:
                raise SpecError(f"{where}: {key} = {value!r}: {error}") from None
            values[key] = tuple(parsed) if opt.repeat else parsed[0]
        return cls(**values)

    def replace(self, **changes: Any) -> "Spec":
        return dataclasses.replace(self, **changes)

    # -------------------------------------------------------------------------------------------- the checks
    def inputs(self) -> list[tuple[str, str, str]]:
        """Every path the spec names, as (flag, path or data spec, role)."""
        found = []
        for item, opt in self.options():
            value = getattr(self, item.name)
            if opt.role in ("out", "file", "folder", "data", "vqa") and value is not None and self.reads(item.name):
                for one in value if isinstance(value, tuple) else (value,):
                    found.append((self.flag(item.name), one, opt.role))
        return found

    def reads(self, name: str) -> bool:
        """Whether the run reads field ``name`` (a path it would not read, e.g. the reference samples of zero
        ablation, is not checked)."""
        return True

    def faults(self, pending: Collection[str] = ()) -> list[BaseException]:
        """Every fault found without loading weights, in the order a reader fixes them: paths, the model, the
        experiment's plan (``plan_faults``), the device. ``pending``: fields naming files an earlier step of a
        composed run writes (``vrh reproduce``'s scores, written by its detection): not checked (yet)."""
        from vrh_interp.core.bookkeeping import paths
        from vrh_interp.data.sources import check_paths
        from vrh_interp.experiments.spec_checks import check_model

        found: list[BaseException] = []

        def attempt(check: Callable[..., Any], *arguments: Any, **keywords: Any) -> None:
            try:
                check(*arguments, **keywords)
            except (ValueError, OSError) as error:
                found.append(error)

        checks = {"out": paths.output_folder, "file": paths.input_file, "folder": paths.input_folder}
        waiting = {self.flag(item.name) for item, _ in self.options() if item.name in pending}
        for flag, path, role in self.inputs():
            if flag in waiting:
                continue
            if role in ("data", "vqa"):
                attempt(check_paths, path, flag, vqa=role == "vqa")
            else:
                attempt(checks[role], path, flag)
        for item, opt in self.options():
            if opt.required and getattr(self, item.name) is None and item.name not in pending:
                found.append(ValueError(f"{self.flag(item.name)} is required: {opt.help}"))
            if opt.role == "model" and getattr(self, item.name) and getattr(self, item.name) not in opt.keywords:
                attempt(check_model, getattr(self, item.name), self.flag(item.name))
        if not found:  # the plan's checks read the files named above: only once they are there
            for check in (*self._scores_faults(pending), *self.plan_faults()):
                attempt(check)
        if getattr(self, "device", None) is not None and not found:
            from vrh_interp.core.description.model_source import check_device

            attempt(check_device, self.device)
        return found

    def _scores_faults(self, pending: Collection[str] = ()) -> list[Callable[[], None]]:
        """Every scores file the spec reads (a ``file`` field named ``*scores``) on the grid of the model it is
        for (``model``, or ``partner`` for ``partner_scores``)."""
        from vrh_interp.experiments.spec_checks import check_scores_fit

        checks: list[Callable[[], None]] = []
        for item, opt in self.options():
            path = getattr(self, item.name)
            if opt.role == "file" and item.name.endswith("scores") and path is not None and item.name not in pending:
                model = getattr(self, "partner" if item.name.startswith("partner") else "model", None)
                if model:
                    checks.append(lambda p=path, m=model, f=self.flag(item.name): check_scores_fit(p, m, f))
        return checks

    def plan_faults(self) -> Sequence[Callable[[], None]]:
        """The experiment's own checks (each raises ``ValueError`` naming its options): none here."""
        return ()

    def check(self, *, pending: Collection[str] = ()) -> "Spec":
        """The spec, or every fault at once: a single fault as it was raised (its type and words), several as one
        ``SpecError`` naming each (``pending``: as ``faults``)."""
        found = self.faults(pending)
        if len(found) == 1:
            raise found[0]
        if found:
            raise SpecError(f"{len(found)} faults: " + "; ".join(_words(error) for error in found))
        return self


@dataclass(frozen=True, kw_only=True)
class RunSpec(Spec):
    """What every experiment takes: its run folder. Subclasses add their own fields (``option``) and
    ``plan_faults``; ``ExperimentSpec`` adds the model."""

    out: str = option("runs/vrh", "run folder (rerun to resume)", role="out", grid="out")


@dataclass(frozen=True, kw_only=True)
class ExperimentSpec(RunSpec):
    """What every model-running experiment takes besides its run folder: the model and where it runs.
    ``operations``: what its backend must run (``backends.base.check_supported``, before the model loads);
    ``local_only``: it runs only here (a grid refuses remote models for it)."""

    operations: ClassVar[tuple[str, ...]] = ()
    local_only: ClassVar[bool] = False

    model: str = option("toy:a", "hub id, local folder, toy:a / toy:b / toy:c / toy:d / toy:planted (shipped toy "
                        "models) or tiny:FAMILY (random fixture)", role="model", grid="model")
    device: str | None = option(None, "device or device_map, e.g. cpu, cuda, auto")
    dtype: str | None = option(None, "torch dtype name, e.g. bfloat16")
    batch_size: int = option(16, "samples per forward pass", parse=positive_int)
    max_new_tokens: int = option(24, "greedy answer tokens per sample", parse=positive_int)
    shard: Any = option(None, "run shard I (0-based) of N, into its own --out; join them with `vrh merge`",
                        parse=shard, metavar="I/N")
    remote: Any = option(False, "run the model on NDIF (nnsight's configured host and API key; "
                         "docs/recipes/remote.md)")
    backend: str = option("nnsight", "what runs the model: nnsight, or a TransformerLens bridge (LLaVA-type "
                          "families, zero ablation; docs/recipes/transformer-lens.md)", choices=backends)


def _words(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    return str(error).strip('"')
