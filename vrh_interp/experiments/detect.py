"""``detect``: score every head on grounding samples (``vrh detect``, a grid's detection cells); its spec is
``builtin_specs.DetectSpec``.

The run folder holds the detection records (resumable, ``--shard`` then ``vrh merge``) and ``scores-PRESET.json``,
the file ``vrh sweep --scores`` and a grid's sweep cells read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vrh_interp.experiments.builtin_specs import DetectSpec

def scores_path(folder: str | Path, preset_name: str) -> Path:
    """Where a detection run folder keeps the scores of ``preset_name``."""
    return Path(folder) / f"scores-{preset_name}.json"


def run(spec: DetectSpec, vlm: Any, folder: Path) -> Any:
    """The head scores (``scoring.scores.HeadScores``, saved in ``folder``); a shard's detection statistics."""
    from vrh_interp.data.sources import load_data
    from vrh_interp.scoring.design import resolve_design
    from vrh_interp.scoring.detect import collect_detection_stats, score_heads

    samples = load_data(spec.data)
    if spec.shard is not None:
        return collect_detection_stats(vlm, samples, batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens,
                                       output_source=resolve_design(spec.preset).output_source, run_dir=folder,
                                       dataset=spec.data, shard=spec.shard)
    scores = score_heads(vlm, samples, spec.preset, batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens,
                         run_dir=folder, dataset=spec.data, progress=spec.progress)
    scores.save(scores_path(folder, spec.preset))
    return scores
