"""``detect``: score every head on grounding samples (``vrh detect``, a grid's detection cells); its spec is
``builtin_specs.DetectSpec``.

The run folder holds the detection records (resumable, ``--shard`` then ``vrh merge``) and ``scores-PRESET.json``,
the file ``vrh sweep --scores`` and a grid's sweep cells read."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrh_interp.experiments.builtin_specs import DetectSpec

if TYPE_CHECKING:
    from vrh_interp.experiments.demo_plan import DemoRun

def scores_path(folder: str | Path, preset_name: str) -> Path:
    """Where a detection run folder keeps the scores of ``preset_name``."""
    return Path(folder) / f"scores-{preset_name}.json"


def run(spec: DetectSpec, vlm: Any, folder: Path) -> Any:
    """The head scores (``scoring.scores.HeadScores``, saved in ``folder``); a shard's detection statistics."""
    from vrh_interp.data.sources import load_data
    from vrh_interp.scoring.design import resolve_design
    from vrh_interp.scoring.detect import collect_detection_stats, score_heads

    samples, dataset = load_data(spec.data), spec.recorded_data or spec.data
    if spec.shard is not None:
        return collect_detection_stats(vlm, samples, batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens,
                                       output_source=resolve_design(spec.preset).output_source, run_dir=folder,
                                       dataset=dataset, shard=spec.shard)
    scores = score_heads(vlm, samples, spec.preset, batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens,
                         run_dir=folder, dataset=dataset, progress=spec.progress)
    scores.save(scores_path(folder, spec.preset))
    return scores


# ------------------------------------------------------------------------------------ its step in `vrh demo`

def demo_step(run: DemoRun) -> None:
    """Step 2: detection, the paper's scores, the head census and the main sweep's conditions."""
    from vrh_interp.experiments.demo_plan import ANSWER_TOKENS, SEED_STRIDE, detect_scores
    from vrh_interp.experiments.designs import scene_design

    run.steps.open(2, f"detecting heads of {run.model_spec} on {len(run.detect)} held-out scenes; head census")
    run.stats, run.scores = detect_scores(run.placed, run.detect, run.out / "detect", run.batch_size)
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
