"""``grid``: the paper's grid (models x benchmarks x experiments) from one GRID.toml, run locally or on Ray.

A grid is a plan of *cells*, each an ordinary resumable run folder made by the experiment's own runner: GRID.toml's
``experiments`` names declared experiments (``experiments.declared``), and a cell runs the declaration's
``run(spec, vlm, folder)`` on the spec ``vrh NAME`` would build (``cell_spec``: the model, the folder, the
benchmark's samples and the detection's scores filled in by each field's ``grid`` role, then ``[options]``, then
the experiment's own ``[NAME]`` table). What a cell is follows from the declaration's ``grid``:

* per model x grounding benchmark (``detect``, ``sweep``, ``scan``, ``design_space``), into
  ``cells/MODEL/BENCHMARK/NAME``; ``detect`` writes the scores the others read. With ``shards = n`` the sweep runs as
  n shard cells (``--shard i/n``: batch-aligned, so the merged folder is the unsharded run's byte for byte) and a
  merge cell (``experiments.merge.merge_runs``); its live-head control draws from the census of the first
  evaluation items (``census.csv``; local models only), shared by the shards;
* per model x ``[vqa.NAME]`` benchmark (``vqa_sweep``): the top ``vqa_k`` heads detected on ``heads_from``, into
  ``cells/MODEL/vqa_sweep-NAME``;
* per model (``patch``): the study of ``vrh patch`` on the top heads detected on ``[patch] heads_from``, into
  ``cells/MODEL/patch`` (local models only: its spec is ``local_only``; nnsight only);
* per ``[[transfer]]`` pair (``transfer``): cross-masking of both models' detected heads, into
  ``transfer/A__B__BENCHMARK``.

A cell's dependencies (a sweep needs its detection, ...) are part of the plan; the executors run a cell only
after them. The grid folder holds ``grid.json`` (the parsed grid, every cell with its folder, dependencies and
status: pending, running, done, failed with a one-line reason), ``status/`` (one file per cell, written by
whoever runs it, so workers on other machines report through the shared folder), the summary
(``grid_summary.csv`` / ``.md``: the paper's Table 3 / A12 layout, baseline, VRH-k, random-k, matched-k and live-k
accuracy per model x benchmark with the set-level verdict; patching cells: ``grid_patching.csv``, the study's own
recovery of the heads and their rank among the control sets per pair kind) and ``grid_drop.png`` (the drop of
VRH-k per cell).

Executors. ``local`` runs the cells in plan order in this process (one model loaded at a time). ``ray`` (``run_ray``,
``pip install 'vrh-interp[ray]'``; Ray is imported only there) submits every cell not done yet as one Ray task
running ``run_cell`` (the function the local executor calls) with the resources the grid declares (``num_cpus`` =
``cpus``, ``num_gpus`` and ``memory`` from the cell's models) and its dependencies' results as arguments, so Ray
starts it only after them. A task whose worker dies (killed, out of memory, a lost node) or that raises a
``RuntimeError`` / ``OSError`` (a CUDA error, a dropped NDIF connection) is retried up to ``retries`` times;
``ValueError`` (a bad spec, a k too large for the model) fails the cell at once. Resume is the run folders' own: a
cell killed at any point (its worker, or the driver: Ray then ends the driver's tasks) is rerun from its records,
so no finished pass is repeated; a cell whose status file says ``done`` is not run again. Both executors run the
same function per cell, so their folders hold the same records. On more than one machine the grid folder must
be on a shared file system at the same path everywhere, and the workers need this package installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import socket
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from vrh_interp.core.execution.remote import ENV as REMOTE_TIMEOUT_ENV
from vrh_interp.core.bookkeeping.runs import RunLockedError, lock_run_folder, write_atomic, write_json_atomic
from vrh_interp.experiments.declared import experiment
from vrh_interp.experiments.spec import (Spec, SpecError, float_in, ks_spec, non_negative_int, option, positive_int,
                                         preset, unit_interval)

SECTIONS = ("experiments", "options", "models", "benchmarks", "vqa", "transfer")  # GRID.toml's own tables
RENAMED = {"vqa": "vqa_sweep", "patching": "patch"}  # GRID.toml names before experiments were named by declaration


def experiment_names() -> tuple[str, ...]:
    """The names GRID.toml's ``experiments`` takes, in plan order: the declared grid experiments
    (``declared.grid_experiments``)."""
    from vrh_interp.experiments.declared import grid_experiments

    return tuple(e.name for e in grid_experiments())


def shape(name: str) -> str:
    """What the cells of experiment ``name`` are (``declared.GRID_SHAPES``: benchmark, vqa, model, pair)."""
    from vrh_interp.experiments.declared import experiment

    return str(experiment(name).grid)

GRID_FILE, STATUS_DIR, SUMMARY_CSV, SUMMARY_MD, HEATMAP = ("grid.json", "status", "grid_summary.csv",
                                                            "grid_summary.md", "grid_drop.png")
PATCHING_CSV = "grid_patching.csv"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class GridSpecError(ValueError):
    """A GRID.toml that cannot be run (the message names the field and the fix)."""


@dataclass(frozen=True)
class GridModel:
    """One model of the grid: its spec (``toy:a``, a hub id, a folder), how it loads and what a cell needs."""

    name: str
    spec: str
    device_map: str | None = None
    dtype: str | None = None
    remote: bool | str = False  # True: NDIF (nnsight's configured host); "local": serialised as for NDIF, run here
    gpus: float = 0.0
    memory_gb: float | None = None


@dataclass(frozen=True)
class GroundingBenchmark:
    name: str
    detect: str  # a --data spec: the detection samples
    eval: str  # a --data spec: the evaluation samples (disjoint from detect)


@dataclass(frozen=True)
class VQABenchmark:
    name: str
    data: str  # a --vqa spec
    heads_from: str  # the grounding benchmark whose detected heads are masked


@dataclass(frozen=True)
class TransferPair:
    models: tuple[str, str]
    benchmark: str




@dataclass(frozen=True, kw_only=True)
class GridOptions(Spec):
    """``[options]``: what every cell takes (the fields of its spec with these names: ``vrh sweep``'s own options and
    their parsers, ``experiments.spec``) and how the grid schedules cells."""

    ks: str = option("0,1,3,5,10,20", "k values of the sweep and transfer cells", parse=ks_spec)
    random_sets: int = option(20, "control sets per k and kind", parse=positive_int)
    matched: bool = option(True, "the layer-matched control too")
    # live-head control sets, drawn from the heads the census of the cell's eval items finds live
    live: bool = option(True, "the live-head control too")
    preset: str = option("vrh", "scoring preset of the detection", parse=preset)
    batch_size: int = option(16, "samples per forward pass", parse=positive_int)
    max_new_tokens: int = option(24, "greedy answer tokens per sample", parse=positive_int)
    max_batch_rows: int | None = option(None, "rows per forward pass at most", parse=positive_int)
    iou: float = option(0.5, "correctness threshold", parse=unit_interval)
    vqa_k: int = option(20, "heads masked in the VQA cells", parse=positive_int)
    shards: int = option(1, "shard cells per sweep cell", parse=positive_int)
    summary_k: int | None = option(None, "the k of the heatmap (default: the largest)", parse=positive_int)
    cpus: float = option(1.0, "CPUs each Ray task declares", parse=float_in(0.0, 1e6))
    retries: int = option(2, "Ray retries of a failed cell", parse=non_negative_int)
    # torch threads inside every cell, whatever the executor or the worker's environment: CPU reductions depend on
    # the thread count, so a cell gives the same bytes wherever it runs only if its spec fixes it
    threads: int = option(1, "torch threads inside every cell", parse=positive_int)


GRID_OPTIONS = frozenset(f.name for f in dataclasses.fields(GridOptions))


@dataclass(frozen=True)
class GridSpec:
    models: dict[str, GridModel]
    benchmarks: dict[str, GroundingBenchmark]
    vqa: dict[str, VQABenchmark] = field(default_factory=dict)
    transfer: tuple[TransferPair, ...] = ()
    experiments: tuple[str, ...] = ("detect", "sweep")
    options: GridOptions = GridOptions()
    # ``[NAME]`` tables of declared experiments: their spec's own fields (``experiments.spec``) as written, and
    # ``heads_from`` for an experiment with a cell per model
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        check_numbers(self)  # grid.json is strict JSON: no NaN / Infinity for other readers to choke on
        data = json.loads(json.dumps(dataclasses.asdict(self), allow_nan=False))
        if not data["tables"]:  # grids without them keep the grid.json they had before they existed
            del data["tables"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GridSpec":
        return cls(models={k: GridModel(**v) for k, v in data["models"].items()},
                   benchmarks={k: GroundingBenchmark(**v) for k, v in data["benchmarks"].items()},
                   vqa={k: VQABenchmark(**v) for k, v in data["vqa"].items()},
                   transfer=tuple(TransferPair(tuple(t["models"]), t["benchmark"]) for t in data["transfer"]),
                   experiments=tuple(data["experiments"]), options=GridOptions(**data["options"]),
                   tables=dict(data.get("tables", {})))


# ---------------------------------------------------------------------------------------------- parsing GRID.toml

def _where(section: str) -> str:
    return f"GRID.toml [{section}]"


def _check_keys(table: Any, section: str, allowed: Sequence[str], required: Sequence[str] = ()) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise GridSpecError(f"{_where(section)} must be a table (key = value lines), got {type(table).__name__}")
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise GridSpecError(f"{_where(section)}: unknown key {unknown[0]!r}; the keys are {', '.join(allowed)}")
    missing = [k for k in required if k not in table]
    if missing:
        raise GridSpecError(f"{_where(section)}: missing {missing[0]!r} (required: {', '.join(required)})")
    return table


def _typed(table: Mapping[str, Any], key: str, section: str, kinds: tuple[type, ...], what: str) -> Any:
    value = table[key]
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise GridSpecError(f"{_where(section)}: {key} = {value!r} is not {what}")
    return value


def _name(name: str, section: str) -> str:
    if not _NAME.match(name):
        raise GridSpecError(f"{_where(section)}: the name {name!r} must be letters, digits, '_', '.' or '-' (it "
                            "names a folder)")
    return name


def _data(spec: Any, section: str, key: str, *, vqa: bool) -> str:
    from vrh_interp.data.sources import DataSpecError, check_spec

    if not isinstance(spec, str):
        raise GridSpecError(f"{_where(section)}: {key} must be a data spec string such as 'synthetic:eval:200'")
    try:
        check_spec(spec, vqa=vqa)
    except DataSpecError as error:
        raise GridSpecError(f"{_where(section)}: {key} = {spec!r}: {error}") from None
    return spec


def _options(table: Mapping[str, Any]) -> GridOptions:
    if not isinstance(table, dict):
        raise GridSpecError(f"{_where('options')} must be a table (key = value lines), got {type(table).__name__}")
    try:
        options = GridOptions.from_table(table, _where("options"))
    except SpecError as error:
        raise GridSpecError(str(error)) from None
    _check_summary_k(options)
    return options


def _check_summary_k(options: GridOptions) -> None:
    """``summary_k`` must be one of the grid's k > 0 for every model: one of the head counts in ``ks`` (a
    percentage's k depends on the model's head count); before, any other value silently became the largest k."""
    from vrh_interp.experiments.ks import parse_ks

    k = options.summary_k
    if k is None:
        return
    items = [item.strip() for item in options.ks.split(",")]
    counts = [c for c in parse_ks([i for i in items if i and not i.endswith("%")], 1) if c > 0]
    if k not in counts:
        percent = " (a percentage's k depends on the model's head count)" if any(i.endswith("%") for i in items) else ""
        among = f"one of its head counts > 0: {', '.join(map(str, counts))}" if counts else "a head count > 0 in ks"
        raise GridSpecError(f"{_where('options')}: summary_k = {k} is not among ks = \"{options.ks}\"{percent}: use "
                            f"{among}, or leave summary_k out (the heatmap then shows the largest k)")


def _model(name: str, table: Any) -> GridModel:
    section = f"models.{name}"
    _name(name, section)
    _check_keys(table, section, ("model", "device_map", "dtype", "remote", "gpus", "memory_gb"), ("model",))
    spec = _typed(table, "model", section, (str,), "a model spec (toy:a, tiny:qwen2_vl, a hub id or a folder)")
    for key in ("device_map", "dtype"):
        if key in table:
            _typed(table, key, section, (str,), "a string")
    if "dtype" in table:
        from vrh_interp.core.description.model_source import parse_dtype

        try:
            parse_dtype(table["dtype"])
        except (TypeError, ValueError) as error:
            raise GridSpecError(f"{_where(section)}: dtype: {error}") from None
    remote = table.get("remote", False)
    if remote not in (True, False, "local"):
        raise GridSpecError(f"{_where(section)}: remote = {remote!r}: use true (NDIF), false, or \"local\" (serialised "
                            "as for NDIF, run here)")
    numbers = {}
    for key in ("gpus", "memory_gb"):
        if key in table:
            numbers[key] = float(_typed(table, key, section, (int, float), "a number"))
            if not (math.isfinite(numbers[key]) and numbers[key] >= 0):
                raise GridSpecError(f"{_where(section)}: {key} = {numbers[key]} must be a finite number >= 0")
    return GridModel(name=name, spec=spec.strip(), device_map=table.get("device_map"), dtype=table.get("dtype"),
                     remote=remote, **numbers)


def parse_grid(text: str) -> GridSpec:
    """A ``GridSpec`` from GRID.toml's text; ``GridSpecError`` (one line naming the field) on anything invalid.
    The reference is docs/recipes/grid.md."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise GridSpecError(f"GRID.toml is not valid TOML: {error}") from None
    names = experiment_names()
    _check_keys(data, "top level", (*SECTIONS, *(n for n in names if n not in SECTIONS)), ("models",))
    experiments = data.get("experiments", ["detect", "sweep"])
    if not isinstance(experiments, list) or not experiments or not all(isinstance(e, str) for e in experiments):
        raise GridSpecError(f"GRID.toml: experiments must be a list such as [\"sweep\", \"vqa_sweep\"] from "
                            f"{', '.join(names)}")
    bad = [e for e in experiments if e not in names]
    if bad:
        renamed = f" (now named {RENAMED[bad[0]]!r}, as its declaration)" if bad[0] in RENAMED else ""
        raise GridSpecError(f"GRID.toml: unknown experiment {bad[0]!r}{renamed}: use {', '.join(names)}")
    # every experiment needs the detected heads
    experiments = tuple(e for e in names if e in experiments or e == "detect")
    options = _options(data.get("options", {}))
    models_table = data["models"]
    if not isinstance(models_table, dict) or not models_table:
        raise GridSpecError("GRID.toml: [models] is empty: add e.g. [models.a] with model = \"toy:a\"")
    models = {name: _model(name, table) for name, table in models_table.items()}
    benchmarks = {}
    for name, table in _tables(data, "benchmarks"):
        section = f"benchmarks.{name}"
        _check_keys(table, section, ("detect", "eval"), ("detect", "eval"))
        detect, evaluate = (_data(table[key], section, key, vqa=False) for key in ("detect", "eval"))
        benchmarks[_name(name, section)] = GroundingBenchmark(name, detect, evaluate)
    if not benchmarks:
        raise GridSpecError("GRID.toml: no [benchmarks.NAME] tables: add one with detect = ... and eval = ... specs")
    vqa = {}
    for name, table in _tables(data, "vqa"):
        section = f"vqa.{name}"
        _check_keys(table, section, ("data", "heads_from"), ("data",))
        heads_from = table.get("heads_from", next(iter(benchmarks)))
        if heads_from not in benchmarks:
            raise GridSpecError(f"{_where(section)}: heads_from = {heads_from!r} is not a benchmark of the grid "
                                f"({', '.join(benchmarks)})")
        vqa[_name(name, section)] = VQABenchmark(name, _data(table["data"], section, "data", vqa=True), heads_from)
    transfer = _pairs(data.get("transfer", []), models, benchmarks)
    shapes = {e: shape(e) for e in experiments}
    for name in experiments:
        _check_local_only(name, models)
    for needs, what, present in (("vqa", "[vqa.NAME] table", vqa), ("pair", "[[transfer]] pair", transfer)):
        lacking = [e for e, s in shapes.items() if s == needs]
        if lacking and not present:
            raise GridSpecError(f"GRID.toml: experiments has \"{lacking[0]}\" but there is no {what}")
    # an experiment's own [NAME] table, unless NAME is a section of the grid (the transfer experiment's pairs are
    # [[transfer]]: its fields come from [options] alone)
    tables = {name: _experiment_table(data, name, experiments, models, benchmarks) for name in names
              if name in data and name not in SECTIONS}
    spec = GridSpec(models=models, benchmarks=benchmarks, vqa=vqa if "vqa" in shapes.values() else {},
                    transfer=transfer if "pair" in shapes.values() else (), experiments=experiments, options=options,
                    tables=tables)
    for cell in check_plan(spec):  # every cell's spec, as it will run (its [NAME] table checked)
        if cell.kind != "sweep-merge":
            try:
                cell_spec(Path("."), spec, cell)
            except ValueError as error:
                raise GridSpecError(str(error)) from None
    return spec


