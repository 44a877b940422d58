"""The built-in experiments' specs (``experiments.spec``): what ``vrh detect``, ``sweep``, ``scan``,
``design-space``, ``vqa-sweep``, ``transfer``, ``reproduce``, ``patch``, ``localize`` and ``steer`` take, and a grid's
cells of them. Torch-free, like the framework: the command line is built from these fields and every refusal comes
before anything heavy loads. Each experiment's runner (``run(spec, vlm, folder)``) is in its own module:
``experiments.detect``, ``sweep``, ``head_scan``, ``design_space``, ``vqa_sweep``, ``transfer``, ``reproduce``,
``patching_study``, ``localize``, ``steer``."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from vrh_interp.core.execution.ablation_kinds import DEFAULT_ABLATION_KIND
from vrh_interp.experiments.spec import (ExperimentSpec, RunSpec, ablation_kinds, backends, data_spec, head_spec,
                                         ks_spec, non_negative_int, option, positive_int, preset, scene_count,
                                         seconds, seed_list, unit_interval, vqa_spec, whole_number)


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
    recorded_data: str | None = option(None, "the data as the run folder's manifest and the scores name it (default: "
                                       "--data); vrh reproduce names its whole benchmark, whose split its own "
                                       "manifest and split.json record", cli=False)
    progress: bool = option(True, "progress bars", cli=False)



DEFAULT_KS = "0,1,3,5,10,20"
ABLATION_HELP = ("how masked heads are removed: zero (the paper's), mean (the head's mean output per position segment "
                 "over the detection samples) or resample (another detection sample's)")
DETECT_DATA_HELP = ("mean/resample ablation: the --data of the `vrh detect` run that wrote --scores (its samples are "
                    "the reference)")
LIVE_HELP = ("leave out the live-head control (random sets of the heads a census on the first evaluation samples "
             "finds acting; census.csv in --out)")


def control_seeds(seeds: str | None, random_sets: int) -> list[int]:
    """The control-set seeds of a spec: ``--seeds`` when given, else 0 .. ``--random-sets`` - 1."""
    return [int(seed) for seed in seeds.split(",")] if seeds else list(range(random_sets))


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
    note_prefix: str | None = option(None, "where the census lines go: None, stderr (stdout holds the table or "
                                     "JSON); else stdout after this prefix (vrh reproduce's progress lines)", cli=False)
    progress: bool = option(True, "progress bars", cli=False)

    def reads(self, name: str) -> bool:
        return name != "detect_data" or needs_reference_values(self.ablation)

    def control_seeds(self) -> list[int]:
        return control_seeds(self.seeds, self.random_sets)

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
            ids = spec_checks.scores_sample_ids(self.scores)
            checks.append(lambda: spec_checks.check_scores_disjoint(ids, self.data, f"--scores {self.scores}",
                                                                    "--data"))
        elif needs_reference_values(self.ablation):
            checks.append(lambda: spec_checks.check_disjoint_specs(self.detect_data, self.data, "--detect-data",
                                                                   "--data"))
        return checks



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
    seeds: str | None = SweepSpec.same_option("seeds")
    matched: bool = option(True, "leave out the layer-matched control (only the uniform random sets)")
    limit: int | None = option(None, "the first N questions of each VQA benchmark", parse=positive_int)
    max_batch_rows: int | None = option(None, "rows per forward pass at most", parse=positive_int, cli=False)
    progress: bool = option(True, "progress bars", cli=False)

    def control_seeds(self) -> list[int]:
        return control_seeds(self.seeds, self.random_sets)

    def plan_faults(self) -> list[Callable[[], None]]:
        def some() -> None:
            if not self.vqa:
                raise ValueError("--vqa is required: name at least one VQA benchmark (e.g. --vqa synthetic:eval:20)")
        return [some]


@dataclass(frozen=True, kw_only=True)
class ReproduceSpec(ExperimentSpec):
    """What ``vrh reproduce`` takes: the grounding benchmark (split into detection and evaluation samples by the
    data's split options), the VQA benchmarks, the k grid, the control seeds and the VQA test's k: the paper's
    protocol in one run folder (``experiments.reproduce``), as its steps' specs (``steps``: ``DetectSpec``,
    ``SweepSpec``, ``VQASweepSpec``), all checked with it (``plan_faults``). Its progress lines go to stdout
    (``quiet_under_json``)."""

    command: ClassVar[str] = "reproduce"
    quiet_under_json: ClassVar[bool] = True

    out: str = option("runs/reproduce", "run folder (rerun to resume)", role="out")
    data: str | None = option(None, "grounding spec: refcoco:ROOT[:SPLIT], lmms-refcoco:DIR, toloka:CSV:IMAGES, "
                              "refspatial:PATH, ...", parse=data_spec, role="data", required=True)
    vqa: tuple[str, ...] = option((), "VQA benchmark spec, repeatable: cvbench, mmstar, countbench, mathvista, "
                                  "spatial457, spatialrgpt, vaw", parse=vqa_spec, role="vqa", repeat=True,
                                  metavar="NAME:PATH")
    detect: int = option(200, "seeded detection samples; the rest evaluate", parse=positive_int)
    eval: int | None = option(None, "evaluation samples (default: all the rest)", parse=positive_int)
    split_seed: int = option(0, "seed of the detection / evaluation split", parse=int)
    ks: str = option(DEFAULT_KS, "k values, capped at half the model's heads", parse=ks_spec)
    seeds: str = option("0,1,2", "random-control seeds", parse=seed_list)
    vqa_k: int = option(20, "VRHs (and random heads) masked on the VQA suite", parse=positive_int)
    vqa_limit: int | None = option(None, "first N questions of each VQA benchmark", parse=positive_int)
    live: bool = option(True, LIVE_HELP)
    progress: bool = option(True, "progress lines", cli=False)

    def head_counts(self) -> list[int]:
        """``ks`` as head counts (the protocol's k are counts, capped at half the model's heads when it runs)."""
        return [int(k) for k in self.ks.split(",") if k]

    def control_seeds(self) -> list[int]:
        return [int(seed) for seed in self.seeds.split(",") if seed]

    # ------------------------------------------------- the protocol as its steps' specs (``experiments.reproduce``)
    def part(self, role: str) -> str:
        """``--data`` narrowed to one part of its seeded split (``data.sources``' split options): the detection and
        the evaluation samples are disjoint by construction, whichever step reads them."""
        split = f"{self.data}:role={role}:detect={self.detect}:split_seed={self.split_seed}"
        return split + (f":eval={self.eval}" if self.eval is not None else "")

    def scores_file(self) -> str:
        """Where the run keeps the detection's scores (``out/scores-vrh.json``), the file the later steps read."""
        return str(Path(self.out) / "scores-vrh.json")

    def _step(self, folder: str) -> dict[str, Any]:
        """What every step takes from this spec: the model and where it runs, the batch and answer sizes, the
        progress lines, and its folder in ``out``."""
        return {"model": self.model, "device": self.device, "dtype": self.dtype, "batch_size": self.batch_size,
                "max_new_tokens": self.max_new_tokens, "remote": self.remote, "backend": self.backend,
                "progress": self.progress, "out": str(Path(self.out) / folder)}

    def detection(self) -> DetectSpec:
        """Step 2: the VRH scores on the detection part, unsharded (every shard detects in full, so all shards mask
        the same heads)."""
        return DetectSpec(**self._step("detect"), data=self.part("detection"), recorded_data=self.data, preset="vrh")

    def k_sweep(self, ks: str | None = None) -> SweepSpec:
        """Step 3: the k-sweep on the evaluation part, ranked by ``scores_file``; ``ks``: the k the scores allow
        (``experiments.reproduce``), None before the detection; the head census in ``out``."""
        return SweepSpec(**self._step("sweep"), shard=self.shard, data=self.part("evaluation"),
                         scores=self.scores_file(), ks=ks, seeds=self.seeds, live=self.live, census=self.out,
                         note_prefix="      ")

    def vqa_test(self, vqa_k: int | None = None) -> VQASweepSpec | None:
        """Step 5 (None without ``vqa``): the top ``vqa_k`` heads (capped like k once the scores are known) against as
        many random heads, the same control seeds, the first ``vqa_limit`` questions of each benchmark."""
        if not self.vqa:
            return None
        return VQASweepSpec(**self._step("vqa"), shard=self.shard, vqa=self.vqa, scores=self.scores_file(),
                            vqa_k=self.vqa_k if vqa_k is None else vqa_k, seeds=self.seeds, limit=self.vqa_limit)

    def steps(self) -> list[ExperimentSpec]:
        """The plan, as far as it is known before the detection (the sweep's and the VQA test's k follow from its
        scores, which ``Spec.check(pending=("scores",))`` leaves for then)."""
        return [step for step in (self.detection(), self.k_sweep(), self.vqa_test()) if step is not None]

    def plan_faults(self) -> list[Callable[[], None]]:
        def plan() -> None:
            from vrh_interp.data.sources import SPLIT_OPTIONS, data_part

            if data_part(self.data)[1] is not None:
                raise ValueError(f"--data {self.data}: vrh reproduce splits the benchmark itself (--detect, --eval, "
                                 f"--split-seed): pass it without {', '.join(f'{n}=' for n in SPLIT_OPTIONS)}")
            for step in self.steps():
                step.check(pending=("scores",))

        return [self.head_counts, plan]  # a percentage (--ks 1%) is refused here, before the model loads


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
        return control_seeds(self.seeds, self.random_sets)


COMPONENTS = ("largest", "peak", "full")  # evaluation.attention_box.COMPONENTS (not imported: it loads torch)
BLOCKS = ("all", "grid")
QUERIES = ("last_input", "output")


def sigma(text: str) -> float:
    """A smoothing width in canvas cells, 0 (none) to 100."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and 0 <= value <= 100):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a smoothing width between 0 (none) and 100 cells")
    return value


def threshold(text: str) -> str:
    """``mean`` or a quantile strictly between 0 and 1, kept as text."""
    if text.strip().lower() == "mean":
        return "mean"
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is neither 'mean' nor a quantile strictly between 0 and 1, "
                                         "e.g. 0.9")
    return text


@dataclass(frozen=True, kw_only=True)
class LocalizeSpec(ExperimentSpec):
    """What ``vrh localize`` takes: the head set (``--heads``, the top ``--k`` of ``--scores``, else of a detection
    run here with ``--preset`` on ``--detect-data``), the items and the readout of the attention box."""

    command: ClassVar[str] = "localize"
    quiet_under_json: ClassVar[bool] = True

    out: str = option("runs/localize", "run folder (rerun to resume)", role="out", grid="out")
    data: str = option("synthetic:eval:40", DATA_HELP, parse=data_spec, role="data", grid="eval")
    heads: str | None = option(None, "the head set, e.g. L2H6,L2H7 or published:MODEL/BENCHMARK (default: the top --k "
                               "of --scores or of a detection run here)", parse=head_spec)
    scores: str | None = option(None, "scores JSON written by `vrh detect`: its top --k are the heads", role="file",
                                grid="scores")
    preset: str = option("vrh", "without --heads or --scores: the scoring preset of the detection run here (vrh, "
                         "localization_heads, ...)", parse=preset)
    k: int = option(3, "how many top-scored heads form the set", parse=positive_int)
    detection_data: str = option("synthetic:detect:40", "without --heads or --scores: the detection samples "
                                 "(disjoint from --data)", parse=data_spec, role="data", flag="--detect-data",
                                 grid="detect")
    sigma: float = option(1.0, "Gaussian smoothing of the attention map, in cells", parse=sigma)
    threshold: str = option("mean", "cells above the map's mean (Localization Heads) or above this quantile, e.g. "
                            "0.9", parse=threshold)
    component: str = option("largest", "which cells above the threshold the box encloses: the largest 8-connected "
                            "component, the one holding the peak, or all of them", choices=COMPONENTS)
    blocks: str = option("all", "tiled layouts: paint every block (base view and tiles) or only the whole-image "
                         "grid", choices=BLOCKS)
    query: str = option("last_input", "the attention rows read: the last prompt token's, or the mean over the "
                        "model's answer rows", choices=QUERIES)
    iou: float = SweepSpec.same_option("iou")
    progress: bool = option(True, "progress bars", cli=False)

    def reads(self, name: str) -> bool:
        return name != "detection_data" or (self.heads is None and self.scores is None)

    def plan_faults(self) -> list[Callable[[], None]]:
        from vrh_interp.experiments import spec_checks

        def whole() -> None:
            if self.shard is not None:
                raise ValueError("vrh localize runs unsharded: leave out --shard")
            if self.heads is not None and self.scores is not None:
                raise ValueError("give --heads or --scores, not both")
        checks = [whole]
        if self.heads is not None:
            from vrh_interp.core.description.published import parse_heads

            checks.append(lambda: spec_checks.check_heads_fit(parse_heads(self.heads), self.model,
                                                              f"--heads {self.heads}"))
        elif self.scores is None:
            checks.append(lambda: spec_checks.check_disjoint_specs(self.detection_data, self.data, "--detect-data",
                                                                   "--data"))
        return checks


def alphas(text: str) -> tuple[float, ...]:
    """Bias strengths: distinct finite numbers >= 0 that include 0 (the unsteered run)."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"alphas are numbers separated by commas, e.g. 0,2,4,8,16; got {text!r}")
    if not values or 0.0 not in values or any(v < 0 or not math.isfinite(v) for v in values) \
            or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"alphas must be distinct finite numbers >= 0 and include 0 (the "
                                         f"unsteered run), got {text!r}")
    return values


