"""``vrh demo``: the paper's protocol end to end on a (toy) model, on CPU, next to a positive control.

Steps (each writes its records into the run folder, so rerunning resumes):

1. positive control: the same detection and causal sweep on ``toy:planted``, whose retrieval heads are known;
2. detection on ``detect_scenes`` held-out scenes (one referent per scene), scores of the paper's design, and the
   head census (``evaluation.census``: which heads measurably act; the pool of the live-head control);
3. the causal k-sweep on every referent of ``eval_scenes`` evaluation scenes (disjoint from detection), in the
   clustered design (``experiments.designs``): the top-k at every k on every item, and per scene one fresh set of
   each control kind (uniform, layer-matched, live heads) at every k on that scene's referents (the k-curve claim
   pools them over k, the scene the unit); the rank test's sets at k* on ``rank_items`` items, curtailed;
4. the causal claim at k* again under mean and resample ablation, on ``check_items`` fixed items (their scenes'
   own sets);
5. the single-head causal scan (every head, or on models over 48 heads the top k* and a random sample);
6. design space, 7. sparsity and stability, 8. transfer to a second model sharing the backbone (cross-masking),
9. cross-task VQA (one fresh set of each kind per scene, specialness from step 3's rank test), 10. attention
   overlays of the top heads and the report.

k (``demo_ks``): the grid 0.5, 1, 1.7, 2.6, 5 and 10 % of all heads, capped at a quarter of the heads; claims are
judged at k*, the count inside the paper's 1.7-2.6 % nearest 2.15 % (at least 1 head).

Sizes are FIXED (``DEFAULT_SIZES``), never chosen from a clock: the same command prints the same table on any
machine (``--seed`` moves only the control-set draws, the scan's head sample and the bootstrap). Verdicts come from
the one claims module (``evaluation.claims``: holds / does not hold / inconclusive, Bonferroni over each table's
fixed family), with the evidence computed per item from the run's records (``experiments.verdicts``). The causal
claim's rank test reads up to ``rank_sets`` sets of each kind on ``rank_items`` items
(``designs.clustered_sweep``), drawn sequentially and curtailed; transfer has its own (``sequential_sets``).
``--budget-seconds`` optionally caps the work: steps not begun by then are skipped, and their claims read
"inconclusive" (never another verdict).
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import time
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from vrh_interp.apps.demo_plan import (ANSWER_TOKENS, DEFAULT_SIZES, PLAN_FILE, SEED_STRIDE,
                                       TERMINAL_WIDTH, Sizes, Steps, evaluation_items, restrict,
                                       scan_heads, vqa_answered)
from vrh_interp.core.execution.backends.base import backend_config
from vrh_interp.core.execution.backends.select import backend_for, backend_type
from vrh_interp.core.description.model import LOCAL, Placement
from vrh_interp.core.bookkeeping.provenance import library_versions, model_provenance, now_utc
from vrh_interp.apps.report import write_report
from vrh_interp.evaluation.claims import Evidence, claims_lines, judge
from vrh_interp.experiments import verdicts as ev
from vrh_interp.experiments.ks import demo_ks
from vrh_interp.experiments.conditions import Condition
from vrh_interp.experiments.sweep import SweepResult, run_conditions
from vrh_interp.experiments.design_space import design_space, stability, token_choice_stability
from vrh_interp.experiments.designs import RANK_H, check_subset, scene_design
from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.experiments.transfer import compare_scores, cross_masking, masking_drops, same_grid

CONTROL_DETECT_SCENES = 20
# with --backend transformer-lens: what runs on it, and what stays on nnsight and why (printed, and in demo.json)
BACKEND_STEPS = {
    "transformer-lens": "1 positive control, 2 detection, 3 k-sweep, 4 zero ablation, 5 single-head scan, "
                        "6 design space",
    "nnsight": "2 the head census, 4 mean / resample ablation (the bridge refuses them), 8 transfer (TransformerLens "
               "4.3 has no InternVL adapter), 9 VQA (kept here: the bridge generates uncached) and 10 overlays "
               "(nnsight traces)",
}


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
            from vrh_interp.toy import regime_status

            main, why = "toy:c", f"toy:c is shipped ({regime_status('c')}; the head census below says which act)"
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


def check_models(main: str, transfer: str | None, explicit: bool) -> None:
    """Refuse, before any step, a main or transfer model the demo cannot load (an unknown or unshipped toy, an
    unknown tiny family) and a transfer model equal to the main one (the model cross-masked with itself reads as
    transfer). ``explicit``: the transfer model was named (``--transfer-model``); a default partner that is not
    shipped is skipped with a word instead. Hub ids and local folders are checked by the CLI (``_check_inputs``)."""
    from vrh_interp.toy.configs import FAMILIES as TOYS

    for option, spec in (("--model", main), ("--transfer-model", transfer if explicit else None)):
        if not spec:
            continue
        kind, _, name = spec.partition(":")
        if kind == "toy" and (name not in TOYS or not shipped(spec)):
            available = sorted(n for n in TOYS if shipped(f"toy:{n}"))
            raise ValueError(f"{option} {spec!r}: " + ("no such toy model" if name not in TOYS else
                                                          "its checkpoint is not shipped in this installation")
                             + f": the shipped toys are {', '.join('toy:' + n for n in available)}")
        if kind == "tiny":
            from vrh_interp.core.description.tiny import TINY_FAMILIES

            if name not in TINY_FAMILIES:
                raise ValueError(f"{option} {spec!r}: no such tiny family: use one of "
                                 f"{', '.join('tiny:' + f for f in TINY_FAMILIES)}")
    if transfer and transfer == main:
        raise ValueError(f"--transfer-model {transfer!r} is the main model: cross-masking a model with itself says "
                         "nothing about transfer: pass a second model sharing the backbone, or '' to skip transfer")


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


def _elsewhere(run: DemoRun) -> bool:
    """Whether the placed steps run on another backend than the nnsight ones: what the run folder records of its
    backend (``backend_config``: nothing for nnsight), so the demo never names a backend itself."""
    return bool(backend_config(backend_type(run.placement.backend)))


def _load(spec: str, device: str | None, dtype: str | None) -> Any:
    from vrh_interp.specs import load_spec

    return load_spec(spec, device, dtype)


def _detect(vlm: Any, samples: list[Any], out: Path, batch_size: int) -> tuple[list[Any], Any]:
    stats = collect_detection_stats(vlm, samples, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                    run_dir=out, dataset=f"synthetic:detect:{len(samples)}")
    provenance = {"model": model_provenance(vlm), "dataset": f"synthetic:detect:{len(samples)}",
                  "libraries": library_versions(), "created": now_utc(), "sample_ids": [s.sample_id for s in samples]}
    return stats, scores_from_stats(stats, "vrh", provenance)


def positive_control_step(out: Path, device: str | None, batch_size: int, eval_scenes: int = 30,
                          placement: Placement = LOCAL, random_sets: int = 20) -> dict[str, Any] | None:
    """Step 1: the positive control on ``toy:planted`` (None, saying why, where its checkpoint is not shipped)."""
    from vrh_interp.experiments import positive_control as pc

    if not pc.available():
        print(f"      positive control skipped: the {pc.SPEC} checkpoint is not shipped in this installation")
        return None
    outcome = pc.run_positive_control(out / "positive_control", device=device, batch_size=batch_size,
                                      detect_scenes=CONTROL_DETECT_SCENES, eval_scenes=eval_scenes,
                                      random_sets=random_sets, placement=placement)
    print("      " + pc.short_line(outcome), flush=True)  # the paragraph and the grading table: in the report
    return outcome


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


@dataclasses.dataclass
class DemoRun:
    """What the demo's steps share: the request (``plan_demo``) and what each step leaves for the later ones."""

    out: Path
    model_spec: str
    transfer_model: str | None
    why: str
    sizes: Sizes
    seed: int
    batch_size: int
    device: str | None
    dtype: str | None
    placement: Placement  # where the steps that run on the chosen backend run (``placed``); the others: ``vlm``
    run_control: bool
    transfer_ready: bool
    budget: float | None
    steps: Steps
    evidence: dict[str, Evidence | None] = dataclasses.field(default_factory=dict)
    outcome: dict[str, Any] | None = None
    vlm: Any = None  # the main model on nnsight, for the steps that stay there (BACKEND_STEPS["nnsight"])
    placed: Any = None  # the main model at ``placement``
    detect: list[Any] = dataclasses.field(default_factory=list)
    evals: list[Any] = dataclasses.field(default_factory=list)
    checks: list[Any] = dataclasses.field(default_factory=list)
    ks: list[int] = dataclasses.field(default_factory=list)
    k_star: int = 0
    stats: Any = None
    scores: Any = None
    pool: Any = None
    ranking: Any = None
    conditions: list[Condition] = dataclasses.field(default_factory=list)
    items_of: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # a scene's sets: its referents
    result: SweepResult | None = None

    @property
    def seeds(self) -> range:
        return range(self.seed * SEED_STRIDE, self.seed * SEED_STRIDE + self.sizes.random_sets)