def _experiment_table(data: Mapping[str, Any], name: str, experiments: Sequence[str],
                      models: Mapping[str, GridModel], benchmarks: Mapping[str, GroundingBenchmark]) -> dict[str, Any]:
    """``[NAME]``: a declared experiment's own fields (checked with its cells' specs) and, for one with a cell per
    model, ``heads_from`` (the benchmark whose detected heads it takes; default the first)."""
    table = data[name]
    if name not in experiments:
        raise GridSpecError(f"GRID.toml: there is a [{name}] table but experiments has no \"{name}\": add it to "
                            "experiments, or remove the table")
    if not isinstance(table, dict):
        raise GridSpecError(f"{_where(name)} must be a table (key = value lines)")
    heads_from = table.get("heads_from")
    if heads_from is not None and (shape(name) != "model" or heads_from not in benchmarks):
        raise GridSpecError(f"{_where(name)}: heads_from = {heads_from!r} " + (
            f"is not a benchmark of the grid ({', '.join(benchmarks)})" if shape(name) == "model" else
            "is a key of experiments with a cell per model only"))
    return dict(table)


def _check_local_only(name: str, models: Mapping[str, GridModel]) -> None:
    """An experiment that runs only here (its spec's ``local_only``) refuses remote models."""
    from vrh_interp.experiments.declared import experiment

    declared = experiment(name)
    remote = [m for m in models.values() if m.remote]
    if remote and declared.resolve("spec").local_only:
        shown = "true" if remote[0].remote is True else f'"{remote[0].remote}"'
        raise GridSpecError(f"{_where('models.' + remote[0].name)}: remote = {shown}: {name} runs only here (vrh "
                            f"{declared.command} has no --remote): set remote = false, or remove \"{name}\" from "
                            "experiments")


