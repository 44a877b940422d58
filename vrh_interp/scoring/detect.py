"""``score_heads``: detect VRHs (or any design-space variant) on grounding samples, resumably.

Statistics are collected once per sample (``collect.py``) and, with ``run_dir``, persisted batch by batch
(a safetensors file written atomically, then one JSONL record per sample), so an interrupted detection
resumes where it stopped and any design can later be re-scored from the stored statistics
(``scores_from_stats``) without touching the model again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from safetensors.numpy import load_file, save_file
from tqdm.auto import tqdm

from vrh_interp.model import VLM
from vrh_interp.provenance import library_versions, model_provenance, now_utc
from vrh_interp.runs import RecordLog, RunFolder
from vrh_interp.samples import GroundingSampleLike, check_samples
from vrh_interp.scoring.aggregate import aggregate
from vrh_interp.scoring.collect import SampleStats, collect_batch
from vrh_interp.scoring.design import ScoringDesign, resolve_design
from vrh_interp.scoring.scores import HeadScores


def _save_batch(stats_dir: Path, name: str, batch: Sequence[SampleStats]) -> str:
    tensors: dict[str, np.ndarray] = {}
    for i, s in enumerate(batch):
        tensors[f"{i}.output"] = np.ascontiguousarray(s.output_rows, dtype=np.float32)
        tensors[f"{i}.input"] = np.ascontiguousarray(s.input_rows, dtype=np.float32)
        tensors[f"{i}.entropy"] = np.ascontiguousarray(s.neg_entropy, dtype=np.float64)
    stats_dir.mkdir(parents=True, exist_ok=True)
    path = stats_dir / f"{name}.safetensors"
    tmp = stats_dir / f"{name}.safetensors.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
    return path.name


def load_stats(run_dir: str | Path) -> list[SampleStats]:
    """The per-sample statistics stored by ``score_heads(..., run_dir=...)``, in record order."""
    run_dir = Path(run_dir)
    records = RecordLog(run_dir / "detect_records.jsonl").read()
    cache: dict[str, dict[str, np.ndarray]] = {}
    out = []
    for r in records:
        if r["file"] not in cache:
            cache[r["file"]] = load_file(str(run_dir / "detect_stats" / r["file"]))
        t = cache[r["file"]]
        i = r["index"]
        out.append(SampleStats(r["sample_id"], t[f"{i}.output"], t[f"{i}.input"], t[f"{i}.entropy"],
                               r["region_tokens"], r["answer"], r["iou"], r["parsed"]))
    return out


def scores_from_stats(stats: Sequence[SampleStats], design: ScoringDesign | str,
                      provenance: dict[str, Any] | None = None) -> HeadScores:
    design = resolve_design(design)
    agg = aggregate(stats, design)
    return HeadScores(scores=agg.scores, design=design, per_position=agg.per_position,
                      position_counts=agg.position_counts, sample_ids=agg.used_ids, skipped=agg.skipped,
                      provenance=dict(provenance or {}))


def detection_config(vlm: VLM, samples: Sequence[GroundingSampleLike], *, output_source: str, max_new_tokens: int,
                     dataset: str | None) -> dict[str, Any]:
    return {
        "kind": "detect",
        "model": model_provenance(vlm),
        "dataset": dataset,
        "sample_ids": [s.sample_id for s in samples],
        "output_source": output_source,
        "max_new_tokens": max_new_tokens,
    }


def collect_detection_stats(vlm: VLM, samples: Sequence[GroundingSampleLike], *, batch_size: int = 8,
                            max_new_tokens: int = 24, output_source: str = "greedy",
                            run_dir: str | Path | None = None, dataset: str | None = None,
                            progress: bool = True) -> list[SampleStats]:
    """Collect (or resume collecting) the per-sample statistics every scoring design needs."""
    check_samples(samples, minimum=1, what="detection samples")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    config = detection_config(vlm, samples, output_source=output_source, max_new_tokens=max_new_tokens,
                              dataset=dataset)
    folder = RunFolder(run_dir, config) if run_dir is not None else None
    log = folder.log("detect_records") if folder else None
    done = {r["sample_id"] for r in log.read()} if log else set()
    todo = [s for s in samples if s.sample_id not in done]
    collected: list[SampleStats] = []
    bar = tqdm(total=len(samples), initial=len(samples) - len(todo), desc="detect: scoring samples",
               disable=not progress, unit="sample")
    for start in range(0, len(todo), batch_size):
        chunk = todo[start: start + batch_size]
        batch_stats = collect_batch(vlm, chunk, max_new_tokens=max_new_tokens, output_source=output_source)
        if folder is not None and log is not None:
            name = f"batch-{len(done) + start:06d}-{chunk[0].sample_id}".replace(os.sep, "_")
            file = _save_batch(folder.path / "detect_stats", name, batch_stats)
            log.append({"sample_id": s.sample_id, "file": file, "index": i, "region_tokens": s.region_tokens,
                        "answer": s.answer, "iou": s.iou, "parsed": s.parsed} for i, s in enumerate(batch_stats))
        collected.extend(batch_stats)
        bar.update(len(chunk))
    bar.close()
    if folder is not None:
        by_id = {s.sample_id: s for s in load_stats(folder.path)}
        return [by_id[s.sample_id] for s in samples]
    return collected


def score_heads(vlm: VLM, samples: Sequence[GroundingSampleLike], design: ScoringDesign | str = "vrh", *,
                batch_size: int = 8, max_new_tokens: int = 24, run_dir: str | Path | None = None,
                dataset: str | None = None, progress: bool = True) -> HeadScores:
    """Score every head of ``vlm`` on ``samples`` with ``design`` (a preset name or a ScoringDesign)."""
    design = resolve_design(design)
    stats = collect_detection_stats(vlm, samples, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                    output_source=design.output_source, run_dir=run_dir, dataset=dataset,
                                    progress=progress)
    provenance = {
        **detection_config(vlm, samples, output_source=design.output_source, max_new_tokens=max_new_tokens,
                           dataset=dataset),
        "design": design.as_dict(),
        "libraries": library_versions(),
        "created": now_utc(),
        "grounding_accuracy_at_detection": float(np.mean([s.iou >= 0.5 for s in stats])),
    }
    return scores_from_stats(stats, design, provenance)
