"""``vrh demo``: the paper's protocol end to end on a (toy) model, on CPU, next to a positive control.

Steps (each writes its records into the run folder, so rerunning resumes):

1. positive control: the same detection and causal sweep on ``toy:planted``, whose retrieval heads are known;
2. detection on ``detect_scenes`` held-out scenes (one referent per scene), scores of the paper's design, and the
   head census (``evaluation.census``: which heads measurably act; the pool of the live-head control);
3. the causal k-sweep on every referent of ``eval_scenes`` evaluation scenes (disjoint from detection): at k*
   ``random_sets`` sets of each control kind (uniform, layer-matched, live heads), ``curve_sets`` of each at the
   grid's other k (the k-curve claim pools them over k);
4. the causal claim at k* again under mean and resample ablation, on ``check_items`` fixed items;
5. the single-head causal scan (every head, or on models over 48 heads the top k* and a random sample);
6. design space, 7. sparsity and stability, 8. transfer to a second model sharing the backbone (cross-masking),
9. cross-task VQA, 10. attention overlays of the top heads and the report.

k (``demo_ks``): the grid 0.5, 1, 1.7, 2.6, 5 and 10 % of all heads, capped at a quarter of the heads; claims are
judged at k*, the count inside the paper's 1.7-2.6 % nearest 2.15 % (at least 1 head).

Sizes are FIXED (``DEFAULT_SIZES``), never chosen from a clock: the same command prints the same table on any
machine (``--seed`` moves only the control-set draws, the scan's head sample and the bootstrap). Verdicts come from
the one claims module (``evaluation.claims``: holds / does not hold / inconclusive, Holm over each table), with the
evidence computed per item from the run's records (``experiments.verdicts``). ``--budget-seconds`` optionally caps
the work: steps not begun by then are skipped, and their claims read "inconclusive" (never another verdict).
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from vrh_interp.core.backends.base import Backend
from vrh_interp.core.backends.select import get_backend
from vrh_interp.core.provenance import library_versions, model_provenance, now_utc
from vrh_interp.apps.report import read_grading, write_report
from vrh_interp.evaluation.claims import Evidence, claims_text, judge
from vrh_interp.experiments import verdicts as ev
from vrh_interp.experiments.sweep import CONTROL_KINDS, Condition, SweepResult, parse_ks, run_conditions, \
    sweep_conditions
from vrh_interp.experiments.design_space import design_space, stability, token_choice_stability
from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.experiments.transfer import compare_scores, cross_masking, masking_drops, same_grid

ANSWER_TOKENS = 24
PAPER_FRACTION_RANGE = (0.017, 0.026)  # 20 of 1152 .. 20 of 784 heads
DEMO_GRID = ("0.5%", "1%", "1.7%", "2.6%", "5%", "10%")
TERMINAL_WIDTH = 100
STEPS = 10
PLAN_FILE = "plan.json"
SEED_STRIDE = 1000  # --seed s draws control sets with seeds s*1000 .. s*1000 + sets - 1
ANSWERS_VQA_MARGIN = 0.1  # a VQA kind counts as answered when the unmasked model beats the majority answer by this
SCAN_ALL_HEADS, SCAN_SAMPLED_HEADS = 48, 32
CONTROL_DETECT_SCENES = 20
# with --backend transformer-lens: what runs on it, and what stays on nnsight and why (printed, and in demo.json)
BACKEND_STEPS = {
    "transformer-lens": "1 positive control, 2 detection, 3 k-sweep, 4 zero ablation, 5 single-head scan, "
                        "6 design space",
    "nnsight": "2 the head census, 4 mean / resample ablation (the bridge refuses them), 8 transfer (TransformerLens "
               "4.3 has no InternVL adapter), 9 VQA and 10 overlays (not routed through the backend seam yet)",
}
CLAIM_STEPS = {"positive_control": 1, "transfer_control": 1, "causal": 3, "causal_curve": 3, "specific": 3,
               "ablation_kinds": 4, "score_damage": 5, "design_space": 6, "sparse": 7, "stable": 7, "shared": 8,
               "vqa": 9}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the demo runs on (``DEFAULT_SIZES`` unless given)."""

    detect_scenes: int = 200
    eval_scenes: int = 40
    check_items: int = 40
    vqa_scenes: int = 20
    control_scenes: int = 30
    census_items: int = 6
    random_sets: int = 20
    curve_sets: int = 4