def plan_demo(model_spec: str | None, transfer_model: str | None, out: Path, sizes: Sizes, *, seed: int,
              batch_size: int, device: str | None, dtype: str | None, placement: Placement, positive_control: bool,
              overlay_items: int, budget_seconds: float | None, started: float) -> DemoRun:
    """The models, sizes and cap of a demo; the request recorded in (or checked against) ``out``."""
    from vrh_interp.experiments import positive_control as pc

    explicit = transfer_model not in (None, "", "auto")
    model_spec, transfer_model, why = resolve_models(model_spec, transfer_model)
    check_models(model_spec, transfer_model, explicit)
    if transfer_model and not shipped(transfer_model):
        why += " (its checkpoint is not shipped in this installation: transfer not measured)"
    print(f"main model {model_spec}: {why}", flush=True)
    run_control = positive_control and pc.available()
    transfer_ready = bool(transfer_model) and shipped(transfer_model)
    budget = float(budget_seconds) if budget_seconds and budget_seconds > 0 else None
    request = {"model": model_spec, "transfer_model": transfer_model if transfer_ready else None,
               "positive_control": run_control, "sizes": dataclasses.asdict(sizes), "seed": seed,
               "overlay_items": overlay_items, **backend_config(backend_type(placement.backend))}
    _request(out, request)
    shown = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(sizes).items())
    print(f"      sizes (fixed, not from a clock): {shown}; seed {seed}"
          + (f"; capped at {budget:.0f} s (claims of skipped steps: inconclusive)" if budget else ""), flush=True)
    return DemoRun(out, model_spec, transfer_model, why, sizes, seed, batch_size, device, dtype, placement, run_control,
                   transfer_ready, budget, Steps(started, budget))


