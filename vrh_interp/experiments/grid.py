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

Executors (``experiments.grid_execution``, with ``run_grid``, the driver's entry, and the cells' status files; the
summary tables: ``experiments.grid_summary``). ``local`` runs the cells in plan order in this process (one model
loaded at a time). ``ray`` (``run_ray``, ``pip install 'vrh-interp[ray]'``; Ray is imported only there) submits every
cell not done yet as one Ray task running ``run_cell`` (the function the local executor calls) with the resources the
grid declares (``num_cpus`` = ``cpus``, ``num_gpus`` and ``memory`` from the cell's models) and its dependencies'
results as arguments, so Ray starts it only after them. A task whose worker dies (killed, out of memory, a lost node)
or that raises a ``RuntimeError`` / ``OSError`` (a CUDA error, a dropped NDIF connection) is retried up to
``retries`` times; ``ValueError`` (a bad spec, a k too large for the model) fails the cell at once. Resume is the run
folders' own: a cell killed at any point (its worker, or the driver: Ray then ends the driver's tasks) is rerun from
its records, so no finished pass is repeated; a cell whose status file says ``done`` is not run again. Both executors
run the same function per cell, so their folders hold the same records. On more than one machine the grid folder must
be on a shared file system at the same path everywhere, and the workers need this package installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from vrh_interp.core.bookkeeping.runs import write_atomic
from vrh_interp.experiments.spec import (RunSpec, Spec, SpecError, float_in, ks_spec, non_negative_int, option,
                                         positive_int, preset, unit_interval)

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


@dataclass(frozen=True, kw_only=True)
class GridRunSpec(RunSpec):
    """What ``vrh grid`` takes (``experiments.grid_execution.run``): the GRID.toml file, the grid folder, where the
    cells run and the confirmation of a large plan. The GRID.toml is checked whole (``grid.load_grid``: every cell's
    spec, models, files, ks) with the other faults, before any cell runs."""

    command: ClassVar[str] = "grid"
    quiet_under_json: ClassVar[bool] = True  # under --json no progress lines, as before

    grid: str = option(None, "the grid file (docs/recipes/grid.md): models, benchmarks, experiments, options",
                       positional=True)
    out: str = option("runs/grid", "grid folder: a run folder per cell, grid.json, the summary (rerun to resume)",
                      role="out")
    ray: str | None = option(None, "run the cells as Ray tasks: auto (this machine's cluster, or a new local one) or "
                             "a cluster address; needs pip install 'vrh-interp[ray]' (default: every cell here, in "
                             "order)", metavar="auto|ADDRESS")
    yes: bool = option(False, "run a plan of more than 500 cells to run (grid_execution.CONFIRM_ABOVE) without asking")
    progress: bool = option(True, "progress lines", cli=False)

    def plan_faults(self) -> list[Callable[[], None]]:
        return [lambda: check_inputs(load_grid(self.grid))]


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


# ------------------------------------------------------------------------------------------- status file names
# (``check_plan`` refuses cells that would share one; ``grid_execution`` writes the files)

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