def _tables(data: Mapping[str, Any], section: str) -> list[tuple[str, Any]]:
    tables = data.get(section, {})
    if not isinstance(tables, dict):
        raise GridSpecError(f"GRID.toml: [{section}] must hold named tables such as [{section}.NAME]")
    return list(tables.items())


def _pairs(items: Any, models: Mapping[str, GridModel],
           benchmarks: Mapping[str, GroundingBenchmark]) -> tuple[TransferPair, ...]:
    if not isinstance(items, list):
        raise GridSpecError("GRID.toml: transfer pairs are [[transfer]] tables with models = [\"a\", \"b\"]")
    pairs = []
    for number, table in enumerate(items, 1):
        section = f"transfer #{number}"
        _check_keys(table, section, ("models", "benchmark"), ("models",))
        pair = table["models"]
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(m, str) for m in pair)
                and pair[0] != pair[1]):
            raise GridSpecError(f"{_where(section)}: models must name two different models, e.g. [\"a\", \"b\"]")
        unknown = [m for m in pair if m not in models]
        if unknown:
            raise GridSpecError(f"{_where(section)}: {unknown[0]!r} is not a model of the grid ({', '.join(models)})")
        if models[pair[0]].remote != models[pair[1]].remote:
            raise GridSpecError(f"{_where(section)}: {pair[0]} and {pair[1]} must both be remote or both local")
        benchmark = table.get("benchmark", next(iter(benchmarks)))
        if benchmark not in benchmarks:
            raise GridSpecError(f"{_where(section)}: benchmark = {benchmark!r} is not a benchmark of the grid "
                                f"({', '.join(benchmarks)})")
        pairs.append(TransferPair((pair[0], pair[1]), benchmark))
    return tuple(pairs)