def load_main_model(run: DemoRun) -> None:
    """The main model (on nnsight, and placed: ``DemoRun.placed``, its backend built here so that an unsupported
    family is refused before any step) and the fixed items: detection scenes, evaluation items, check subset, ks."""
    run.vlm = _load(run.model_spec, run.device, run.dtype)
    run.placed = run.vlm.on(run.placement)
    name = backend_for(run.placed).name
    if _elsewhere(run):
        print(textwrap.fill(f"backend {name}: {BACKEND_STEPS.get(name, 'every step')}; on nnsight: "
                            f"{BACKEND_STEPS['nnsight']}", TERMINAL_WIDTH, initial_indent="      ",
                            subsequent_indent="      "), flush=True)
    run.detect = synthetic_samples("detect", run.sizes.detect_scenes)
    run.evals = evaluation_items(run.sizes.eval_scenes)
    run.checks = check_subset(run.evals, run.sizes.check_items)
    run.ks, run.k_star = demo_ks(run.vlm.geometry.total_heads)


def detect_step(run: DemoRun) -> None:
    """Step 2: detection, the paper's scores, the head census and the main sweep's conditions."""
    run.steps.open(2, f"detecting heads of {run.model_spec} on {len(run.detect)} held-out scenes; head census")
    run.stats, run.scores = _detect(run.placed, run.detect, run.out / "detect", run.batch_size)
    run.scores.save(run.out / "scores-vrh.json")
    overlap = sorted({s.sample_id for s in run.detect} & {s.sample_id for s in run.evals})
    if overlap:
        raise ValueError(f"detection and evaluation items overlap (e.g. {overlap[:3]})")
    from vrh_interp.evaluation.census import live_pool

    run.ranking = run.scores.ranking()
    run.pool, live = live_pool(run.vlm, run.detect, run.ranking, max(run.ks), run.out, items=run.sizes.census_items,
                               max_new_tokens=ANSWER_TOKENS, say=lambda line: print("      " + line, flush=True))
    run.conditions, run.items_of = scene_design(run.ranking, run.vlm.geometry, run.ks, run.evals,
                                                run.seed * SEED_STRIDE, live=live)