DEFAULT_SIZES = Sizes()


def demo_ks(total_heads: int) -> tuple[list[int], int]:
    """``(ks, k_star)`` for a model with ``total_heads`` heads (module doc)."""
    low = math.ceil(PAPER_FRACTION_RANGE[0] * total_heads)
    high = math.floor(PAPER_FRACTION_RANGE[1] * total_heads)
    middle = sum(PAPER_FRACTION_RANGE) / 2 * total_heads
    if low <= high:
        k_star = min(range(low, high + 1), key=lambda k: (abs(k - middle), k))
    else:
        k_star = max(1, math.floor(middle + 0.5))
    cap = max(1, total_heads // 4)
    ks = sorted({0, k_star, *(k for k in parse_ks(DEMO_GRID, total_heads) if k <= cap)})
    return ks, k_star


def evaluation_items(scenes: int) -> list[Any]:
    """Every referent of the first ``scenes`` evaluation scenes (level 1; disjoint from the ``detect-`` scenes)."""
    from vrh_interp.data import grounding_samples

    return [sample for index in range(scenes) for sample in grounding_samples("eval", index, 1)]


def check_subset(items: Sequence[Any], count: int) -> list[Any]:
    """``count`` items in whole scenes spread evenly over ``items`` (a scene's referents share their image prefix
    in a generation); the last scene cut to make ``count``. Fixed, spread over the scenes."""
    if count >= len(items):
        return list(items)
    scenes: list[list[Any]] = []
    for item in items:
        image = getattr(item, "image", None)
        if scenes and image is not None and getattr(scenes[-1][0], "image", None) is image:
            scenes[-1].append(item)
        else:
            scenes.append([item])
    wanted = min(len(scenes), math.ceil(count * len(scenes) / len(items)))
    picked = [item for i in range(wanted) for item in scenes[math.floor(i * len(scenes) / wanted)]]
    return picked[:count]


def main_conditions(ranking: Any, geometry: Any, ks: Sequence[int], k_star: int, seeds: Sequence[int],
                    curve_sets: int, live: Any = None) -> list[Condition]:
    """``sweep_conditions`` with every control set at k* and the first ``curve_sets`` seeds at every other k."""
    conditions = sweep_conditions(ranking, geometry, ks, list(seeds), live=live)
    first = set(list(seeds)[:curve_sets])
    return [c for c in conditions if c.kind not in CONTROL_KINDS or c.k == k_star or c.seed in first]


def restrict(result: SweepResult, sample_ids: Sequence[str], keep: Callable[[Condition], bool]) -> SweepResult:
    """The records of ``result`` on ``sample_ids`` under the conditions ``keep`` accepts (the baseline always)."""
    conditions = [c for c in result.conditions if c.kind == "baseline" or keep(c)]
    keys = {c.key for c in conditions}
    records = result.records
    records = records[records["sample_id"].isin(set(sample_ids)) & records["condition"].isin(keys)]
    return SweepResult(records.reset_index(drop=True), conditions, result.iou_threshold, result.total_heads)


def scan_heads(ranking: Any, geometry: Any, k_star: int) -> Any:
    """All heads, or on models over ``SCAN_ALL_HEADS`` the top ``k_star`` and the rest sampled at evenly spaced
    score ranks (``SCAN_SAMPLED_HEADS`` in all), in (layer, head) order. Rank-stratified, not a seeded uniform
    draw: "score predicts damage" is a correlation over the score range, which a uniform draw covers unevenly
    (mostly low scores), and a draw that moves with ``--seed`` made the claim's verdict move with it."""
    from vrh_interp.core.heads import HeadSet

    everything = geometry.all_heads()
    if len(everything) <= SCAN_ALL_HEADS:
        return everything
    ranked = list(ranking)
    top, rest = ranked[:k_star], ranked[k_star:]
    picked = np.unique(np.linspace(0, len(rest) - 1, SCAN_SAMPLED_HEADS - len(top)).round().astype(int))
    return HeadSet(sorted(top + [rest[i] for i in picked], key=lambda h: (h.layer, h.head)))


MODEL_PAIRS = {"toy:a": "toy:b", "toy:b": "toy:a", "toy:c": "toy:d", "toy:d": "toy:c"}


def shipped(spec: str) -> bool:
    """A toy model whose checkpoint is in this installation (any non-toy spec counts as available)."""
    if not spec.startswith("toy:"):
        return True
    from vrh_interp.toy import FAMILIES, is_shipped

    name = spec.split(":", 1)[1]
    return name in FAMILIES and is_shipped(name)


def resolve_models(model_spec: str | None, transfer_model: str | None = "auto") -> tuple[str, str | None, str]:
    """``(main, transfer, why)``: no ``model_spec`` means ``toy:c`` where shipped, else ``toy:a``; ``transfer_model``
    "auto" means the main model's partner (``MODEL_PAIRS``), None or "" no transfer."""
    if model_spec is None:
        if shipped("toy:c"):
            main, why = "toy:c", ("toy:c is shipped (128 heads with spare capacity, the paper's regime; the head "
                                  "census below says which act)")
        else:
            main, why = "toy:a", "toy:c is not shipped in this installation, so the 32-head toy:a"
    else:
        main, why = model_spec, "--model"
    if transfer_model == "auto":
        transfer = MODEL_PAIRS.get(main)
        why += f"; transfer to {transfer}" if transfer else "; no known partner: transfer not measured"
    elif transfer_model:
        transfer, why = transfer_model, why + f"; transfer to {transfer_model} (--transfer-model)"
    else:
        transfer, why = None, why + "; transfer skipped (--transfer-model '')"
    return main, transfer, why


def write_overlays(vlm: Any, samples: Sequence[Any], heads: Any, out: Path) -> list[Path]:
    """Attention overlays (all heads, the top heads, all but the top heads), one PNG per sample, in out/overlays."""
    from vrh_interp.viz.overlays import prediction_overlays
    from vrh_interp.viz.plots import overlay_panels

    folder = out / "overlays"
    folder.mkdir(exist_ok=True)
    paths = []
    for sample in samples:
        result = prediction_overlays(vlm, sample, heads, max_new_tokens=ANSWER_TOKENS)
        fig = overlay_panels(result, title=f"{sample.sample_id}: \"{sample.expression}\" (answer {result.answer!r})")
        path = folder / f"{sample.sample_id}.png"
        fig.savefig(path)
        paths.append(path)
    return paths


def _load(spec: str, device: str | None, dtype: str | None) -> Any:
    from vrh_interp.specs import load_spec

    return load_spec(spec, device, dtype)


def _detect(vlm: Any, samples: list[Any], out: Path, batch_size: int,
            backend: str | Backend = "nnsight") -> tuple[list[Any], Any]:
    stats = collect_detection_stats(vlm, samples, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                    run_dir=out, dataset=f"synthetic:detect:{len(samples)}", backend=backend)
    provenance = {"model": model_provenance(vlm), "dataset": f"synthetic:detect:{len(samples)}",
                  "libraries": library_versions(), "created": now_utc(), "sample_ids": [s.sample_id for s in samples]}
    return stats, scores_from_stats(stats, "vrh", provenance)


def positive_control_step(out: Path, device: str | None, batch_size: int, eval_scenes: int = 30,
                          backend: str = "nnsight", random_sets: int = 20) -> dict[str, Any] | None:
    """Step 1: the positive control on ``toy:planted`` (None, saying why, where its checkpoint is not shipped)."""
    from vrh_interp.experiments import positive_control as pc

    if not pc.available():
        print(f"      positive control skipped: the {pc.SPEC} checkpoint is not shipped in this installation")
        return None
    outcome = pc.run_positive_control(out / "positive_control", device=device, batch_size=batch_size,
                                      detect_scenes=CONTROL_DETECT_SCENES, eval_scenes=eval_scenes,
                                      random_sets=random_sets, backend=backend)
    print("      " + pc.describe(outcome))
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(read_grading(out / "positive_control" / "grading.csv").to_string(index=False))
    return outcome


class Steps:
    """Step progress (elapsed time per step) and the optional cap: ``open(n, text)`` is False, and the step is
    skipped, once ``budget`` seconds have passed."""

    def __init__(self, started: float, budget: float | None) -> None:
        self.started, self.budget, self.rows, self.skipped = started, budget, [], []
        self._current: dict | None = None

    def open(self, number: int, text: str) -> bool:
        self.close()
        elapsed = time.perf_counter() - self.started
        if self.budget is not None and elapsed >= self.budget:
            print(f"[{number}/{STEPS}] skipped: --budget-seconds {self.budget:.0f} reached ({text})", flush=True)
            self.skipped.append(number)
            return False
        print(f"[{number}/{STEPS}] {text}  ({elapsed:.0f} s elapsed)", flush=True)
        self._current = {"step": number, "name": text, "began": time.perf_counter()}
        return True

    def close(self) -> None:
        if self._current is not None:
            seconds = time.perf_counter() - self._current.pop("began")
            self.rows.append({**self._current, "seconds": round(seconds, 1)})
            print(f"      step {self._current['step']} took {seconds:.1f} s", flush=True)
            self._current = None

    def table(self) -> pd.DataFrame:
        self.close()
        total = {"step": "total", "name": "all steps", "seconds": round(time.perf_counter() - self.started, 1)}
        return pd.DataFrame([*self.rows, total]).astype({"step": str})


def _request(out: Path, request: dict[str, Any]) -> None:
    """Refuse a folder planned for another request (its step folders would not resume), else record this one."""
    path = out / PLAN_FILE
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8")).get("request", {})
        if stored != json.loads(json.dumps(request)):
            differing = sorted(k for k in set(stored) | set(request) if stored.get(k) != request.get(k))
            raise ValueError(f"{out} holds a demo planned for another request (differs in {', '.join(differing)}): "
                             "rerun with the same arguments to resume it, or use a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"request": request}, indent=2))


def vqa_answered(summary: pd.DataFrame) -> list[str]:
    """The VQA kinds whose unmasked accuracy beats the majority answer by ``ANSWERS_VQA_MARGIN``."""
    base = summary[summary["condition"] == "baseline"]
    return [r.benchmark for r in base.itertuples() if r.accuracy >= r.majority_baseline + ANSWERS_VQA_MARGIN]


def run_demo(*, model_spec: str | None = None, out: Path = Path("runs/demo"), detect_scenes: int | None = None,
             eval_scenes: int | None = None, device: str | None = None, dtype: str | None = None,
             transfer_model: str | None = "auto", as_json: bool = False, batch_size: int = 256,
             random_sets: int | None = None, curve_sets: int | None = None, check_items: int | None = None,
             vqa_scenes: int | None = None, control_scenes: int | None = None, overlay_items: int = 3,
             positive_control: bool = True, budget_seconds: float | None = None, seed: int = 0,
             backend: str = "nnsight") -> int:
    """The whole demo into ``out`` (module doc). Returns the exit status."""
    started = time.perf_counter()
    model_spec, transfer_model, why = resolve_models(model_spec, transfer_model)
    print(f"main model {model_spec}: {why}", flush=True)
    from vrh_interp.experiments import positive_control as pc

    given = {"detect_scenes": detect_scenes, "eval_scenes": eval_scenes, "check_items": check_items,
             "vqa_scenes": vqa_scenes, "control_scenes": control_scenes, "random_sets": random_sets,
             "curve_sets": curve_sets}
    sizes = dataclasses.replace(DEFAULT_SIZES, **{k: v for k, v in given.items() if v is not None})
    run_control = positive_control and pc.available()
    transfer_ready = bool(transfer_model) and shipped(transfer_model)
    budget = float(budget_seconds) if budget_seconds and budget_seconds > 0 else None
    request = {"model": model_spec, "transfer_model": transfer_model if transfer_ready else None,
               "positive_control": run_control, "sizes": dataclasses.asdict(sizes), "seed": seed,
               "overlay_items": overlay_items, **({"backend": backend} if backend != "nnsight" else {})}
    _request(out, request)
    seeds = range(seed * SEED_STRIDE, seed * SEED_STRIDE + sizes.random_sets)
    print(f"      sizes (fixed, not from a clock): {dataclasses.asdict(sizes)}; seed {seed}"
          + (f"; capped at {budget:.0f} s (claims of skipped steps: inconclusive)" if budget else ""), flush=True)
    steps = Steps(started, budget)
    evidence: dict[str, Evidence | None] = {}
    outcome = None
    if run_control and steps.open(1, "positive control: the same pipeline on toy:planted, whose retrieval heads "
                                     "are known"):
        outcome = positive_control_step(out, device, batch_size, sizes.control_scenes, backend=backend,
                                        random_sets=sizes.random_sets)
    vlm = _load(model_spec, device, dtype)
    runner = get_backend(backend, vlm)
    if backend != "nnsight":
        print(textwrap.fill(f"backend {backend}: {BACKEND_STEPS.get(backend, 'every step')}; on nnsight: "
                            f"{BACKEND_STEPS['nnsight']}", TERMINAL_WIDTH, initial_indent="      ",
                            subsequent_indent="      "), flush=True)
    geometry = vlm.geometry
    detect = synthetic_samples("detect", sizes.detect_scenes)
    evals = evaluation_items(sizes.eval_scenes)
    checks = check_subset(evals, sizes.check_items)
    check_ids = [s.sample_id for s in checks]
    ks, k_star = demo_ks(geometry.total_heads)
    steps.open(2, f"detecting heads of {model_spec} on {len(detect)} held-out scenes; head census")
    stats, scores = _detect(vlm, detect, out / "detect", batch_size, backend=runner)
    scores.save(out / "scores-vrh.json")
    overlap = sorted({s.sample_id for s in detect} & {s.sample_id for s in evals})
    if overlap:
        raise ValueError(f"detection and evaluation items overlap (e.g. {overlap[:3]})")
    from vrh_interp.evaluation.census import run_census

    pool = run_census(vlm, detect, out, items=sizes.census_items, max_new_tokens=ANSWER_TOKENS)
    print("      " + pool.line(), flush=True)
    ranking = scores.ranking()
    live = pool.control_pool(ranking[:max(ks)], max(ks))
    if live is None:
        print(f"      too few live heads outside the top {max(ks)}: no live-head control", flush=True)
    conditions = main_conditions(ranking, geometry, ks, k_star, seeds, sizes.curve_sets, live)
    result = None
    if steps.open(3, f"k-sweep on all {len(evals)} referents of {sizes.eval_scenes} disjoint scenes, ks={ks} "
                     f"(k*={k_star}), {len(conditions)} conditions"):
        result = run_conditions(vlm, evals, conditions, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                run_dir=out / "sweep", backend=runner)
        result.summary(bootstrap_seed=seed).to_csv(out / "sweep_summary.csv", index=False)
        evidence["causal"] = ev.causal_evidence(result.records, conditions, k_star, seed=seed)
        evidence["causal_curve"] = ev.curve_evidence(result.records, conditions, seed=seed)
        evidence["specific"] = ev.specificity_evidence(result.records, k_star)
    if result is not None and steps.open(4, f"ablation kinds at k*={k_star} on {len(checks)} fixed items"):
        from vrh_interp.evaluation.grounding import ablation_values

        values = ablation_values(vlm, detect, batch_size=batch_size)
        values.save(out / "ablation_values.pt")
        at_k = [c for c in conditions if c.k in (0, k_star)]
        kinds = {"zero": restrict(result, check_ids, lambda c: c.k == k_star)}
        for kind in ("mean", "resample"):
            masked = [c if c.kind == "baseline" else dataclasses.replace(c, ablation=kind) for c in at_k]
            kinds[kind] = run_conditions(vlm, checks, masked, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                         run_dir=out / f"ablation_{kind}", ablation_values=values)
        by_kind = {kind: ev.causal_evidence(r.records, r.conditions, k_star, ablation=kind, seed=seed)
                   for kind, r in kinds.items()}
        pd.DataFrame([{"ablation": kind, "k": k_star, "n": e.n if e else 0,
                       "effect": e.estimate if e else float("nan"), "numbers": e.numbers if e else ""}
                      for kind, e in by_kind.items()]).to_csv(out / "ablation_kinds.csv", index=False)
        evidence["ablation_kinds"] = ev.kinds_agree(by_kind)
    if result is None and 3 in steps.skipped:
        steps.skipped.append(4)  # the ablation kinds compare with the k-sweep's zero-ablation records
    scanned = scan_heads(ranking, geometry, k_star)
    if steps.open(5, f"single-head causal scan: {len(scanned)} of {geometry.total_heads} heads on {len(checks)} "
                     "fixed items"):
        from vrh_interp.experiments.head_scan import head_scan, write_head_scan

        write_head_scan(head_scan(vlm, checks, scores, heads=scanned, batch_size=batch_size,
                                  max_new_tokens=ANSWER_TOKENS, run_dir=out / "scan", backend=runner), out)
        table = pd.read_csv(out / "head_scan.csv")
        evidence["score_damage"] = ev.score_damage_evidence(table["score"], table["drop"], seed=seed)
    if steps.open(6, f"design space at k={k_star} on the {len(checks)} fixed items"):
        design = design_space(vlm, stats, checks, k=k_star, random_seeds=seeds, batch_size=batch_size,
                              max_new_tokens=ANSWER_TOKENS, run_dir=out, backend=runner)
        design.to_csv(out / "design_space.csv", index=False)
        from vrh_interp.experiments.design_space import design_space_plan
        from vrh_interp.experiments.sweep import sweep_from_run

        plan = design_space_plan(stats, k=k_star, random_seeds=seeds)
        evidence["design_space"] = ev.design_evidence(sweep_from_run(out / "design_space").records, plan.key_of,
                                                      "Q=output, Phi=sum, Omega=mean", seed=seed)
    if steps.open(7, "sparsity and stability"):
        scores.sparsity().to_csv(out / "sparsity.csv", index=False)
        stability(stats, k=k_star, sizes=(2, 5, 10, 20, 50, 100, 200)).to_csv(out / "stability.csv", index=False)
        token_choice_stability(stats, k=k_star).to_csv(out / "token_stability.csv", index=False)
        evidence["sparse"] = ev.sparse_evidence(stats, seed=seed)
        evidence["stable"] = ev.stability_evidence(stats, k_star, seed=seed)
    evidence["shared"] = None
    if transfer_ready and steps.open(8, f"transfer to {transfer_model}: cross-masking at k*={k_star}"):
        vlm_b = _load(transfer_model, device, dtype)
        if same_grid(geometry, vlm_b.geometry):
            _, scores_b = _detect(vlm_b, detect, out / "detect_b", batch_size)
            scores_b.save(out / "scores-vrh-b.json")
            transfer = compare_scores(scores, scores_b, ks=sorted({k_star, 2 * k_star, 3 * k_star}))
            transfer.to_csv(out / "transfer.csv", index=False)
            crossed = cross_masking(vlm, vlm_b, scores, scores_b, checks, ks=[0, k_star], random_seeds=seeds,
                                    labels=(f"A ({model_spec})", f"B ({transfer_model})"), batch_size=batch_size,
                                    max_new_tokens=ANSWER_TOKENS, run_dir=out / "cross")
            curves = crossed.summary()
            curves.to_csv(out / "cross_masking.csv", index=False)
            masking_drops(curves, k_star).to_csv(out / "transfer_masking.csv", index=False)
            evidence["shared"] = ev.transfer_evidence(crossed.results, k_star, seed=seed)
        else:
            print("      the two models do not share a head grid: transfer skipped")
        del vlm_b
    evidence["vqa"] = None
    if steps.open(9, f"cross-task VQA on the questions of {sizes.vqa_scenes} eval scenes"):
        from vrh_interp.data.datasets.synthetic_vqa import majority_answer_rate, synthetic_vqa
        from vrh_interp.experiments.vqa_sweep import vqa_sweep

        items = synthetic_vqa("eval", sizes.vqa_scenes)
        vqa = vqa_sweep(vlm, items, scores.top(k_star), random_seeds=seeds, batch_size=batch_size,
                        run_dir=out / "vqa")
        summary = vqa.summary(bootstrap_seed=seed)
        majority = {b: majority_answer_rate([s for s in items if s.benchmark == b]) for b in vqa.benchmarks}
        summary["majority_baseline"] = summary["benchmark"].map(majority)
        summary.to_csv(out / "vqa_summary.csv", index=False)
        answered = vqa_answered(summary)
        evidence["vqa"] = ev.vqa_evidence(vqa, answered, k_star, seed=seed) if answered else Evidence.categorical(
            "not measured", "the model answers no VQA kind above the majority-answer level")
    if run_control:
        evidence["positive_control"] = None if outcome is None else Evidence.categorical(
            "holds" if outcome["recovered"] and outcome["causal_verdict"] == "holds" else
            "does not hold" if not outcome["recovered"] or outcome["causal_verdict"] == "does not hold"
            else "inconclusive", pc.describe(outcome),
            f"recovered: {outcome['recovered']}; causal claim on the planted heads: {outcome['causal_verdict']}")
        rows = [] if outcome is None else outcome.get("transfer", [])
        evidence["transfer_control"] = None if not rows else Evidence.categorical(
            pc.transfer_verdict(rows), "; ".join(pc.transfer_line(row) for row in rows),
            "as constructed" if all(row["as_expected"] for row in rows) else "a planted pair reads against its "
            "construction" if any(row["verdict"] != "inconclusive" and not row["as_expected"] for row in rows)
            else "a planted pair is undecided")
    for claim, step in CLAIM_STEPS.items():  # a claim whose step the cap skipped is undecided, never another verdict
        if step in steps.skipped and (evidence.get(claim) is None) and (claim != "shared" or transfer_ready):
            evidence[claim] = Evidence.categorical("inconclusive", "", "not measured within --budget-seconds")
    table = judge(evidence)
    table.to_csv(out / "verdicts.csv", index=False)
    if steps.open(10, f"attention overlays of the top {max(k_star, 3)} heads on {overlay_items} images; report"):
        write_overlays(vlm, check_subset(evals, overlay_items), scores.top(max(k_star, 3)), out)
    timing = steps.table()
    timing.to_csv(out / "timing.csv", index=False)
    paths = write_report(out)
    elapsed = time.perf_counter() - started
    (out / "demo.json").write_text(json.dumps({
        "model": model_spec, "transfer_model": transfer_model if transfer_ready else None, "model_choice": why,
        "backend": backend, "backend_steps": dict(BACKEND_STEPS) if backend != "nnsight" else None,
        "seconds": elapsed, "budget_seconds": budget, "seed": seed, "k_star": k_star, "ks": ks,
        "sizes": dataclasses.asdict(sizes), "evaluation_items": len(evals), "census": pool.summary(),
        "steps": timing.to_dict(orient="records"), "top_heads": scores.top(k_star).to_list(),
        "positive_control": outcome, "verdicts": table.to_dict(orient="records")}, indent=2, default=str))
    if as_json:
        print(json.dumps({"verdicts": table.to_dict(orient="records"), "report": str(paths["html"]),
                          "positive_control": None if outcome is None else outcome["verdict"],
                          "census": pool.summary(), "seconds": round(elapsed, 1)}, default=str))
        return 0
    if outcome is not None:
        print("\n" + textwrap.fill("Positive control: " + pc.describe(outcome), TERMINAL_WIDTH))
        for row in outcome.get("transfer", []):
            print(textwrap.fill(pc.transfer_line(row), TERMINAL_WIDTH, subsequent_indent="    "))
    print("\n" + pool.line())
    print(f"\n{claims_text(table, TERMINAL_WIDTH)}")
    print(f"\nreport: {paths['html']}  ({elapsed:.0f} s" + (f" of a {budget:.0f} s cap)" if budget else ")"))
    return 0