def seed_tuple(text: str) -> tuple[int, ...]:
    """Distinct whole-number seeds >= 0, ``0,1,2``."""
    return tuple(int(part) for part in seed_list(text).split(","))


@dataclass(frozen=True, kw_only=True)
class SteerSpec(ExperimentSpec):
    """What ``vrh steer`` takes: the heads redirected (the detected top ``--k``, or ``--heads``), the bias strengths,
    the items, the control sets, the sequential rank test and the activation-patching form. Redirection runs on
    nnsight only (``operations``)."""

    command: ClassVar[str] = "steer"
    quiet_under_json: ClassVar[bool] = True

    model: str = option("toy:planted", "hub id, local folder, toy:NAME or tiny:FAMILY", role="model", grid="model")
    out: str = option("runs/steer", "run folder (rerun to resume)", role="out", grid="out")
    k: int = option(3, "how many top-scored heads are redirected", parse=positive_int)
    alphas: tuple[float, ...] = option((0.0, 2.0, 4.0, 8.0, 16.0), "bias strengths (the claim is judged at the "
                                       "largest)", parse=alphas)
    items: int = option(40, "evaluation items (scenes with two referable objects; the target is the other one)",
                        parse=scene_count(1))
    detect: int = option(20, "detection scenes that rank the heads", parse=scene_count(1))
    seeds: tuple[int, ...] = option((0, 1, 2, 3, 4), "dose-response control seeds: one random, one layer-matched and "
                                    "one live-head set each, redirected at every alpha (default 0-4; the rank test "
                                    "draws its own sets)", parse=seed_tuple)
    rank_sets: int = option(199, "the sequential rank test's most control sets per kind at the claim's alpha (drawn "
                            "in blocks of 20, 40, 80, ...; stopped early once 5 sets move as many answers as the "
                            "top-k; p reaches 1/(N+1); 0: rank the dose-response sets instead)",
                            parse=whole_number(0, 10_000))
    rank_items: int = option(12, "the rank test's fixed items", parse=scene_count(1))
    heads: str | None = option(None, "redirect these heads (e.g. L1H4,L0H3) instead of the detected top-k: no "
                               "detection pass, k is their number (a random set here is the claim's calibration: it "
                               "must not hold)")
    matched: bool = option(True, "leave the layer-matched control out")
    live: bool = option(True, "leave the live-head control out (no head census)")
    patching: bool = option(True, "leave the activation-patching form out")
    patch_seeds: int = option(5, "control sets of each kind in the patching form (the first seeds)",
                              parse=positive_int)
    batch_size: int = option(32, "items per batch", parse=positive_int)
    max_rows: int = option(512, "rows per generation (items x conditions redirected together)", parse=positive_int)
    backend: str = option("nnsight", "what runs the model: redirection runs on nnsight only (the transformer-lens "
                          "backend is refused before the model loads)", choices=backends)
    # what redirection does not take
    max_new_tokens: int = option(24, "", cli=False)
    shard: Any = option(None, "", cli=False)
    remote: Any = option(False, "", cli=False)
    progress: bool = option(True, "progress lines", cli=False)

    @property
    def operations(self) -> tuple[str, ...]:
        return ("steering", "patching") if self.patching else ("steering",)