def sweep_step(run: DemoRun) -> None:
    """Step 3: the causal k-sweep; evidence of the causal, k-curve and specificity claims."""
    answers = sum(len(run.items_of.get(c.key, run.evals)) for c in run.conditions)
    if not run.steps.open(3, f"k-sweep on all {len(run.evals)} referents of {run.sizes.eval_scenes} disjoint scenes, "
                             f"ks={run.ks} (k*={run.k_star}), one fresh control set of each kind per scene "
                             f"({answers} answers); the rank test at k*"):
        return
    from vrh_interp.experiments.designs import clustered_sweep

    kinds = sorted({c.kind for c in run.conditions if c.kind in ev.CONTROL_KINDS})
    detected = run.ranking[: max(run.ks)]
    pool = run.pool.control_pool(detected, max(run.ks)) if run.pool is not None else None  # as detect_step's
    result, ranks = clustered_sweep(run.placed, run.ranking, run.ks, run.evals, run.out, kinds=kinds, live=pool,
                                    rank_sets=run.sizes.rank_sets, rank_items=run.sizes.rank_items,
                                    first_seed=run.seed * SEED_STRIDE, batch_size=run.batch_size,
                                    max_new_tokens=ANSWER_TOKENS, rank_ks=[run.k_star])
    run.result = result
    result.summary(bootstrap_seed=run.seed).to_csv(run.out / "sweep_summary.csv", index=False)
    rank = ranks.get(run.k_star)
    if rank is not None:
        sets = {kind: sum(1 for c in rank.conditions if c.kind == kind) for kind in kinds}
        print(f"      rank test: {', '.join(f'{n} {kind}' for kind, n in sets.items())} sets on "
              f"{rank.records['sample_id'].nunique()} items, {len(rank.records)} answers (stopped once {RANK_H} were "
              "as harmful as the top-k)", flush=True)
    run.evidence["causal"] = ev.causal_evidence(result.records, run.conditions, run.k_star, seed=run.seed, rank=rank)
    run.evidence["causal_curve"] = ev.curve_evidence(result.records, run.conditions, seed=run.seed,
                                                     special=run.evidence["causal"])
    run.evidence["specific"] = ev.specificity_evidence(result.records, run.k_star)