def load_grid(path: str | os.PathLike[str]) -> GridSpec:
    """The ``GridSpec`` of a GRID.toml file; ``GridSpecError`` in one line naming the file when it is missing, a
    folder or not a regular file, unreadable or not UTF-8 text, and naming the field when a field is wrong."""
    path = Path(path)
    if path.is_dir():
        inside = path / "GRID.toml"
        hint = f": did you mean {inside}?" if inside.is_file() else ": name the GRID.toml file itself"
        raise GridSpecError(f"grid file {path} is a folder, not a GRID.toml file{hint}")
    if not path.exists():
        raise GridSpecError(f"grid file {path} does not exist: write one (docs/recipes/grid.md has a reference)")
    if not path.is_file():  # a FIFO or a device would block or never end
        raise GridSpecError(f"grid file {path} is not a regular file: name a GRID.toml file")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise GridSpecError(f"cannot read grid file {path}: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise GridSpecError(f"grid file {path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
                            f"{error.start}): save it as UTF-8") from None
    return parse_grid(text)


# ------------------------------------------------------------------------------------------------------ the plan

@dataclass(frozen=True)
class Cell:
    """One unit of the grid: a run folder made by one runner call. ``id`` is ``KIND:MODEL:BENCHMARK`` (shards:
    ``...#i/n``; transfer: ``transfer:A+B:BENCHMARK``)."""

    id: str
    kind: str  # detect | sweep | sweep-shard | sweep-merge | vqa | transfer | patching
    models: tuple[str, ...]
    benchmark: str
    folder: str  # relative to the grid folder
    depends: tuple[str, ...] = ()
    shard: tuple[int, int] | None = None


def plan_cells(spec: GridSpec) -> list[Cell]:
    """Every cell, each after its dependencies (the detection of the heads it reads): per model its cells by
    benchmark, then by VQA benchmark, then its own (the local executor keeps one model loaded), then the transfer
    pairs. A cell's kind is its experiment's declared name (a sharded sweep: ``sweep-shard`` cells and a
    ``sweep-merge``); its folder ``cells/MODEL/BENCHMARK/NAME``, ``cells/MODEL/NAME-VQA``, ``cells/MODEL/NAME`` or
    ``NAME/A__B__BENCHMARK``."""
    cells: list[Cell] = []
    shards = spec.options.shards
    by_shape = {kind: [e for e in spec.experiments if shape(e) == kind] for kind in ("benchmark", "vqa", "model",
                                                                                    "pair")}

    def needs(name: str, model: str, benchmark: str) -> tuple[str, ...]:
        return (f"detect:{model}:{benchmark}",) if name != "detect" and _reads_scores(name) else ()

    for m in spec.models:
        for b in spec.benchmarks:
            for name in by_shape["benchmark"]:
                folder = f"cells/{m}/{b}/{name}"
                if name != "sweep" or shards == 1:
                    cells.append(Cell(f"{name}:{m}:{b}", name, (m,), b, folder, needs(name, m, b)))
                    continue
                parts = [Cell(f"sweep:{m}:{b}#{i}/{shards}", "sweep-shard", (m,), b,
                              f"cells/{m}/{b}/sweep-shards/{i}", needs(name, m, b), (i, shards)) for i in range(shards)]
                cells += parts + [Cell(f"sweep:{m}:{b}", "sweep-merge", (m,), b, folder, tuple(p.id for p in parts))]
        for name in by_shape["vqa"]:
            for v, bench in spec.vqa.items():
                cells.append(Cell(f"{name}:{m}:{v}", name, (m,), v, f"cells/{m}/{name}-{v}",
                                  needs(name, m, bench.heads_from)))
        for name in by_shape["model"]:
            heads_from = spec.tables.get(name, {}).get("heads_from", next(iter(spec.benchmarks)))
            cells.append(Cell(f"{name}:{m}:{heads_from}", name, (m,), heads_from, f"cells/{m}/{name}",
                              needs(name, m, heads_from)))
    for name in by_shape["pair"]:
        for pair in spec.transfer:
            a, b = pair.models
            cells.append(Cell(f"{name}:{a}+{b}:{pair.benchmark}", name, (a, b), pair.benchmark,
                              f"{name}/{a}__{b}__{pair.benchmark}",
                              needs(name, a, pair.benchmark) + needs(name, b, pair.benchmark)))
    return cells


def check_plan(spec: GridSpec) -> list[Cell]:
    """The plan's cells, refused (``GridSpecError``) when two cells would share a folder, or one cell's folder
    would lie inside another's (a benchmark named ``vqa-X`` beside a VQA benchmark ``X``, or ``patching`` beside
    the patching cells; transfer pairs ``a__b`` + ``c`` and ``a`` + ``b__c``), also where the names differ only in
    case (one folder on macOS and Windows file systems), or share a status file."""
    cells = plan_cells(spec)
    owners: dict[str, Cell] = {}  # every cell folder, case-folded, and every folder above it
    for cell in cells:
        parts = cell.folder.casefold().split("/")
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            other = owners.get(folder)
            if other is not None and other.id != cell.id and (depth == len(parts)
                                                              or other.folder.casefold() == folder):
                shared = "the same folder" if other.folder.casefold() == cell.folder.casefold() else "nested folders"
                folded = "" if cell.folder.startswith(other.folder) or other.folder.startswith(cell.folder) else (
                    " where file names ignore case (macOS, Windows)")
                raise GridSpecError(f"GRID.toml: cells {other.id} and {cell.id} would write into {shared}{folded} "
                                    f"({other.folder}, {cell.folder}): rename a model or benchmark")
            owners.setdefault(folder, cell)
    statuses: dict[str, str] = {}
    for cell in cells:
        name = status_name(cell.id).casefold()
        if name in statuses:
            raise GridSpecError(f"GRID.toml: cells {statuses[name]} and {cell.id} differ only in case: rename a "
                                "model or benchmark (file names may ignore case)")
        statuses[name] = cell.id
    return cells


def check_inputs(spec: GridSpec) -> None:
    """What the cells would meet only after a model loads, refused before (``GridSpecError`` naming the field; no
    torch imported, ``spec_checks``): a model spec naming no shipped toy or tiny fixture, or a local folder
    that is not a model folder (a hub id cannot be checked offline: its cells say), a k above a model's heads where
    the sweep or transfer cells use the ks, and a benchmark whose synthetic evaluation samples are its detection
    samples."""
    from vrh_interp.experiments import spec_checks

    uses_ks = "sweep" in spec.experiments or "transfer" in spec.experiments
    for name, model in spec.models.items():
        where = f"{_where('models.' + name)}: model ="
        try:
            spec_checks.check_model(model.spec, where)
            if uses_ks:
                spec_checks.check_ks_fit(spec.options.ks, model.spec, f"{_where('options')}: ks =")
        except (ValueError, OSError) as error:
            text = str(error).strip('"')
            raise GridSpecError(text if text.startswith("GRID.toml") else f"{where} {model.spec!r}: {text}") from None
    from vrh_interp.data.sources import check_paths

    data = [(f"benchmarks.{n}", key, getattr(b, key), False) for n, b in spec.benchmarks.items() for key in
            ("detect", "eval")] + [(f"vqa.{n}", "data", b.data, True) for n, b in spec.vqa.items()]
    for section, key, text, vqa in data:  # the files and folders a data spec names: there and readable
        try:
            check_paths(text, f"{_where(section)}: {key} =", vqa=vqa)
        except (ValueError, OSError) as error:
            raise GridSpecError(str(error).strip('"')) from None
    for name, bench in spec.benchmarks.items():
        section = _where(f"benchmarks.{name}")
        try:
            spec_checks.check_disjoint_specs(bench.detect, bench.eval, f"{section}: detect =", f"{section}: eval =")
        except ValueError as error:
            raise GridSpecError(str(error)) from None


def check_numbers(spec: GridSpec) -> None:
    """Every number of the spec (options, models) finite and >= 0 and ``summary_k`` among the ks (what
    ``parse_grid`` checks field by field, for a ``GridSpec`` made in Python; an experiment's ``[NAME]`` table is
    checked by its cells' specs)."""
    parts: list[tuple[str, Any]] = [("options", spec.options),
                                    *((f"models.{name}", model) for name, model in spec.models.items())]
    for section, part in parts:
        for item in dataclasses.fields(part):
            value = getattr(part, item.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not (math.isfinite(value)
                                                                                         and value >= 0):
                raise GridSpecError(f"{_where(section)}: {item.name} = {value} must be a finite number >= 0")
    _check_summary_k(spec.options)


def cell_resources(spec: GridSpec, cell: Cell) -> dict[str, float]:
    """What one cell's task declares: ``cpus`` of the options, and the largest ``gpus`` / ``memory_gb`` of its
    models (a transfer cell holds both models)."""
    models = [spec.models[m] for m in cell.models]
    out = {"num_cpus": spec.options.cpus, "num_gpus": max(m.gpus for m in models)}
    memory = [m.memory_gb for m in models if m.memory_gb]
    if memory:
        out["memory"] = max(memory) * 2 ** 30
    return out


# -------------------------------------------------------------------------------------------- running one cell

_MODEL_CACHE: dict[tuple[Any, ...], Any] = {}


def _load(model: GridModel) -> Any:
    """The model placed where the spec says (``remote``), kept loaded for the next cell of the same model (one model
    at a time per process)."""
    from vrh_interp.specs import load_spec

    key = (model.spec, model.device_map, model.dtype)
    if key not in _MODEL_CACHE:
        _MODEL_CACHE.clear()
        _MODEL_CACHE[key] = load_spec(model.spec, model.device_map, model.dtype)
    return _MODEL_CACHE[key].on(remote=model.remote)


def _scores_path(grid_dir: Path, spec: GridSpec, model: str, benchmark: str) -> Path:
    """The scores file the detection cell of (``model``, ``benchmark``) writes (``experiments.detect.run``)."""
    from vrh_interp.experiments.detect import scores_path

    return scores_path(grid_dir / f"cells/{model}/{benchmark}/detect", spec.options.preset)


def _reads_scores(name: str) -> bool:
    """Whether the declared experiment's cells read the detection's scores (a spec field the grid fills with them)."""
    from vrh_interp.experiments.declared import experiment

    return any(opt.grid == "scores" for _, opt in experiment(name).resolve("spec").options())


def cell_spec(grid_dir: Path, spec: GridSpec, cell: Cell) -> Any:
    """The spec a declared experiment's cell runs (``experiments.spec``): what the grid fills in (the model, the
    cell folder, the benchmark's samples, the detection's scores: each field's ``grid`` role), the grid's
    ``[options]`` that are fields of the spec, then its own ``[NAME]`` table; refused (``SpecError`` naming the
    table and key) as ``vrh NAME`` would refuse it."""
    from vrh_interp.core.bookkeeping.shards import Shard
    from vrh_interp.experiments.declared import experiment

    name = "sweep" if cell.kind == "sweep-shard" else cell.kind
    spec_class = experiment(name).resolve("spec")
    model, folder = spec.models[cell.models[0]], grid_dir / cell.folder
    vqa = spec.vqa.get(cell.benchmark) if shape(name) == "vqa" else None
    heads_from = vqa.heads_from if vqa is not None else cell.benchmark  # the benchmark whose detection it reads
    bench = spec.benchmarks[heads_from]
    fills = {"model": model.spec, "out": str(folder), "detect": bench.detect, "eval": bench.eval,
             "vqa": (vqa.data,) if vqa is not None else (),
             "scores": str(_scores_path(grid_dir, spec, model.name, heads_from))}
    if len(cell.models) == 2:  # a pair: the partner, its scores, and both names for the run folder
        fills.update(partner=spec.models[cell.models[1]].spec, labels=",".join(cell.models),
                     partner_scores=str(_scores_path(grid_dir, spec, cell.models[1], heads_from)))
    given: dict[str, Any] = {}
    for item, opt in spec_class.options():
        if opt.grid in fills:
            given[item.name] = fills[opt.grid]
        elif item.name in GRID_OPTIONS:
            given[item.name] = getattr(spec.options, item.name)
    extra = {"device": model.device_map, "dtype": model.dtype, "progress": False,
             "shard": Shard(*cell.shard) if cell.shard else None,
             # a sharded cell's shards share one census (in the folder above theirs): their conditions must agree
             "census": str(folder.parent) if cell.shard else None}
    fields = {item.name for item, _ in spec_class.options()}
    given.update({k: v for k, v in extra.items() if k in fields})
    table = {k: v for k, v in spec.tables.get(name, {}).items() if k != "heads_from"}
    return spec_class.from_table(table, _where(name), **given)


def _run_declared(grid_dir: Path, spec: GridSpec, cell: Cell) -> dict[str, Any]:
    """A declared experiment's cell: its spec (``cell_spec``) run by the declaration's ``run(spec, vlm, folder)``,
    exactly as ``vrh NAME`` runs it."""
    from vrh_interp.experiments.declared import experiment
    from vrh_interp.experiments.spec import ExperimentSpec

    name = "sweep" if cell.kind == "sweep-shard" else cell.kind
    run_spec = cell_spec(grid_dir, spec, cell)
    vlm = _load(spec.models[cell.models[0]]) if isinstance(run_spec, ExperimentSpec) else None
    result = experiment(name).resolve("run")(run_spec, vlm, grid_dir / cell.folder)
    if hasattr(result, "top") and hasattr(result, "scores"):  # head scores: the best five, for the status
        return {"top": result.top(min(5, result.scores.size)).to_list()}
    if isinstance(getattr(result, "facts", None), dict) and "vrhs" in result.facts:  # a study: the heads it studied
        return {"heads": list(result.facts["vrhs"])}
    records = getattr(result, "records", None)
    return {} if records is None else {"records": len(records)}


def _run_merge(grid_dir: Path, spec: GridSpec, cell: Cell) -> dict[str, Any]:
    from vrh_interp.experiments.merge import merge_runs
    from vrh_interp.experiments.sweep import sweep_from_run

    out = grid_dir / cell.folder
    manifest = out / "manifest.json"
    if not (manifest.exists() and "shard" not in json.loads(manifest.read_text(encoding="utf-8"))):
        merge_runs(out, [grid_dir / cell.folder.replace("/sweep", "/sweep-shards") / str(i)
                         for i in range(spec.options.shards)])
    result = sweep_from_run(out, iou_threshold=spec.options.iou)
    write_atomic(out / "sweep_summary.csv", result.summary().to_csv(index=False))
    return {"records": len(result.records)}










_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_LONGEST_NAME = 160  # bytes of a status name kept whole (file names end at 255 bytes, with ".attempts.jsonl")


def status_name(cell_id: str) -> str:
    """The status file name of a cell (without ``.json``), one per cell id: letters, digits, '.' and '-' stay,
    every other character (':', '_', '%', '/', '#', '+', any non-ASCII) becomes %XX of its UTF-8 bytes, so two
    ids never share a name (``detect:a:b_c`` -> ``detect%3Aa%3Ab%5Fc``, ``detect:a_b:c`` -> ``detect%3Aa%5Fb%3Ac``).
    A name longer than 160 characters keeps its first 140 and ``~`` with a hash of the exact id (``~`` appears
    in no other name)."""
    raw = cell_id.encode("utf-8", "surrogatepass")
    name = "".join(c if c in _PLAIN else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in cell_id)
    if len(name) > _LONGEST_NAME:
        name = f"{name[:140]}~{hashlib.sha256(raw).hexdigest()[:16]}"
    return name


def status_path(grid_dir: Path, cell_id: str) -> Path:
    return Path(grid_dir) / STATUS_DIR / (status_name(cell_id) + ".json")


def _legacy_status_path(grid_dir: Path, cell_id: str) -> Path:
    """Where grids made before issue 53 kept a cell's status (':' and the like became '_', so two cells could share it:
    read only when the file names this very cell)."""
    return Path(grid_dir) / STATUS_DIR / (re.sub(r"[^A-Za-z0-9_.+-]+", "_", cell_id) + ".json")


def read_status(grid_dir: Path, cell_id: str) -> dict[str, Any]:
    for path in (status_path(grid_dir, cell_id), _legacy_status_path(grid_dir, cell_id)):
        try:
            status = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(status, dict) and status.get("cell") == cell_id and "status" in status:
            return status
    return {"status": "pending"}


def write_status(grid_dir: Path, cell_id: str, status: str, **facts: Any) -> None:
    path = status_path(grid_dir, cell_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"cell": cell_id, "status": status, "time": time.time(), **facts})


def one_line(error: BaseException) -> str:
    """An error as the one line a status shows."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


def _records_in(folder: Path, kind: str) -> int:
    if kind == "patch":  # the study's finished parts (pair kinds, probes)
        from vrh_interp.experiments.patching_study import PART_DONE

        return len(list(folder.glob(f"parts/*/{PART_DONE}")))
    declared = experiment({"sweep-shard": "sweep", "sweep-merge": "sweep"}.get(kind, kind))
    paths = [declared.log_path(folder)] if declared.log else sorted(folder.glob("masked_in_*/sweep_records.jsonl"))
    return sum(p.read_bytes().count(b"\n") for p in paths if p.exists())


def _hold(folder: Path, wait_s: float) -> Any:
    """The cell folder's run lock, waiting up to ``wait_s`` for a previous attempt's process to let go (a retried
    task can start while the killed one's worker is still being reaped)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return lock_run_folder(folder)
        except RunLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def torch_threads(count: int | None = None) -> int:
    """torch's intra-op thread count; with ``count``, set it first (what ``run_cell`` fixes per cell)."""
    import torch

    if count is not None:
        torch.set_num_threads(count)
    return torch.get_num_threads()


def run_cell(grid_dir: str | os.PathLike[str], spec: GridSpec | Mapping[str, Any], cell_id: str,
             *_dependencies: Any) -> dict[str, Any]:
    """Run (or resume) one cell of the grid in this process and return its status; what both executors call.

    Writes ``status/CELL.json`` (running, then done or failed) and appends an attempt line (process, host, the
    records already in the folder when it started) to ``status/CELL.attempts.jsonl``: a retried cell shows that
    it resumed. Exceptions propagate (the executor records them); ``_dependencies`` are ignored (the Ray
    executor passes the dependencies' results to order the tasks)."""
    grid_dir = Path(grid_dir)
    spec = spec if isinstance(spec, GridSpec) else GridSpec.from_dict(spec)
    cell = {c.id: c for c in plan_cells(spec)}[cell_id]
    folder = grid_dir / cell.folder
    lock = _hold(folder, wait_s=60.0)
    attempt = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
               "records_before": _records_in(folder, cell.kind)}
    status_path(grid_dir, cell_id).parent.mkdir(parents=True, exist_ok=True)
    with open(status_path(grid_dir, cell_id).with_suffix(".attempts.jsonl"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(attempt) + "\n")
    write_status(grid_dir, cell_id, "running", pid=attempt["pid"], host=attempt["host"])
    started = time.monotonic()
    threads = torch_threads()
    torch_threads(spec.options.threads)
    try:
        facts = (_run_merge if cell.kind == "sweep-merge" else _run_declared)(grid_dir, spec, cell)
    except Exception as error:
        write_status(grid_dir, cell_id, "failed", reason=one_line(error))
        raise
    finally:
        torch_threads(threads)
        del lock
    done = {"status": "done", "seconds": round(time.monotonic() - started, 3), **facts}
    write_status(grid_dir, cell_id, "done", **{k: v for k, v in done.items() if k != "status"})
    return done


# ------------------------------------------------------------------------------------------ manifest, executors

@dataclass
class GridResult:
    out: Path
    cells: list[Cell]
    status: dict[str, dict[str, Any]]
    summary: Any  # pandas DataFrame (grid_summary.csv)
    patching: Any = None  # pandas DataFrame (grid_patching.csv), for grids with patching cells

    @property
    def failed(self) -> list[str]:
        return [c.id for c in self.cells if self.status[c.id]["status"] != "done"]


def write_manifest(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell], executor: str) -> dict[str, dict[str, Any]]:
    """``grid.json``: the grid, every cell and its status (from ``status/``); returns the statuses."""
    status = {c.id: read_status(grid_dir, c.id) for c in cells}
    write_json_atomic(grid_dir / GRID_FILE, {
        "kind": "grid", "grid": spec.to_dict(), "executor": executor,
        "cells": [{**dataclasses.asdict(c), **{k: status[c.id].get(k) for k in ("status", "reason", "pid", "host",
                                                                               "seconds") if k in status[c.id]}}
                  for c in cells]})
    return status


SCHEDULING_KEYS = {"options": ("cpus", "retries", "summary_k"), "model": ("gpus", "memory_gb")}
"""Fields that decide where and how often a cell runs, not its records: a rerun may change them."""


def _results_view(grid: Mapping[str, Any]) -> dict[str, Any]:
    view = json.loads(json.dumps(grid))
    for key in SCHEDULING_KEYS["options"]:
        view.get("options", {}).pop(key, None)
    for model in view.get("models", {}).values():
        for key in SCHEDULING_KEYS["model"]:
            model.pop(key, None)
    return view


def _check_same_grid(grid_dir: Path, spec: GridSpec) -> None:
    """Refuse a grid folder made by a GRID.toml whose cells would differ (scheduling fields may change)."""
    path = grid_dir / GRID_FILE
    if not path.exists():
        return
    before = _results_view(json.loads(path.read_text(encoding="utf-8")).get("grid") or {})
    now = _results_view(spec.to_dict())
    if before != now:
        differing = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        raise GridSpecError(f"grid folder {grid_dir} was made by a different GRID.toml ({', '.join(differing)} "
                            "differ): use another --out, or delete the folder to start over")


def run_local(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell], *,
              log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The local executor: every cell not done yet, in plan order, in this process. A failed cell is recorded
    (one line) and the grid goes on with the cells that do not need it."""
    failed: dict[str, dict[str, Any]] = {}
    for cell in cells:
        if read_status(grid_dir, cell.id)["status"] == "done":
            continue
        blocked = [d for d in cell.depends if d in failed or read_status(grid_dir, d)["status"] != "done"]
        if blocked:
            failed[cell.id] = {"status": "failed", "reason": f"needs {blocked[0]}, which did not finish"}
            write_status(grid_dir, cell.id, **failed[cell.id])
            continue
        log(f"grid: {cell.id} ...")
        try:
            run_cell(grid_dir, spec, cell.id)
        except Exception as error:
            failed[cell.id] = {"status": "failed", "reason": one_line(error)}
            write_status(grid_dir, cell.id, **failed[cell.id])
            log(f"grid: {cell.id} failed: {failed[cell.id]['reason']}")
        write_manifest(grid_dir, spec, cells, "local")
    return write_manifest(grid_dir, spec, cells, "local")


CONFIRM_ABOVE = 500
"""A plan with more cells to run than this runs only when confirmed (``vrh grid --yes``, ``run_grid(yes=True)``)."""
NOMINAL_CELL_SECONDS = 5.0
"""The estimate's seconds per cell before any cell of the grid has run: a toy-model cell on a 2-core CPU (issue 53
measured 37 cells in 180 s); real models take longer. Once cells are done, their mean is used instead."""


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def plan_estimate(grid_dir: Path, cells: Sequence[Cell]) -> tuple[int, str]:
    """How many cells are still to run, and one line with the count and a time estimate (one cell at a time): the
    mean seconds of the grid's done cells, or ``NOMINAL_CELL_SECONDS`` when none has run."""
    states = [read_status(grid_dir, c.id) for c in cells]
    seconds = [s["seconds"] for s in states if s["status"] == "done" and isinstance(s.get("seconds"), (int, float))]
    todo = sum(s["status"] != "done" for s in states)
    if seconds:
        per_cell = sum(seconds) / len(seconds)
        basis = f"{per_cell:.3g} s per cell, the mean of the {len(seconds)} done"
    else:
        per_cell = NOMINAL_CELL_SECONDS
        basis = f"a toy model's {per_cell:g} s per cell on a 2-core CPU; real models take longer"
    return todo, (f"{len(cells)} cells, {todo} to run ({len(cells) - todo} done); estimate ~"
                  f"{_duration(todo * per_cell)} one at a time ({basis})")


