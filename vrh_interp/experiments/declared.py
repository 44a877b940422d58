"""Every experiment declared once: what its run folders hold, how they resume and merge, what the CLI offers.

An ``Experiment`` names, in one place, what the rest of the package used to spell out in several: the ``kind`` its
run folders' manifests write (``name``), its ``vrh`` subcommand, its record log (file stem and the fields naming
a record's unit, which a resumed run skips and a re-read de-duplicates), the canonical order of its records (what
a merge of shards restores), whether its folders resume and merge, the function that reads a finished folder
into its result (``summary``), its spec, runner and printout, and where it appears in a grid and in the demo. A
claim names the experiment that measures it in its own declaration (``evaluation.claims.ClaimSpec.experiment``).
Run folders (``record_log``), ``experiments.merge``, the CLI (resume hints, run locks, subcommands), the grid,
the demo and the tests read the declarations; ``vrh_interp.core`` knows no experiment's name.

This module is imported by ``vrh --help``: it holds data and imports nothing heavy. The built-in declarations name
their functions as ``"module:function"`` text (``Experiment.resolve``), imported only when used, in the
experiments layer or below (``tests/test_experiments_declared.py`` checks); a declaration may also hold the
functions themselves.

Adding an experiment is one module: a spec (``experiments.spec``: everything a run takes, checked whole before any
work), a runner ``run(spec, vlm, folder)`` that writes a run folder (``core.bookkeeping.runs.RunFolder``, its log
opened with ``Experiment.open_log``), and one ``register(Experiment(...))`` call. Declared with ``command``, ``spec``
and ``run``, it is a ``vrh`` subcommand whose options come from the spec's fields; with ``grid`` a GRID.toml
experiment (a cell per model x grounding benchmark, say, the spec read from ``[options]`` and ``[NAME]``);
with ``demo`` a step of ``vrh demo``. ``resumable``: its ``--out`` is held under the folder's lock and an interrupted
run names the command that resumes it; ``mergeable``: ``vrh merge`` joins its shard folders. docs/architecture.md,
"Adding an experiment", shows one end to end.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

if TYPE_CHECKING:
    from vrh_interp.core.bookkeeping.runs import RecordLog, RunFolder

Reference = Union[str, Callable[..., Any]]  # a function, or its "module:function" name
# what a GRID.toml experiment's cells are: one per model x grounding benchmark, per model x [vqa.NAME] benchmark,
# per model (its heads from [NAME] heads_from), per [[transfer]] pair of models
GRID_SHAPES = (None, "benchmark", "vqa", "model", "pair")


@dataclass(frozen=True)
class Experiment:
    """One experiment's declaration (see the module doc).

    ``order``: the fields of a record in the order an unsharded run appends them, outermost first; the last is
    the sample (its values in the manifest's order, ``samples``), the others in the order shard 0's log first
    records them. ``samples``: the manifest entry holding the sample ids, a list, or a mapping by ``samples_by``
    (one of ``order``). ``listed``: (field, manifest entry) pairs whose every value must appear in shard 0's log
    before a merge (a condition nothing was recorded for yet means an unfinished shard). ``merge_files``:
    ``"module:function(staging, shard_folders)"`` copying what a mergeable run keeps beside its log. ``merge``:
    ``"module:function(out, shard_folders, options) -> exit status"``, ``vrh merge`` of its shard folders: joined,
    then what the unsharded command writes and prints (``apps.merging``; a ``mergeable`` experiment without one
    gets its records joined and counted). Its shard folders are known by their manifest's kind, or, where a shard
    keeps its records in a subfolder and no manifest above it, by ``shards_in``, that subfolder (``design_space``).
    ``spec``: its spec class (``experiments.spec``); ``run``: ``"module:function(spec, vlm, folder) -> result"``
    (``vlm`` is None for a spec that loads no model); ``show``: ``"module:function(result, spec, as_json) -> exit
    status"``, what the command prints. ``grid``: a GRID.toml experiment whose cells are one of ``GRID_SHAPES``
    (each cell's spec filled by ``experiments.grid.cell_spec``). ``demo``: ``"module:function(run)"``, a step of
    ``vrh demo`` (``experiments.demo_plan.DemoRun``), placed by ``demo_order``; its claims (``evaluation.claims``,
    those naming this experiment) read inconclusive when a ``--budget-seconds`` cap skips it.
    """

    name: str
    command: str | None = None
    help: str = ""
    log: str | None = None
    record_key: tuple[str, ...] = ()
    order: tuple[str, ...] = ()
    samples: str = "sample_ids"
    samples_by: str | None = None
    listed: tuple[tuple[str, str], ...] = ()
    resumable: bool = False
    mergeable: bool = False
    merge_files: Reference | None = None
    merge: Reference | None = None
    shards_in: str | None = None
    summary: Reference | None = None
    spec: Reference | None = None
    run: Reference | None = None
    show: Reference | None = None
    grid: str | None = None
    demo: Reference | None = None
    demo_order: float = 0.0

    def __post_init__(self) -> None:
        if self.log is not None and not self.record_key:
            raise ValueError(f"experiment {self.name!r}: a record log ({self.log!r}) needs its record_key")
        if self.mergeable and (self.log is None or not self.order or not set(self.order) >= set(self.record_key)):
            raise ValueError(f"experiment {self.name!r}: merging needs a record log and an order naming every "
                             "field of the record key")
        if (self.spec is None) != (self.run is None):
            raise ValueError(f"experiment {self.name!r}: a spec needs its runner and a runner its spec")
        if self.grid not in GRID_SHAPES:
            raise ValueError(f"experiment {self.name!r}: grid = {self.grid!r}: the grid's cells are one of "
                             f"{', '.join(map(repr, GRID_SHAPES[1:]))}")

    def resolve(self, field: str) -> Any:
        """The function ``field`` holds, or names as ``"module:function"`` (imported now)."""
        reference = getattr(self, field)
        if reference is None:
            raise ValueError(f"experiment {self.name!r} declares no {field}")
        if callable(reference):
            return reference
        module, _, attribute = reference.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def log_path(self, run_dir: str | os.PathLike[str]) -> Path:
        """Where a run folder of this experiment keeps its record log."""
        if self.log is None:
            raise ValueError(f"experiment {self.name!r} declares no record log")
        return Path(run_dir) / f"{self.log}.jsonl"

    def read_log(self, run_dir: str | os.PathLike[str]) -> RecordLog:
        """The record log of ``run_dir``, keyed by ``record_key``, for reading (``.read()``)."""
        from vrh_interp.core.bookkeeping.runs import RecordLog

        return RecordLog(self.log_path(run_dir), key_fields=self.record_key)

    def open_log(self, folder: RunFolder) -> RecordLog:
        """The record log of ``folder``, keyed by ``record_key``, for the run holding its lock (a torn last line
        repaired)."""
        if self.log is None:
            raise ValueError(f"experiment {self.name!r} declares no record log")
        return folder.log(self.log, key_fields=self.record_key)


_SPECS = "vrh_interp.experiments.builtin_specs"

BUILTIN: tuple[Experiment, ...] = (
    Experiment("detect", "detect", "score every head on grounding samples", log="detect_records",
               record_key=("sample_id",), order=("sample_id",), resumable=True, mergeable=True,
               merge_files="vrh_interp.experiments.merge:copy_detect_stats", merge="vrh_interp.apps.merging:detect",
               summary="vrh_interp.scoring.detect:scores_from_run", spec=f"{_SPECS}:DetectSpec",
               run="vrh_interp.experiments.detect:run", show="vrh_interp.apps.show:detect", grid="benchmark",
               demo="vrh_interp.experiments.detect:demo_step", demo_order=2),
    Experiment("sweep", "sweep", "mask top-k vs random heads and measure grounding", log="sweep_records",
               record_key=("sample_id", "condition"), order=("condition", "sample_id"),
               listed=(("condition", "conditions"),), resumable=True, mergeable=True,
               merge="vrh_interp.apps.merging:sweep",
               summary="vrh_interp.experiments.sweep:sweep_from_run", spec=f"{_SPECS}:SweepSpec",
               run="vrh_interp.experiments.sweep:run", show="vrh_interp.apps.show:sweep", grid="benchmark",
               demo="vrh_interp.experiments.designs:sweep_step", demo_order=3),
    Experiment("vqa_sweep", "vqa-sweep", "mask top-k vs random heads and measure VQA accuracy", log="vqa_records",
               record_key=("benchmark", "sample_id", "condition"), order=("condition", "benchmark", "sample_id"),
               samples="samples", samples_by="benchmark",
               listed=(("condition", "conditions"), ("benchmark", "samples")),
               resumable=True, mergeable=True, merge="vrh_interp.apps.merging:vqa_sweep",
               summary="vrh_interp.experiments.vqa_sweep:vqa_sweep_from_run",
               spec=f"{_SPECS}:VQASweepSpec", run="vrh_interp.experiments.vqa_sweep:run",
               show="vrh_interp.apps.show:vqa_sweep", grid="vqa",
               demo="vrh_interp.experiments.designs:vqa_step", demo_order=9),
    Experiment("scan", "scan", "single-head causal scan: each head masked alone; does its score predict damage?",
               resumable=True, summary="vrh_interp.experiments.head_scan:head_scan_from_run",
               spec=f"{_SPECS}:ScanSpec", run="vrh_interp.experiments.head_scan:run",
               show="vrh_interp.apps.show:scan", grid="benchmark",
               demo="vrh_interp.experiments.head_scan:demo_step", demo_order=5),
    Experiment("design_space", "design-space", "rank the scoring variants by the drop their top-k causes",
               resumable=True, summary="vrh_interp.experiments.design_space:design_space_from_run",
               spec=f"{_SPECS}:DesignSpaceSpec", merge="vrh_interp.apps.merging:design_space",
               shards_in="design_space",
               run="vrh_interp.experiments.design_space:run", show="vrh_interp.apps.show:design_space",
               grid="benchmark", demo="vrh_interp.experiments.design_space:demo_step", demo_order=6),
    Experiment("ablation_kinds", None, "the causal claim at k* under every ablation kind (zero, mean, resample)",
               demo="vrh_interp.experiments.ablation_check:demo_step", demo_order=4),
    Experiment("sparsity", None, "sparsity and stability of the detection scores",
               demo="vrh_interp.experiments.design_space:sparsity_step",
               demo_order=7),
    Experiment("transfer", "transfer", "cross-masking: each model masked with its own, the other's and random top-k "
               "(a shared backbone)", resumable=True, spec=f"{_SPECS}:TransferSpec",
               run="vrh_interp.experiments.transfer:run", show="vrh_interp.apps.show:transfer", grid="pair",
               demo="vrh_interp.experiments.transfer:demo_step", demo_order=8),
    Experiment("positive_control", None, "the pipeline on toy:planted, whose retrieval heads are known",
               demo="vrh_interp.experiments.positive_control:demo_step", demo_order=1),
    Experiment("reproduce", "reproduce",
               "the paper's protocol on benchmark files: detect, k-sweep, failure split, VQA", resumable=True,
               merge="vrh_interp.apps.merging:reproduce",
               spec=f"{_SPECS}:ReproduceSpec", run="vrh_interp.experiments.reproduce:run",
               show="vrh_interp.apps.show:reproduce"),
    Experiment("demo", "demo", "the whole pipeline on the shipped toy model (no network), at fixed sizes",
               resumable=True, spec=f"{_SPECS}:DemoSpec", run="vrh_interp.experiments.demo:run",
               show="vrh_interp.apps.show:demo"),
    Experiment("patch", "patch", "activation patching: what the VRHs read out and write (synthetic pairs)",
               resumable=True, spec=f"{_SPECS}:PatchSpec", run="vrh_interp.experiments.patching_study:run",
               show="vrh_interp.apps.show:patch", grid="model"),
    Experiment("localize", "localize",
               "attention boxes of a head set beside the model's own boxes on the same items (Acc@0.5, four-way)",
               log="localize_records", record_key=("heads", "sample_id"), order=("heads", "sample_id"),
               resumable=True, summary="vrh_interp.experiments.localize:localize_from_run",
               spec=f"{_SPECS}:LocalizeSpec", run="vrh_interp.experiments.localize:run",
               show="vrh_interp.apps.show:localize", grid="benchmark"),
    Experiment("steer", "steer", "redirect the top-k heads onto another object: does the answer move there?",
               log="steer_records", record_key=("condition", "sample_id"), order=("condition", "sample_id"),
               resumable=True, summary="vrh_interp.experiments.steer:steer_from_run", spec=f"{_SPECS}:SteerSpec",
               run="vrh_interp.experiments.steer:run", show="vrh_interp.apps.show:steer", grid="model"),
    Experiment("grid", "grid", "models x benchmarks x experiments from GRID.toml, here or on a Ray cluster",
               resumable=True, spec="vrh_interp.experiments.grid:GridRunSpec",
               run="vrh_interp.experiments.grid_execution:run", show="vrh_interp.apps.show:grid"),
)

_REGISTRY: dict[str, Experiment] = {experiment.name: experiment for experiment in BUILTIN}


def register(experiment: Experiment) -> Experiment:
    """Declare ``experiment`` (returned, to keep as a module constant); its name, command and record log must be
    new (``ValueError`` naming the declaration that has them)."""
    for other in _REGISTRY.values():
        for field in ("name", "command", "log"):
            value = getattr(experiment, field)
            if value is not None and value == getattr(other, field):
                raise ValueError(f"experiment {experiment.name!r}: {field} {value!r} is already declared by "
                                 f"{other.name!r}")
    _REGISTRY[experiment.name] = experiment
    return experiment


def unregister(name: str) -> None:
    """Remove the declaration ``name`` (a test's, or a plug-in's being unloaded)."""
    del _REGISTRY[name]


def experiments() -> tuple[Experiment, ...]:
    """Every declaration, built-in ones first, then in the order they were registered."""
    return tuple(_REGISTRY.values())


def experiment(name: str) -> Experiment:
    """The declaration ``name`` (a run folder's manifest ``kind``); ``KeyError`` listing the declared ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no experiment {name!r} is declared; declared: {', '.join(_REGISTRY)}") from None


def by_command(command: str) -> Experiment | None:
    """The declaration of ``vrh COMMAND``, None when the command runs no experiment (e.g. ``merge``)."""
    return next((e for e in _REGISTRY.values() if e.command == command), None)


def by_log(stem: str) -> Experiment | None:
    """The declaration whose record log is ``STEM.jsonl``."""
    return next((e for e in _REGISTRY.values() if e.log == stem), None)


def resumable_commands() -> tuple[str, ...]:
    """The commands whose ``--out`` is a run folder that the same command resumes."""
    return tuple(e.command for e in _REGISTRY.values() if e.resumable and e.command is not None)


def mergeable() -> tuple[Experiment, ...]:
    """The experiments whose shard folders ``experiments.merge.merge_runs`` joins."""
    return tuple(e for e in _REGISTRY.values() if e.mergeable)


def merged_commands() -> tuple[str, ...]:
    """The commands whose shard folders ``vrh merge`` joins."""
    return tuple(e.command for e in _REGISTRY.values() if (e.mergeable or e.merge) and e.command is not None)


def record_key(path: str | os.PathLike[str]) -> tuple[str, ...] | None:
    """The fields naming a record's unit in the log at ``path`` (by its file stem), None for a log no experiment
    declares (keyed by its whole record)."""
    declared = by_log(Path(path).stem)
    return None if declared is None else declared.record_key


def record_log(path: str | os.PathLike[str], *, repair: bool = False) -> RecordLog:
    """The record log at ``path`` keyed as its experiment declares (``record_key``)."""
    from vrh_interp.core.bookkeeping.runs import RecordLog

    return RecordLog(Path(path), key_fields=record_key(path), repair=repair)


def spec_commands() -> tuple[Experiment, ...]:
    """Declarations whose ``vrh`` subcommand is made from their spec (``spec``, ``run``, ``show``)."""
    return tuple(e for e in _REGISTRY.values() if e.command is not None and e.spec is not None)


def grid_experiments() -> tuple[Experiment, ...]:
    """Declarations a GRID.toml may name by their name, with a cell per model x grounding benchmark."""
    return tuple(e for e in _REGISTRY.values() if e.grid is not None)


def demo_steps() -> tuple[Experiment, ...]:
    """Declarations with a step in ``vrh demo``, in ``demo_order``."""
    return tuple(sorted((e for e in _REGISTRY.values() if e.demo is not None), key=lambda e: e.demo_order))