def sequential_sets(run: DemoRun, folder: Path, streams: Sequence[tuple[str, str]], target: str,
                    answer: Any, first: int, block: int) -> dict[str, SweepResult] | None:
    """``designs.sequential_sets`` at k* with the demo's ``rank_sets`` and ``RANK_H``, saying what it drew."""
    from vrh_interp.experiments.designs import sequential_sets as drawn

    merged = drawn(streams, answer, folder, k=run.k_star, target=target, total=run.sizes.rank_sets, first=first,
                   block=block, h=RANK_H)
    for unit, result in (merged or {}).items():
        sets = {kind: sum(1 for c in result.conditions if c.kind == kind) for _, kind in streams}
        print(f"      rank test{'' if unit == 'grounding' else ' (' + unit + ')'}: "
              f"{', '.join(f'{n} {kind}' for kind, n in sets.items())} sets on "
              f"{result.records['sample_id'].nunique()} items, {len(result.records)} answers (stopped once "
              f"{RANK_H} were as harmful as the {target} set)", flush=True)
    return merged


def ablation_kinds_step(run: DemoRun) -> None:
    """Step 4: the causal claim at k* under every ablation kind (zero from the k-sweep's records)."""
    if run.result is None:
        if 3 in run.steps.skipped:
            run.steps.skipped.append(4)  # the ablation kinds compare with the k-sweep's zero-ablation records
        return
    if not run.steps.open(4, f"ablation kinds at k*={run.k_star} on {len(run.checks)} fixed items"):
        return
    from vrh_interp.core.execution.ablation_kinds import ABLATION_KINDS, DEFAULT_ABLATION_KIND
    from vrh_interp.evaluation.grounding import ablation_values

    from vrh_interp.experiments.designs import restrict_design

    values = ablation_values(run.vlm, run.detect, batch_size=run.batch_size)
    values.save(run.out / "ablation_values.pt")
    # the k-sweep ran the default kind (zero); every other registered kind runs here, on the check items with
    # their scenes' own sets (the clustered design restricted to them)
    check_ids = [s.sample_id for s in run.checks]
    at_k, where = restrict_design(run.conditions, run.items_of, check_ids, lambda c: c.k == run.k_star)
    kinds = {DEFAULT_ABLATION_KIND: restrict(run.result, check_ids, lambda c: c.k == run.k_star)}
    for kind in (k for k in ABLATION_KINDS if k != DEFAULT_ABLATION_KIND):
        masked = [c if c.kind == "baseline" else dataclasses.replace(c, ablation=kind) for c in at_k]
        kinds[kind] = run_conditions(run.vlm, run.checks, masked, batch_size=run.batch_size,
                                     max_new_tokens=ANSWER_TOKENS, run_dir=run.out / f"ablation_{kind}",
                                     ablation_values=values,
                                     items_of={m.key: where[c.key] for c, m in zip(at_k, masked) if c.key in where})
    # every kind on the same check items: does the drop and the effect persist under its ablation? The top-k's
    # specialness is the causal claim's rank test (its rank step, zero ablation) for each
    zero = run.evidence.get("causal")
    by_kind = {kind: ev.causal_evidence(r.records, r.conditions, run.k_star, ablation=kind, seed=run.seed,
                                        special=zero) for kind, r in kinds.items()}
    pd.DataFrame([{"ablation": kind, "k": run.k_star, "n": e.n if e else 0,
                   "effect": e.estimate if e else float("nan"), "numbers": e.numbers if e else ""}
                  for kind, e in by_kind.items()]).to_csv(run.out / "ablation_kinds.csv", index=False)
    run.evidence["ablation_kinds"] = ev.kinds_agree(by_kind)


def scan_step(run: DemoRun) -> None:
    """Step 5: the single-head causal scan; evidence that a head's score predicts its damage."""
    scanned = scan_heads(run.ranking, run.vlm.geometry, run.k_star)
    if not run.steps.open(5, f"single-head causal scan: {len(scanned)} of {run.vlm.geometry.total_heads} heads on "
                             f"{len(run.checks)} fixed items"):
        return
    from vrh_interp.experiments.head_scan import head_scan, write_head_scan

    write_head_scan(head_scan(run.placed, run.checks, run.scores, heads=scanned, batch_size=run.batch_size,
                              max_new_tokens=ANSWER_TOKENS, run_dir=run.out / "scan"), run.out)
    table = pd.read_csv(run.out / "head_scan.csv")
    run.evidence["score_damage"] = ev.score_damage_evidence(table["score"], table["drop"], seed=run.seed)