def run_grid(grid: str | os.PathLike[str] | GridSpec, out: str | os.PathLike[str], *, ray: str | None = None,
             progress: bool = True, yes: bool = False, confirm_above: int | None = CONFIRM_ABOVE) -> GridResult:
    """Run (or resume) a grid into ``out``: ``grid`` is a GRID.toml path or a ``GridSpec``; ``ray`` None runs the
    cells here in order, ``"auto"`` or a cluster address runs them as Ray tasks (``run_ray``).
    The whole plan is checked first (``GridSpecError`` before any cell runs or any model loads); its cell count and
    a time estimate are printed, and more than ``confirm_above`` cells to run are refused unless ``yes``.
    Writes grid.json, the summary and the heatmap; returns every cell's status and the summary."""
    spec = grid if isinstance(grid, GridSpec) else load_grid(grid)
    if isinstance(grid, GridSpec):  # parse_grid checked a GRID.toml's
        check_numbers(spec)
    cells = check_plan(spec)
    check_inputs(spec)
    grid_dir = Path(out)

    def log(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)

    _check_same_grid(grid_dir, spec)
    todo, plan = plan_estimate(grid_dir, cells)
    if confirm_above is not None and todo > confirm_above and not yes:
        raise GridSpecError(f"{plan}: more than {confirm_above} cells run only when confirmed: pass --yes "
                            "(run_grid(..., yes=True)), or make the grid smaller")
    # Ray installed and its cluster joined (an address where none answers: refused within CONNECT_TIMEOUT_S)
    # before the folder is touched
    connected = ray is not None and connect(ray)
    log(f"grid: {plan}")
    try:
        lock = lock_run_folder(grid_dir)  # one driver per grid folder
        try:
            _check_same_grid(grid_dir, spec)  # again under the lock: another driver may have started the folder
            write_manifest(grid_dir, spec, cells, ray and "ray" or "local")
            if ray is None:
                status = run_local(grid_dir, spec, cells, log=log)
            else:
                status = run_ray(grid_dir, spec, cells, address=ray, log=log)
            summary = write_summary(grid_dir, spec, cells, status)
            patching = patching_summary(grid_dir, cells, status) if "patch" in spec.experiments else None
            return GridResult(grid_dir, cells, status, summary, patching)
        finally:
            del lock
    finally:
        if connected:  # joined here: left here (run_ray leaves a connection it did not make)
            _import_ray().shutdown()