MODEL_PAIRS = {"toy:a": "toy:b", "toy:b": "toy:a", "toy:c": "toy:d", "toy:d": "toy:c"}  # the demo's transfer partners


def shipped(spec: str) -> bool:
    """A toy model whose checkpoint is in this installation (any non-toy spec counts as available)."""
    if not spec.startswith("toy:"):
        return True
    from vrh_interp.toy.names import FAMILIES, is_shipped

    name = spec.split(":", 1)[1]
    return name in FAMILIES and is_shipped(name)


@dataclass(frozen=True, kw_only=True)
class DemoSpec(RunSpec):
    """What ``vrh demo`` takes (``experiments.demo``): the main and transfer models, the seed, the optional cap, and
    the fixed sizes (None: ``demo_plan.DEFAULT_SIZES``). It loads its own models (the positive control's first)."""

    command: ClassVar[str] = "demo"

    model: str | None = option(None, "main model (default: toy:c, 128 heads, where its checkpoint is shipped, else "
                               "toy:a; toy:a and toy:b stay selectable by name)", role="model")
    transfer_model: str = option("auto", "second model sharing the backbone (default: the main model's partner, "
                                 "toy:d for toy:c, toy:b for toy:a; '' to skip)", role="model", keywords=("auto",))
    out: str = option("runs/demo", "run folder (rerun to resume)", role="out")
    budget_seconds: float | None = option(None, "optional cap on the whole demo: steps not begun by then are skipped "
                                          "and their claims read 'inconclusive'. Default: no cap; the sizes are "
                                          "fixed, never chosen from a clock", parse=seconds)
    seed: int = option(0, "seed of the control-set draws, the scan's head sample and the bootstrap (default 0)",
                       parse=non_negative_int)
    detect_scenes: int | None = option(None, "detection scenes (default 200)", parse=scene_count(1),
                                       aliases=("--detect",))
    eval_scenes: int | None = option(None, "evaluation scenes (disjoint from detection); every referent is an item "
                                     "(default 40 scenes, 132 items)", parse=scene_count(1), aliases=("--eval",))
    random_sets: int | None = option(None, "control head sets of each kind (uniform, layer-matched, live heads) "
                                     "answered on every item in the design-space, transfer and VQA steps (default "
                                     "20; the k-sweep draws one fresh set of each kind per scene instead)",
                                     parse=positive_int)
    rank_sets: int | None = option(None, "the rank test's control sets of each kind at k* (default 199: 1/200 is "
                                   "under 0.05/8, the paper family's Bonferroni level; drawn in blocks of 20, 40, 80, "
                                   "..., stopped once 5 are as harmful as the top-k, each set answered only until "
                                   "that is decided; 0: no rank test, so the causal claim cannot hold)",
                                   parse=non_negative_int)
    rank_items: int | None = option(None, "items the rank test's sets are answered on (default 12, spread over the "
                                    "scenes)", parse=positive_int)
    check_items: int | None = option(None, "fixed evaluation items for the ablation-kind check, head scan, design "
                                     "space, cross-masking (default 40)", parse=positive_int)
    vqa_scenes: int | None = option(None, "eval scenes whose VQA questions are asked (default 20)",
                                    parse=scene_count(0))
    control_scenes: int | None = option(None, "evaluation scenes of the positive control on toy:planted (default 30)",
                                        parse=scene_count(0))
    batch_size: int = option(256, "rows per forward pass", parse=positive_int)
    positive_control: bool = option(True, "skip step 1, the positive control on toy:planted")
    device: str | None = ExperimentSpec.same_option("device")
    dtype: str | None = ExperimentSpec.same_option("dtype")
    backend: str = ExperimentSpec.same_option("backend")
    overlay_items: int = option(3, "attention overlays of the top heads in the report", cli=False)

    def sizes(self) -> dict[str, int]:
        """The sizes given (the rest are ``demo_plan.DEFAULT_SIZES``')."""
        names = ("detect_scenes", "eval_scenes", "check_items", "vqa_scenes", "control_scenes", "random_sets",
                 "rank_sets", "rank_items")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def main_model(self) -> str:
        """``model``, or by default ``toy:c`` where shipped, else ``toy:a`` (no torch: a plan fault reads it)."""
        if self.model is not None:
            return self.model
        return "toy:c" if shipped("toy:c") else "toy:a"

    def models(self) -> tuple[str, str | None, str]:
        """``(main, transfer, why)``: the ``main_model``; ``transfer_model`` "auto" means the main model's partner
        (``MODEL_PAIRS``), "" no transfer."""
        main = self.main_model()
        if self.model is not None:
            why = "--model"
        elif main == "toy:c":
            from vrh_interp.toy import regime_status

            why = f"toy:c is shipped ({regime_status('c')}; the head census below says which act)"
        else:
            why = "toy:c is not shipped in this installation, so the 32-head toy:a"
        if self.transfer_model == "auto":
            transfer = MODEL_PAIRS.get(main)
            why += f"; transfer to {transfer}" if transfer else "; no known partner: transfer not measured"
        elif self.transfer_model:
            transfer, why = self.transfer_model, why + f"; transfer to {self.transfer_model} (--transfer-model)"
        else:
            transfer, why = None, why + "; transfer skipped (--transfer-model '')"
        return main, transfer, why

    def plan_faults(self) -> list[Callable[[], None]]:
        """A transfer model equal to the main model (the model cross-masked with itself reads as transfer); one that
        cannot load is a fault of its own (``role="model"``). A default partner that is not shipped is skipped with a
        word instead."""
        def same() -> None:
            main = self.main_model()
            if self.transfer_model == main:
                raise ValueError(f"--transfer-model {main!r} is the main model: cross-masking a model with itself "
                                 "says nothing about transfer: pass a second model sharing the backbone, or '' to "
                                 "skip transfer")

        return [same]