def design_space_step(run: DemoRun) -> None:
    """Step 6: the scoring design space at k*."""
    if not run.steps.open(6, f"design space at k={run.k_star} on the {len(run.checks)} fixed items"):
        return
    design = design_space(run.placed, run.stats, run.checks, k=run.k_star, random_seeds=run.seeds,
                          batch_size=run.batch_size, max_new_tokens=ANSWER_TOKENS, run_dir=run.out)
    design.to_csv(run.out / "design_space.csv", index=False)
    from vrh_interp.experiments.design_space import design_space_plan
    from vrh_interp.experiments.sweep import sweep_from_run

    plan = design_space_plan(run.stats, k=run.k_star, random_seeds=run.seeds)
    run.evidence["design_space"] = ev.design_evidence(sweep_from_run(run.out / "design_space").records, plan.key_of,
                                                      "Q=output, Phi=sum, Omega=mean", seed=run.seed)


def sparsity_step(run: DemoRun) -> None:
    """Step 7: sparsity and stability of the scores."""
    if not run.steps.open(7, "sparsity and stability"):
        return
    stats, out, k_star = run.stats, run.out, run.k_star
    run.scores.sparsity().to_csv(out / "sparsity.csv", index=False)
    stability(stats, k=k_star, sizes=(2, 5, 10, 20, 50, 100, 200)).to_csv(out / "stability.csv", index=False)
    token_choice_stability(stats, k=k_star).to_csv(out / "token_stability.csv", index=False)
    run.evidence["sparse"] = ev.sparse_evidence(stats, seed=run.seed)
    run.evidence["stable"] = ev.stability_evidence(stats, k_star, seed=run.seed)


def transfer_step(run: DemoRun) -> None:
    """Step 8: transfer to the second model (cross-masking at k*), where it shares the head grid."""
    run.evidence["shared"] = None
    if not (run.transfer_ready and run.steps.open(8, f"transfer to {run.transfer_model}: cross-masking at "
                                                     f"k*={run.k_star}")):
        return
    k_star, out = run.k_star, run.out
    vlm_b = _load(run.transfer_model, run.device, run.dtype)
    if same_grid(run.vlm.geometry, vlm_b.geometry):
        _, scores_b = _detect(vlm_b, run.detect, out / "detect_b", run.batch_size)
        scores_b.save(out / "scores-vrh-b.json")
        transfer = compare_scores(run.scores, scores_b, ks=sorted({k_star, 2 * k_star, 3 * k_star}))
        transfer.to_csv(out / "transfer.csv", index=False)
        labels = (f"A ({run.model_spec})", f"B ({run.transfer_model})")
        crossed = cross_masking(run.vlm, vlm_b, run.scores, scores_b, run.checks, ks=[0, k_star],
                                random_seeds=run.seeds, labels=labels, batch_size=run.batch_size,
                                max_new_tokens=ANSWER_TOKENS, run_dir=out / "cross")

        def answer(seeds: list[int], _kinds: set[str], folder: Path, partner: Any = vlm_b) -> dict[str, SweepResult]:
            if set(seeds) <= set(run.seeds):  # the cross-masking's own sets: answered there, on these items too
                ids = [s.sample_id for s in rank_items]
                return {label: restrict(result, ids, lambda c: c.k == k_star and (
                    c.kind == "transferred" or (c.kind == "random" and c.seed in seeds)))
                        for label, result in crossed.results.items()}
            return dict(cross_masking(run.vlm, partner, run.scores, scores_b, rank_items, ks=[0, k_star],
                                      random_seeds=seeds, labels=labels, batch_size=run.batch_size,
                                      max_new_tokens=ANSWER_TOKENS, run_dir=folder, progress=False).results)

        rank_items = check_subset(run.checks, run.sizes.rank_items)
        rank = sequential_sets(run, out / "cross_rank", [(label, "random") for label in crossed.results],
                               "transferred", answer, run.seed * SEED_STRIDE, run.sizes.random_sets)
        curves = crossed.summary()
        curves.to_csv(out / "cross_masking.csv", index=False)
        masking_drops(curves, k_star).to_csv(out / "transfer_masking.csv", index=False)
        run.evidence["shared"] = ev.transfer_evidence(crossed.results, k_star, seed=run.seed, rank=rank)
    else:
        print("      the two models do not share a head grid: transfer skipped")
    del vlm_b