# ------------------------------------------------------------------------------------------------- Ray executor
# (``vrh grid --ray``; ``pip install 'vrh-interp[ray]'``; Ray is imported only here)

RETRIED_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, OSError)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray, an optional extra: pip install 'vrh-interp[ray]' (or run without --ray: "
                           "the local executor)") from None
    return ray


CONNECT_TIMEOUT_S = 10.0
"""How long ``connect`` waits for a cluster address to answer before refusing it (Ray's own retries last minutes)."""
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # and empty SETTINGS


def _cluster_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``--ray`` address (``HOST:PORT``, ``ray://HOST:PORT``, ``auto`` with ``RAY_ADDRESS``
    set); None where Ray finds the cluster itself (``auto``: this machine's, or a new local one)."""
    if address in ("auto", "local"):
        address = os.environ.get("RAY_ADDRESS", "") if address == "auto" else ""
        if address in ("", "auto", "local"):
            return None
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RuntimeError(f"--ray {address!r} is not a cluster address: use auto or HOST:PORT, e.g. --ray "
                           "10.0.0.1:6379")
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout: float | None = None) -> None:
    """Refuse (``RuntimeError``, one line) a cluster address where nothing answers within ``timeout`` seconds
    (``CONNECT_TIMEOUT_S``): no route, a closed port, a firewall that drops the packets, or a server that does not
    speak gRPC (HTTP/2, as Ray's GCS does; not checked with ``RAY_USE_TLS``). Ray alone retries such an address for
    minutes with its own messages."""
    target = _cluster_address(address)
    if target is None:
        return
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    fix = "start one with `ray start --head` and pass the address it prints, e.g. --ray 10.0.0.1:6379"
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(target, timeout=timeout) as connection:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            connection.settimeout(max(0.1, deadline - time.monotonic()))
            connection.sendall(_HTTP2_PREFACE)
            answer = connection.recv(9)
    except (socket.timeout, TimeoutError):
        raise RuntimeError(f"no Ray cluster answered at {address!r} within {timeout:g} s: {fix}") from None
    except OSError as error:
        raise RuntimeError(f"cannot reach a Ray cluster at {address!r} ({error.strerror or error}): {fix}") from None
    if len(answer) < 9 or answer[3] != 4:  # a gRPC server's first frame is its SETTINGS (type 4)
        raise RuntimeError(f"the server at {address!r} is not a Ray cluster (it does not answer as Ray's GCS does): "
                           f"{fix}")


