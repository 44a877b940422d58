"""The built-in experiments' specs (``experiments.spec``): what ``vrh detect``, ``sweep``, ``scan``,
``design-space``, ``vqa-sweep``, ``transfer`` and ``patch`` take, and a grid's cells of them. Torch-free, like the
framework: the command line is built from these fields and every refusal comes before anything heavy loads. Each
experiment's runner (``run(spec, vlm, folder)``) is in its own module: ``experiments.detect``, ``sweep``,
``head_scan``, ``design_space``, ``vqa_sweep``, ``transfer``, ``patching_study``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from vrh_interp.core.execution.ablation_kinds import DEFAULT_ABLATION_KIND
from vrh_interp.experiments.spec import (ExperimentSpec, ablation_kinds, data_spec, head_spec, ks_spec,
                                         non_negative_int, option, positive_int, preset, scene_count, seed_list,
                                         unit_interval, vqa_spec)


def patch_metrics() -> tuple[str, ...]:
    from vrh_interp.patching.metrics import PATCH_METRICS  # data only: no torch

    return tuple(PATCH_METRICS)

DATA_HELP = ("synthetic:SPLIT:N, jsonl:PATH, refcoco:ROOT[:SPLIT], lmms-refcoco:DIR, toloka:CSV:IMAGES, ... "
             "(docs/datasets.md)")


@dataclass(frozen=True, kw_only=True)
class DetectSpec(ExperimentSpec):
    """What ``vrh detect`` takes: the detection samples and the scoring preset."""

    command: ClassVar[str] = "detect"

    data: str = option("synthetic:detect:200", DATA_HELP, parse=data_spec, role="data", grid="detect")
    preset: str = option("vrh", "scoring preset (vrh, retrieval_heads, qrhead, ...)", parse=preset)
    top: int = option(20, "how many of the best-scored heads to print (all are saved)", parse=positive_int)
    progress: bool = option(True, "progress bars", cli=False)



DEFAULT_KS = "0,1,3,5,10,20"
ABLATION_HELP = ("how masked heads are removed: zero (the paper's), mean (the head's mean output per position segment "
                 "over the detection samples) or resample (another detection sample's)")
DETECT_DATA_HELP = ("mean/resample ablation: the --data of the `vrh detect` run that wrote --scores (its samples are "
                    "the reference)")
LIVE_HELP = ("leave out the live-head control (random sets of the heads a census on the first evaluation samples "
             "finds acting; census.csv in --out)")


def needs_reference_values(kind: str) -> bool:
    """Whether ablation ``kind`` replaces heads by reference outputs (mean, resample) rather than zeroing them."""
    from vrh_interp.core.execution.ablation_kinds import ablation_method

    return ablation_method(kind).needs_reference_values


@dataclass(frozen=True, kw_only=True)
class SweepSpec(ExperimentSpec):
    """What ``vrh sweep`` takes: the evaluation samples, the ranking (a scores file or heads), the k grid, the
    control sets and the ablation."""

    command: ClassVar[str] = "sweep"

    data: str = option("synthetic:eval:200", DATA_HELP, parse=data_spec, role="data", grid="eval")
    scores: str | None = option(None, "scores JSON written by `vrh detect`", role="file", grid="scores",
                                group="ranking")
    vrhs: str | None = option(None, "a ranking given as heads instead: L19H17,L16H0,... or a published list, "
                              "published:MODEL/BENCHMARK, e.g. published:qwen2.5-vl-7b/refcoco", parse=head_spec,
                              group="ranking")
    ks: str | None = option(None, "k values: head counts and/or percentages of all heads, e.g. 0,1%%,2.5%%,5 (a "
                            "positive percentage is rounded half up to at least 1 head). Default: "
                            f"{DEFAULT_KS} without the k too large for this model's controls (a note names them)",
                            parse=ks_spec)
    random_sets: int = option(20, "control head sets per k and control kind (seeds 0 .. N-1)", parse=positive_int)
    seeds: str | None = option(None, "explicit control seeds, e.g. 0,1,2 (overrides --random-sets)",
                               parse=seed_list)
    matched: bool = option(True, "leave out the layer-matched control (only the uniform random sets)")
    live: bool = option(True, LIVE_HELP)
    iou: float = option(0.5, "an answer is correct when its box overlaps the referent's at IoU >= this",
                        parse=unit_interval)
    exclude_first_layer: bool = option(False, "random controls avoid layer 0")
    ablation: str = option(DEFAULT_ABLATION_KIND, ABLATION_HELP, choices=ablation_kinds)
    detect_data: str = option("synthetic:detect:200", DETECT_DATA_HELP, parse=data_spec, role="data",
                              grid="detect")
    max_batch_rows: int | None = option(None, "rows per forward pass at most", parse=positive_int, cli=False)
    census: str | None = option(None, "the folder of the head census (default: the run folder; a grid's shards "
                                "share one)", cli=False)
    progress: bool = option(True, "progress bars", cli=False)

    def reads(self, name: str) -> bool:
        return name != "detect_data" or needs_reference_values(self.ablation)

    def control_seeds(self) -> list[int]:
        """``seeds`` when given, else 0 .. ``random_sets`` - 1."""
        return [int(s) for s in self.seeds.split(",")] if self.seeds else list(range(self.random_sets))

    def plan_faults(self) -> list[Callable[[], None]]:
        from vrh_interp.experiments import spec_checks

        checks: list[Callable[[], None]] = []
        if self.ks is not None:
            checks.append(lambda: spec_checks.check_ks_fit(self.ks, self.model, self.flag("ks")))
        if self.vrhs is not None:
            from vrh_interp.core.description.published import parse_heads

            checks.append(lambda: spec_checks.check_heads_fit(parse_heads(self.vrhs), self.model,
                                                              f"--vrhs {self.vrhs}"))
        if self.scores is not None:
            checks.append(lambda: spec_checks.check_scores_disjoint(_sample_ids(self.scores), self.data,
                                                                    f"--scores {self.scores}", "--data"))
        elif needs_reference_values(self.ablation):
            checks.append(lambda: spec_checks.check_disjoint_specs(self.detect_data, self.data, "--detect-data",
                                                                   "--data"))
        return checks


def _sample_ids(path: str) -> list[str]:
    """The sample ids a scores file lists (none when it is not a scores file: ``HeadScores.load`` says so later)."""
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8")).get("sample_ids") or []
    except (OSError, ValueError, AttributeError):
        return []



@dataclass(frozen=True, kw_only=True)
class ScanSpec(ExperimentSpec):
    """What ``vrh scan`` takes: the scores, the fixed evaluation subset, the heads, the ablation (as the sweep's)."""

    command: ClassVar[str] = "scan"

    out: str = option("runs/scan", "run folder (rerun to resume)", role="out", grid="out")
    data: str = option("synthetic:eval:200", DATA_HELP, parse=data_spec, role="data", grid="eval")
    scores: str | None = option(None, "scores JSON written by `vrh detect`", role="file", grid="scores",
                                required=True)
    limit: int = option(100, "scan on the first N evaluation samples (a fixed subset; cost: (1 + heads) x N "
                        "answers)", parse=positive_int)
    heads: str | None = option(None, "heads to scan, e.g. L0H1,L3H5 (default: every head)", parse=head_spec)
    iou: float = SweepSpec.same_option("iou")
    ablation: str = SweepSpec.same_option("ablation")
    detect_data: str = SweepSpec.same_option("detect_data")
    progress: bool = option(True, "progress bars", cli=False)

    def reads(self, name: str) -> bool:
        return name != "detect_data" or SweepSpec.reads(self, name)



@dataclass(frozen=True, kw_only=True)
class DesignSpaceSpec(ExperimentSpec):
    """What ``vrh design-space`` takes: detection and evaluation samples (disjoint), k, the random sets, the
    ablation."""

    command: ClassVar[str] = "design-space"

    data: str = option("synthetic:detect:200", DATA_HELP, parse=data_spec, role="data", grid="detect")
    eval_data: str = option("synthetic:eval:200", "evaluation samples the masks are tested on (disjoint from --data, "
                            "which detects)", parse=data_spec, role="data", grid="eval")
    k: int = option(20, "heads masked per variant: each variant's top k", parse=positive_int)
    random_sets: int = option(20, "random sets of k heads (outside every variant's top-k) each variant is compared "
                              "with; 0: rank the variants without a random control", parse=non_negative_int)
    ablation: str = option(DEFAULT_ABLATION_KIND, ABLATION_HELP, choices=ablation_kinds)
    progress: bool = option(True, "progress bars", cli=False)

    def plan_faults(self) -> list[Any]:
        from vrh_interp.experiments.spec_checks import check_disjoint_specs

        return [lambda: check_disjoint_specs(self.data, self.eval_data, "--data", "--eval-data")]


@dataclass(frozen=True, kw_only=True)
class VQASweepSpec(ExperimentSpec):
    """What ``vrh vqa-sweep`` takes: the VQA benchmarks, the scores whose top ``vqa_k`` heads are masked, the
    control sets (the paper's Table 3 on one model; a grid's VQA cells)."""

    command: ClassVar[str] = "vqa-sweep"

    out: str = option("runs/vqa", "run folder (rerun to resume)", role="out", grid="out")
    vqa: tuple[str, ...] = option((), "VQA benchmark spec, repeatable: cvbench, mmstar, countbench, mathvista, "
                                  "spatial457, spatialrgpt, vaw, synthetic:eval:N", parse=vqa_spec, role="vqa",
                                  grid="vqa", repeat=True, metavar="NAME:PATH")
    scores: str | None = option(None, "scores JSON written by `vrh detect`", role="file", grid="scores",
                                required=True)
    vqa_k: int = option(20, "VRHs (and random heads) masked: the top k of --scores", parse=positive_int)
    random_sets: int = option(20, "control head sets of each kind (seeds 0 .. N-1)", parse=positive_int)
    matched: bool = option(True, "leave out the layer-matched control (only the uniform random sets)")
    limit: int | None = option(None, "the first N questions of each VQA benchmark", parse=positive_int)
    max_batch_rows: int | None = option(None, "rows per forward pass at most", parse=positive_int, cli=False)
    progress: bool = option(True, "progress bars", cli=False)

    def plan_faults(self) -> list[Callable[[], None]]:
        def some() -> None:
            if not self.vqa:
                raise ValueError("--vqa is required: name at least one VQA benchmark (e.g. --vqa synthetic:eval:20)")
        return [some]


@dataclass(frozen=True, kw_only=True)
class TransferSpec(ExperimentSpec):
    """What ``vrh transfer`` takes: two models sharing a backbone, each one's scores, the evaluation samples, the k
    grid and the random sets: each model masked with its own, the other's and random top-k (cross-masking)."""

    command: ClassVar[str] = "transfer"

    out: str = option("runs/transfer", "run folder (rerun to resume)", role="out", grid="out")
    partner: str | None = option(None, "the second model (sharing the backbone, on the same head grid)",
                                 role="model", grid="partner", required=True)
    data: str = option("synthetic:eval:200", DATA_HELP, parse=data_spec, role="data", grid="eval")
    scores: str | None = option(None, "scores JSON of --model (`vrh detect`)", role="file", grid="scores",
                                required=True)
    partner_scores: str | None = option(None, "scores JSON of --partner", role="file", grid="partner_scores",
                                        required=True)
    ks: str = option(DEFAULT_KS, "k values: head counts and/or percentages of all heads", parse=ks_spec)
    random_sets: int = option(20, "random head sets per k (seeds 0 .. N-1)", parse=positive_int)
    iou: float = SweepSpec.same_option("iou")
    labels: str = option("A,B", "the two models' names in the run folder (masked_in_A/, masked_in_B/)",
                         grid="labels")
    progress: bool = option(True, "progress bars", cli=False)

    def plan_faults(self) -> list[Callable[[], None]]:
        from vrh_interp.experiments import spec_checks

        def different() -> None:
            if self.partner == self.model:
                raise ValueError(f"--partner {self.partner!r} is --model: cross-masking a model with itself says "
                                 "nothing about transfer: name a second model sharing the backbone")
            if len(self.labels.split(",")) != 2 or len(set(self.labels.split(","))) != 2:
                raise ValueError(f"--labels {self.labels!r}: give two different names, e.g. A,B")
        return [different, lambda: spec_checks.check_ks_fit(self.ks, self.model, "--ks"),
                lambda: spec_checks.check_ks_fit(self.ks, self.partner or "", "--ks (on --partner)")]


@dataclass(frozen=True, kw_only=True)
class PatchSpec(ExperimentSpec):
    """What ``vrh patch`` takes: the heads (given, the top of a scores file, or detected here), the pairs, the
    probes, the control sets, the pair targets and the metric. The study runs only here (no ``--remote``) and
    only on nnsight (``operations``)."""

    command: ClassVar[str] = "patch"
    local_only: ClassVar[bool] = True
    operations: ClassVar[tuple[str, ...]] = ("patching",)

    out: str = option("runs/patching", "run folder (rerun to resume)", role="out", grid="out")
    vrhs: str | None = option(None, "heads to study, e.g. L2H6,L2H7 or published:MODEL/BENCHMARK (default: the top "
                              "--top of --scores, else detect them)", parse=head_spec)
    scores: str | None = option(None, "scores JSON (`vrh detect`) whose top --top heads are studied", role="file",
                                grid="scores")
    detect: int = option(200, "detection scenes (when neither --vrhs nor --scores is given)", parse=scene_count(1))
    top: int | None = option(None, "how many top-scored heads are the VRHs (default: the demo's k*, "
                             "experiments.ks.demo_ks)", parse=positive_int)
    pairs: int = option(48, "clean/corrupted pairs per kind (held-out eval scenes)", parse=scene_count(1))
    probe_scenes: int = option(120, "eval scenes for the linear probes", parse=scene_count(1))
    random_sets: int = option(20, "control seeds 0 .. N-1: one random and one layer-matched set each",
                              parse=positive_int)
    seeds: str | None = option(None, "explicit control seeds, e.g. 0,1,2 (overrides --random-sets)",
                               parse=seed_list)
    targets: str = option("greedy", "the two answers of a pair: the model's greedy answers, or the referents' "
                          "boxes", choices=("greedy", "ground_truth"))
    metric: str = option("answer", "answer: log-probability of the whole clean box vs the corrupted one (every "
                         "coordinate); first_token: logit difference at the first differing answer token only",
                         choices=patch_metrics)
    # what the study does not take (it sizes its own passes and runs only here)
    batch_size: int = option(16, "", cli=False)
    max_new_tokens: int = option(24, "", cli=False)
    shard: Any = option(None, "", cli=False)
    remote: Any = option(False, "", cli=False)
    progress: bool = option(True, "progress bars", cli=False)

    def control_seeds(self) -> list[int]:
        return [int(s) for s in self.seeds.split(",")] if self.seeds else list(range(self.random_sets))