def vqa_step(run: DemoRun) -> None:
    """Step 9: cross-task VQA with the top k* heads masked, in the clustered design (one fresh control set of each
    kind per scene, on its questions; specialness from the grounding rank test)."""
    run.evidence["vqa"] = None
    if not run.steps.open(9, f"cross-task VQA on the questions of {run.sizes.vqa_scenes} eval scenes, one fresh "
                             "control set of each kind per scene"):
        return
    from vrh_interp.data.datasets.synthetic_vqa import majority_answer_rate, synthetic_vqa
    from vrh_interp.experiments.designs import vqa_scene_design
    from vrh_interp.experiments.vqa_sweep import run_vqa_conditions

    items = synthetic_vqa("eval", run.sizes.vqa_scenes)
    detected = run.ranking[: max(run.ks)]
    pool = run.pool.control_pool(detected, max(run.ks)) if run.pool is not None else None  # as sweep_step's
    conditions, items_of = vqa_scene_design(run.scores.top(run.k_star), run.vlm.geometry, items,
                                            run.seed * SEED_STRIDE, detected=detected, live=pool)
    vqa = run_vqa_conditions(run.vlm, items, conditions, items_of=items_of, batch_size=run.batch_size,
                             run_dir=run.out / "vqa")
    summary = vqa.summary(bootstrap_seed=run.seed)
    majority = {b: majority_answer_rate([s for s in items if s.benchmark == b]) for b in vqa.benchmarks}
    summary["majority_baseline"] = summary["benchmark"].map(majority)
    summary.to_csv(run.out / "vqa_summary.csv", index=False)
    answered = vqa_answered(summary)
    run.evidence["vqa"] = ev.vqa_evidence(vqa, answered, run.k_star, seed=run.seed,
                                          special=run.evidence.get("causal")) if answered else \
        Evidence.categorical("not measured", "the model answers no VQA kind above the majority-answer level")


def judge_claims(run: DemoRun) -> pd.DataFrame:
    """The positive control's evidence, "inconclusive" for the claims of skipped steps, and the verdicts table."""
    from vrh_interp.experiments import positive_control as pc

    evidence, outcome = run.evidence, run.outcome
    if run.run_control:
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
    from vrh_interp.evaluation.claims import CLAIMS

    skipped = {declared.name for declared, _ in demo_steps() if declared.demo_order in run.steps.skipped}
    for claim, spec in CLAIMS.items():  # a claim whose step the cap skipped is undecided, never another verdict
        if spec.experiment in skipped and evidence.get(claim) is None:
            evidence[claim] = Evidence.categorical("inconclusive", "", "not measured within --budget-seconds")
    table = judge(evidence)
    table.to_csv(run.out / "verdicts.csv", index=False)
    return table