def connect(address: str) -> bool:
    """Join the Ray cluster at ``address`` (``auto``: the one this machine belongs to, ``RAY_ADDRESS``, or a new
    local one), unless this process already has one; True when this call started the connection. An address where
    no cluster answers within ``CONNECT_TIMEOUT_S`` seconds is refused first (``check_reachable``, before Ray is
    imported: that alone takes seconds)."""
    check_reachable(address)
    ray = _import_ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=None if address == "auto" else address, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise RuntimeError(f"cannot join the Ray cluster at {address!r} ({one_line(error)}): start one with "
                           "`ray start --head` or pass its address, e.g. --ray 10.0.0.1:6379") from None
    return True


def _unavailable(needs: dict[str, float], total: dict[str, float]) -> str:
    """Why no node of the cluster could ever run a task needing ``needs`` ('' when it fits the cluster's total)."""
    names = {"num_cpus": ("CPU", "cpus"), "num_gpus": ("GPU", "gpus"), "memory": ("memory", "memory_gb")}
    for key, amount in needs.items():
        resource, field = names[key]
        have = float(total.get(resource, 0.0))
        if amount > have:
            scale = 2 ** 30 if key == "memory" else 1
            return (f"needs {amount / scale:g} {field} and the Ray cluster has {have / scale:g} in all: add nodes "
                    f"with them, or lower {field} in GRID.toml")
    return ""


def _reason(ray: Any, error: BaseException, cell: Cell, failed: dict[str, Any]) -> str:
    blocked = [d for d in cell.depends if d in failed]
    if blocked:
        return f"needs {blocked[0]}, which did not finish"
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = getattr(error, "cause", None)
        return one_line(cause) if isinstance(cause, BaseException) else one_line(error)
    if isinstance(error, ray.exceptions.WorkerCrashedError):
        return "the worker process died on every retry (WorkerCrashedError); see the Ray logs"
    return one_line(error)


def run_ray(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell], *, address: str,
            log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Submit every cell not done yet as a Ray task and wait for all; grid.json is refreshed every 2 s (the
    workers' running / done / failed statuses). Returns the statuses."""
    ray = _import_ray()
    started = connect(address)
    try:
        task = ray.remote(run_cell)
        # the driver's NDIF timeouts reach the workers (remote cells time out as they would here)
        forwarded = {name: os.environ[name] for name in REMOTE_TIMEOUT_ENV.values() if name in os.environ}
        refs: dict[str, Any] = {}
        failed: dict[str, Any] = {}
        total = ray.cluster_resources()
        for cell in cells:
            if read_status(grid_dir, cell.id)["status"] == "done":
                continue
            missing = _unavailable(cell_resources(spec, cell), total)
            blocked = [d for d in cell.depends if d in failed]
            if missing or blocked:  # it would wait for ever: fail it now
                failed[cell.id] = {"status": "failed", "reason": missing or f"needs {blocked[0]}, which did not finish"}
                write_status(grid_dir, cell.id, **failed[cell.id])
                log(f"grid: {cell.id} failed: {failed[cell.id]['reason']}")
                continue
            options = {**cell_resources(spec, cell), "max_retries": spec.options.retries,
                       "retry_exceptions": list(RETRIED_ERRORS), "name": cell.id}
            if forwarded:
                options["runtime_env"] = {"env_vars": forwarded}
            dependencies = [refs[d] for d in cell.depends if d in refs]
            refs[cell.id] = task.options(**options).remote(str(grid_dir), spec.to_dict(), cell.id, *dependencies)
        log(f"grid: {len(refs)} cells submitted to Ray ({len(cells) - len(refs)} already done)")
        by_ref = {ref: {c.id: c for c in cells}[cid] for cid, ref in refs.items()}
        while by_ref:
            ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=2.0)
            for ref in ready:
                cell = by_ref.pop(ref)
                try:
                    ray.get(ref)
                    log(f"grid: {cell.id} done")
                except Exception as error:  # a task error, a dead worker, a lost node: the cell failed
                    failed[cell.id] = {"status": "failed", "reason": _reason(ray, error, cell, failed)}
                    write_status(grid_dir, cell.id, **failed[cell.id])
                    log(f"grid: {cell.id} failed: {failed[cell.id]['reason']}")
            write_manifest(grid_dir, spec, cells, "ray")
        return write_manifest(grid_dir, spec, cells, "ray")
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------------------------------- summary

def cell_verdicts(folder: Path, kind: str, benchmark: str | None = None) -> dict[int, tuple[str, str]]:
    """``{k: (verdict, reason)}`` of one done cell, from its per-item records by the claims rules (sweep cells:
    ``experiments.verdicts.sweep_claims``, Bonferroni over the k values; VQA cells: the causal claim on one question
    kind's items, ``verdicts.vqa_evidence``): the one place the grid asks for a verdict."""
    from vrh_interp.evaluation.claims import judge
    from vrh_interp.experiments import verdicts

    if kind == "vqa_sweep":
        from vrh_interp.experiments.vqa_sweep import vqa_sweep_from_run

        result = vqa_sweep_from_run(folder)
        out = {}
        for k in sorted({c.k for c in result.conditions if c.kind == "top"}):
            row = judge({"vqa": verdicts.vqa_evidence(result, [benchmark], k)}).iloc[0]
            out[k] = (str(row["verdict"]), str(row["reason"]))
        return out
    from vrh_interp.experiments.sweep import sweep_from_run

    table = verdicts.sweep_claims(sweep_from_run(folder))
    return {int(i.split("=")[1]): (str(v), str(r)) for i, v, r in zip(table["id"], table["verdict"], table["reason"])}


def _accuracy(summary: Any, condition: str, k: int) -> float:
    rows = summary[(summary["condition"] == condition) & (summary["k"] == k)]
    if condition in ("random", "matched", "live"):
        rows = rows[rows["seed"].astype(str) == "all"]
    return float(rows["accuracy"].iloc[0]) if len(rows) == 1 else float("nan")


def summary_rows(summary: Any, experiment: str, model: str, benchmark: str, ks: Sequence[int],
                 judged: Mapping[int, tuple[str, str]]) -> list[dict[str, Any]]:
    """Table 3 / A12 rows of one cell: per k > 0, baseline, VRH-k, random-k, matched-k and live-k accuracy
    (control kinds: the mean over their sets; NaN where the cell drew none), the drop of VRH-k and the verdict
    (``judged``: ``cell_verdicts``)."""
    rows = []
    for k in ks:
        verdict, reason = judged.get(k, ("not measured", "no records"))
        base, top = _accuracy(summary, "baseline", 0), _accuracy(summary, "top", k)
        rows.append({"experiment": experiment, "model": model, "benchmark": benchmark, "k": k, "baseline": base,
                     "vrh": top, "random": _accuracy(summary, "random", k), "matched": _accuracy(summary, "matched", k),
                     "live": _accuracy(summary, "live", k),
                     "drop": base - top, "verdict": verdict, "reason": reason})
    return rows


