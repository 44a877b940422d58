"""``vrh demo``: the paper's protocol end to end on a (toy) model, on CPU, next to a positive control. Its spec is
``builtin_specs.DemoSpec`` (checked whole before any model loads); ``run`` plans it (``demo_plan``), runs the declared
demo steps in ``demo_order`` (each in its experiment's module, as a plug-in's: ``positive_control``, ``detect``,
``designs`` (the k-sweep and VQA steps run its clustered designs), ``ablation_check``, ``head_scan``,
``design_space`` (two), ``transfer``), judges the claims and writes ``demo.json``; ``apps.show.demo`` writes the
report and prints the verdicts.

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

from vrh_interp.core.description.model import Placement
from vrh_interp.core.execution.backends.base import backend_config
from vrh_interp.core.execution.backends.select import backend_for, backend_type
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.evaluation.claims import Evidence, judge
from vrh_interp.experiments.builtin_specs import DemoSpec, shipped
from vrh_interp.experiments.demo_plan import (ANSWER_TOKENS, DEFAULT_SIZES, PLAN_FILE, TERMINAL_WIDTH, DemoRun, Steps,
                                              evaluation_items, load)
from vrh_interp.experiments.designs import check_subset
from vrh_interp.experiments.ks import demo_ks

# with --backend transformer-lens: what runs on it, and what stays on nnsight and why (printed, and in demo.json)
BACKEND_STEPS = {
    "transformer-lens": "1 positive control, 2 detection, 3 k-sweep, 4 zero ablation, 5 single-head scan, "
                        "6 design space",
    "nnsight": "2 the head census, 4 mean / resample ablation (the bridge refuses them), 8 transfer (TransformerLens "
               "4.3 has no InternVL adapter), 9 VQA (kept here: the bridge generates uncached) and 10 overlays "
               "(nnsight traces)",
}


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


def plan(spec: DemoSpec, out: Path, started: float) -> DemoRun:
    """The models, sizes and cap of a demo; the request recorded in (or checked against) ``out``."""
    from vrh_interp.experiments import positive_control as pc

    model_spec, transfer_model, why = spec.models()
    if transfer_model and not shipped(transfer_model):
        why += " (its checkpoint is not shipped in this installation: transfer not measured)"
    print(f"main model {model_spec}: {why}", flush=True)
    sizes = dataclasses.replace(DEFAULT_SIZES, **spec.sizes())
    placement = Placement(spec.backend, False)
    run_control = spec.positive_control and pc.available()
    transfer_ready = bool(transfer_model) and shipped(transfer_model)
    budget = float(spec.budget_seconds) if spec.budget_seconds and spec.budget_seconds > 0 else None
    request = {"model": model_spec, "transfer_model": transfer_model if transfer_ready else None,
               "positive_control": run_control, "sizes": dataclasses.asdict(sizes), "seed": spec.seed,
               "overlay_items": spec.overlay_items, **backend_config(backend_type(placement.backend))}
    _request(out, request)
    shown = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(sizes).items())
    print(f"      sizes (fixed, not from a clock): {shown}; seed {spec.seed}"
          + (f"; capped at {budget:g} s (claims of skipped steps: inconclusive)" if budget else ""), flush=True)
    return DemoRun(out, model_spec, transfer_model, why, sizes, spec.seed, spec.batch_size, spec.device, spec.dtype,
                   placement, run_control, transfer_ready, budget, Steps(started, budget))


def load_main_model(run: DemoRun) -> None:
    """The main model (on nnsight, and placed: ``DemoRun.placed``, its backend built here so that an unsupported
    family is refused before any step) and the fixed items: detection scenes, evaluation items, check subset, ks."""
    run.vlm = load(run.model_spec, run.device, run.dtype)
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


@dataclasses.dataclass
class DemoResult:
    """A finished demo: its verdicts (``evaluation.claims.judge``), what ``demo.json`` holds, when it started."""

    out: Path
    verdicts: pd.DataFrame
    summary: dict[str, Any]
    started: float


def finish(run: DemoRun, table: pd.DataFrame, overlay_items: int, started: float) -> DemoResult:
    """Step 10: overlays of the top heads, the timing table and ``demo.json`` (the report: ``apps.show.demo``)."""
    out, k_star = run.out, run.k_star
    if run.steps.open(10, f"attention overlays of the top {max(k_star, 3)} heads on {overlay_items} images; report"):
        write_overlays(run.vlm, check_subset(run.evals, overlay_items), run.scores.top(max(k_star, 3)), out)
    timing = run.steps.table()
    timing.to_csv(out / "timing.csv", index=False)
    summary = {
        "model": run.model_spec, "transfer_model": run.transfer_model if run.transfer_ready else None,
        "model_choice": run.why, "backend": run.placement.backend,
        "backend_steps": dict(BACKEND_STEPS) if _elsewhere(run) else None,
        "seconds": time.perf_counter() - started, "budget_seconds": run.budget, "seed": run.seed, "k_star": k_star,
        "ks": run.ks, "sizes": dataclasses.asdict(run.sizes), "evaluation_items": len(run.evals),
        "census": run.pool.summary(), "steps": timing.to_dict(orient="records"),
        "top_heads": run.scores.top(k_star).to_list(), "positive_control": run.outcome,
        "verdicts": table.to_dict(orient="records")}
    (out / "demo.json").write_text(json.dumps(summary, indent=2, default=str))
    return DemoResult(out, table, summary, started)


def demo_steps() -> list[tuple[Any, Any]]:
    """(declaration, step function) of every experiment declared with a demo step (``Experiment.demo``), in
    ``demo_order``: steps 1-9, before the overlays and the report. A new experiment declared with ``demo`` is a step
    here."""
    from vrh_interp.experiments.declared import demo_steps as declared_steps

    return [(declared, declared.resolve("demo")) for declared in declared_steps()]


def run(spec: DemoSpec, vlm: Any, folder: Path) -> DemoResult:
    """The whole demo into ``folder`` (module doc): ``plan``, then every declared step (the main model loaded after
    the positive control), the verdicts and ``finish``. ``vlm`` is None: the demo loads its own models."""
    started = time.perf_counter()
    demo = plan(spec, Path(folder), started)
    for declared, step in demo_steps():
        if declared.demo_order >= 2 and demo.vlm is None:  # the main model, after the positive control
            load_main_model(demo)
        step(demo)
    return finish(demo, judge_claims(demo), spec.overlay_items, started)