def report_step(run: DemoRun, table: pd.DataFrame, overlay_items: int, started: float, as_json: bool) -> int:
    """Step 10: overlays of the top heads, the timing, the report, demo.json and what is printed."""

    out, k_star, outcome = run.out, run.k_star, run.outcome
    if run.steps.open(10, f"attention overlays of the top {max(k_star, 3)} heads on {overlay_items} images; report"):
        write_overlays(run.vlm, check_subset(run.evals, overlay_items), run.scores.top(max(k_star, 3)), out)
    timing = run.steps.table()
    timing.to_csv(out / "timing.csv", index=False)
    paths = write_report(out)
    elapsed = time.perf_counter() - started
    (out / "demo.json").write_text(json.dumps({
        "model": run.model_spec, "transfer_model": run.transfer_model if run.transfer_ready else None,
        "model_choice": run.why, "backend": run.placement.backend,
        "backend_steps": dict(BACKEND_STEPS) if _elsewhere(run) else None, "seconds": elapsed,
        "budget_seconds": run.budget, "seed": run.seed, "k_star": k_star, "ks": run.ks,
        "sizes": dataclasses.asdict(run.sizes), "evaluation_items": len(run.evals), "census": run.pool.summary(),
        "steps": timing.to_dict(orient="records"), "top_heads": run.scores.top(k_star).to_list(),
        "positive_control": outcome, "verdicts": table.to_dict(orient="records")}, indent=2, default=str))
    if as_json:
        print(json.dumps({"verdicts": table.to_dict(orient="records"), "report": str(paths["html"]),
                          "positive_control": None if outcome is None else outcome["verdict"],
                          "census": run.pool.summary(), "seconds": round(elapsed, 1)}, default=str))
        return 0
    print(f"\n{claims_lines(table, TERMINAL_WIDTH)}")  # the reasons and numbers: in the report
    print(f"\nreport: {paths['html']}  ({elapsed:.0f} s" + (f" of a {run.budget:.0f} s cap)" if run.budget else ")"))
    return 0


def control_step(run: DemoRun) -> None:
    """Step 1: the positive control (``positive_control_step``), where it is shipped and asked for."""
    if run.run_control and run.steps.open(1, "positive control: the same pipeline on toy:planted, whose retrieval "
                                             "heads are known"):
        run.outcome = positive_control_step(run.out, run.device, run.batch_size, run.sizes.control_scenes,
                                            placement=run.placement, random_sets=run.sizes.random_sets)


def demo_steps() -> list[tuple[Any, Any]]:
    """(declaration, step function) of every experiment declared with a demo step (``Experiment.demo``), in
    ``demo_order``: steps 1-9, before the report. A new experiment declared with ``demo`` is a step here."""
    from vrh_interp.experiments.declared import demo_steps as declared_steps

    return [(declared, declared.resolve("demo")) for declared in declared_steps()]


def run_demo(*, model_spec: str | None = None, out: Path = Path("runs/demo"), detect_scenes: int | None = None,
             eval_scenes: int | None = None, device: str | None = None, dtype: str | None = None,
             transfer_model: str | None = "auto", as_json: bool = False, batch_size: int = 256,
             random_sets: int | None = None, check_items: int | None = None,
             vqa_scenes: int | None = None, control_scenes: int | None = None, overlay_items: int = 3,
             rank_sets: int | None = None, rank_items: int | None = None,
             positive_control: bool = True, budget_seconds: float | None = None, seed: int = 0,
             placement: Placement = LOCAL) -> int:
    """The whole demo into ``out`` (module doc): ``plan_demo``, then one function per step. Returns the exit status."""
    started = time.perf_counter()
    given = {"detect_scenes": detect_scenes, "eval_scenes": eval_scenes, "check_items": check_items,
             "vqa_scenes": vqa_scenes, "control_scenes": control_scenes, "random_sets": random_sets,
             "rank_sets": rank_sets, "rank_items": rank_items}
    sizes = dataclasses.replace(DEFAULT_SIZES, **{k: v for k, v in given.items() if v is not None})
    run = plan_demo(model_spec, transfer_model, out, sizes, seed=seed, batch_size=batch_size, device=device,
                    dtype=dtype, placement=placement, positive_control=positive_control, overlay_items=overlay_items,
                    budget_seconds=budget_seconds, started=started)
    for declared, step in demo_steps():
        if declared.demo_order >= 2 and run.vlm is None:  # the main model, after the positive control
            load_main_model(run)
        step(run)
    return report_step(run, judge_claims(run), overlay_items, started, as_json)