SUMMARY_COLUMNS = ["experiment", "model", "benchmark", "k", "baseline", "vrh", "random", "matched", "live", "drop",
                   "verdict", "reason"]


def grid_summary(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell],
                 status: Mapping[str, Mapping[str, Any]]) -> Any:
    """The grid's summary table from the done cells' folders (sweep: every k > 0; VQA: k = vqa_k)."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for cell in cells:
        if status[cell.id]["status"] != "done" or cell.kind not in ("sweep", "sweep-merge", "vqa_sweep"):
            continue
        folder = grid_dir / cell.folder
        if cell.kind == "vqa_sweep":
            frame = pd.read_csv(folder / "vqa_summary.csv")
            for benchmark, part in frame.groupby("benchmark", sort=False):
                k = int(part.loc[part["condition"] == "top", "k"].iloc[0])
                rows += summary_rows(part.reset_index(drop=True), "vqa", cell.models[0],
                                     f"{cell.benchmark}/{benchmark}", [k], cell_verdicts(folder, cell.kind, benchmark))
        else:
            frame = pd.read_csv(folder / "sweep_summary.csv")
            ks = sorted(int(k) for k in frame.loc[frame["condition"] == "top", "k"].unique())
            rows += summary_rows(frame, "sweep", cell.models[0], cell.benchmark, ks, cell_verdicts(folder, "sweep"))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


PATCHING_COLUMNS = ["model", "heads_from", "kind", "metric", "heads", "n_pairs", "recovery", "ci_low", "ci_high",
                    "all_heads", "random_mean", "random_rank", "random_sets", "random_p", "matched_mean",
                    "matched_rank", "matched_sets", "matched_p", "verdict"]


def patching_summary(grid_dir: Path, cells: Sequence[Cell], status: Mapping[str, Mapping[str, Any]]) -> Any:
    """One row per done patching cell and pair kind: the study's own headline (``patching_study.headline``: the
    studied heads' recovery with its CI, all heads', their rank among the random and layer-matched sets, the
    study's verdict), read from the cell folder."""
    import pandas as pd

    from vrh_interp.experiments.patching_study import PatchingStudy, headline

    frames = [headline(PatchingStudy.load(grid_dir / c.folder)).assign(model=c.models[0], heads_from=c.benchmark)
              for c in cells if c.kind == "patch" and status[c.id]["status"] == "done"]
    return pd.concat(frames, ignore_index=True)[PATCHING_COLUMNS] if frames else pd.DataFrame(columns=PATCHING_COLUMNS)


def write_summary(grid_dir: Path, spec: GridSpec, cells: Sequence[Cell],
                  status: Mapping[str, Mapping[str, Any]]) -> Any:
    """grid_summary.csv / .md, grid_patching.csv (grids with patching cells) and the heatmap grid_drop.png; the
    summary frame."""
    from vrh_interp.viz.tables import markdown_table

    summary = grid_summary(grid_dir, spec, cells, status)
    write_atomic(grid_dir / SUMMARY_CSV, summary.to_csv(index=False))
    lines = ["# Grid summary", "",
             "Accuracy with nothing masked (baseline), the top-k VRHs masked (VRH-k), and the mean over the random, "
             "layer-matched and live-head k-head control sets; drop = baseline - VRH-k; verdict: the claims rules on "
             "the cell's per-item records (`experiments.grid.cell_verdicts`, `vrh_interp.evaluation.claims`).", ""]
    if len(summary):
        shown = summary.drop(columns=["reason"]).round(3)
        lines += [markdown_table(shown), ""]
    import pandas as pd

    transfers = [pd.read_csv(grid_dir / c.folder / "transfer_drops.csv") for c in cells
                 if c.kind == "transfer" and status[c.id]["status"] == "done"]
    if transfers:
        lines += ["## Transfer (cross-masking at the largest k)", "", markdown_table(pd.concat(transfers).round(3)), ""]
    if "patch" in spec.experiments:
        patching = patching_summary(grid_dir, cells, status)
        write_atomic(grid_dir / PATCHING_CSV, patching.to_csv(index=False))
        if len(patching):
            study = cell_spec(grid_dir, spec, next(c for c in cells if c.kind == "patch"))
            top = study.top if study.top is not None else "k*"
            lines += ["## Patching (the studied heads' outputs patched clean -> corrupted)", "",
                      f"Recovery of the metric (`{study.metric}`) with the top {top} heads of `heads_from` "
                      "patched, its 95% CI, all heads patched, and the heads' rank among the random "
                      "and layer-matched same-size sets (rank 1 = none recovers as much; p: their tail) with the "
                      "study's verdict (`experiments.patching_study`; the cell's patching.md has every table).", "",
                      markdown_table(patching.drop(columns=["heads"]).round(3)), ""]
    states = [{"cell": c.id, "status": status[c.id]["status"], "reason": status[c.id].get("reason", "")}
              for c in cells]
    lines += ["## Cells", "", markdown_table(pd.DataFrame(states)), ""]
    write_atomic(grid_dir / SUMMARY_MD, "\n".join(lines))
    grounding = summary[summary["experiment"] == "sweep"]
    if len(grounding):
        from vrh_interp.viz.plots import grid_drop_heatmap

        wanted = spec.options.summary_k  # one of the ks (parse_grid): absent only where its cells did not finish
        k = wanted if wanted in set(grounding["k"]) else int(grounding["k"].max())
        at_k = grounding[grounding["k"] == k]
        drops = at_k.pivot(index="model", columns="benchmark", values="drop").reindex(
            index=[m for m in spec.models if m in set(at_k["model"])],
            columns=[b for b in spec.benchmarks if b in set(at_k["benchmark"])])
        verdicts = at_k.pivot(index="model", columns="benchmark", values="verdict").reindex_like(drops)
        missing = f" (summary_k = {wanted}: no finished cell)" if wanted is not None and wanted != k else ""
        figure = grid_drop_heatmap(drops, verdicts, title=f"grounding drop with the top-{k} VRHs masked{missing}")
        figure.savefig(grid_dir / HEATMAP)
    return summary


def print_grid(result: GridResult, *, as_json: bool = False) -> int:
    """What ``vrh grid`` prints: the summary table and every cell's status (``as_json``: one JSON object); 0 when
    every cell is done, 1 otherwise (the failed cells' reasons are printed and kept in grid.json)."""
    import pandas as pd

    states = [{"cell": c.id, "status": result.status[c.id]["status"], "reason": result.status[c.id].get("reason", "")}
              for c in result.cells]
    if as_json:
        extra = ({"patching": json.loads(result.patching.to_json(orient="records"))}
                 if result.patching is not None else {})
        print(json.dumps({"out": str(result.out), "cells": states,
                          "summary": json.loads(result.summary.to_json(orient="records")), **extra}))
    else:
        with pd.option_context("display.max_columns", 20, "display.precision", 3, "display.width", 120):
            if len(result.summary):
                print("\nGrid summary: accuracy (baseline, top-k VRHs masked, mean of the random / layer-matched / "
                      "live-head control sets), drop and verdict")
                print(result.summary.drop(columns=["reason"]).to_string(index=False))
            if result.patching is not None and len(result.patching):
                print("\nPatching: recovery of the studied heads, all heads, their rank among the random / "
                      "layer-matched sets, verdict")
                print(result.patching.drop(columns=["heads", "verdict"]).to_string(index=False))
            done = sum(s["status"] == "done" for s in states)
            print(f"\n{done} of {len(states)} cells done; folder {result.out} (grid.json, {SUMMARY_MD}, {HEATMAP})")
            for state in states:
                if state["status"] != "done":
                    print(f"- {state['cell']}: {state['status']} {state['reason']}".rstrip())
    return 0 if not result.failed else 1
