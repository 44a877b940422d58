"""``score_heads``: detect VRHs (or any design-space variant) on grounding samples, resumably.

Statistics are collected once per sample (``collect.py``) and, with ``run_dir``, persisted batch by batch
(a safetensors file written atomically, then one JSONL record per sample), so an interrupted detection
resumes where it stopped and any design can later be re-scored from the stored statistics
(``scores_from_stats``) without touching the model again. ``collect_detection_stats(..., shard=...)`` collects
one shard's samples; ``scores_from_run`` scores a merged (or any complete) run folder without the model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from safetensors.numpy import load_file, save
from tqdm.auto import tqdm

from vrh_interp.core.execution.backends.base import Backend, backend_config
from vrh_interp.core.execution.backends.select import backend_for
from vrh_interp.core.description.model import VLM
from vrh_interp.core.bookkeeping.provenance import library_versions, model_provenance, now_utc, remote_provenance
from vrh_interp.core.bookkeeping.runs import RecordLog, RunFolder, whole_run_manifest, write_atomic
from vrh_interp.core.execution.limits import check_prompts_fit
from vrh_interp.data.checks import GroundingSampleLike, check_samples
from vrh_interp.scoring.aggregate import aggregate
from vrh_interp.scoring.collect import SampleStats, batch_stats
from vrh_interp.scoring.design import ScoringDesign, resolve_design
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.core.bookkeeping.shards import Shard, shard_config

LOG = "detect_records"  # the record log (LOG.jsonl) of a detection run folder: one record per sample
RECORD_KEY = ("sample_id",)  # what names a record's unit; the "detect" declaration in experiments.declared


def _save_batch(stats_dir: Path, name: str, batch: Sequence[SampleStats]) -> str:
    tensors: dict[str, np.ndarray] = {}
    for i, s in enumerate(batch):
        tensors[f"{i}.output"] = np.ascontiguousarray(s.output_rows, dtype=np.float32)
        tensors[f"{i}.input"] = np.ascontiguousarray(s.input_rows, dtype=np.float32)
        tensors[f"{i}.entropy"] = np.ascontiguousarray(s.neg_entropy, dtype=np.float64)
        optional = {"entropy_mass": (s.neg_entropy_mass, np.float64), "image_mass": (s.image_mass, np.float64),
                    "next": (s.next_row, np.float32), "gold": (s.gold_tokens, np.uint8)}
        for key, (value, dtype) in optional.items():
            if value is not None:
                tensors[f"{i}.{key}"] = np.ascontiguousarray(value, dtype=dtype)
    stats_dir.mkdir(parents=True, exist_ok=True)
    return write_atomic(stats_dir / f"{name}.safetensors", save(tensors)).name


def load_stats(run_dir: str | Path) -> list[SampleStats]:
    """The per-sample statistics stored by ``score_heads(..., run_dir=...)``, in record order."""
    run_dir = Path(run_dir)
    records = RecordLog(run_dir / f"{LOG}.jsonl", key_fields=RECORD_KEY).read()
    cache: dict[str, dict[str, np.ndarray]] = {}
    out = []
    for r in records:
        if r["file"] not in cache:
            cache[r["file"]] = load_file(str(run_dir / "detect_stats" / r["file"]))
        t = cache[r["file"]]
        i = r["index"]
        gold = t.get(f"{i}.gold")
        # statistics stored before the released-code presets lack the optional arrays: those presets then refuse
        out.append(SampleStats(r["sample_id"], t[f"{i}.output"], t[f"{i}.input"], t[f"{i}.entropy"],
                               r["region_tokens"], r["answer"], r["iou"], r["parsed"],
                               neg_entropy_mass=t.get(f"{i}.entropy_mass"), image_mass=t.get(f"{i}.image_mass"),
                               next_row=t.get(f"{i}.next"), gold_tokens=None if gold is None else gold.astype(bool),
                               grade=r.get("grade")))
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
                            progress: bool = True, shard: Shard | None = None) -> list[SampleStats]:
    """Collect (or resume collecting) the per-sample statistics every scoring design needs.

    A remote handle (``vlm.on(remote=True)``: NDIF at nnsight's configured host; ``"local"``: serialised as for
    NDIF, run here) sends one request per batch of ``batch_size`` samples. Remote is not part of the run folder's
    configuration: remote and local runs give the same statistics, so either may resume the other.

    With ``shard``, only that shard's samples (``Shard.select``) are processed and returned; ``samples`` is
    still the full list (the run folder records it, so ``merge_runs`` can check the shards fit together).

    The handle's backend (``vlm.on(backend=...)``) IS part of the configuration when it is not nnsight: a run folder
    never mixes backends.
    """
    return _detection_stats(backend_for(vlm), samples, batch_size=batch_size,
                            max_new_tokens=max_new_tokens, output_source=output_source, run_dir=run_dir,
                            dataset=dataset, progress=progress, shard=shard)


def _detection_stats(runner: Backend, samples: Sequence[GroundingSampleLike], *, batch_size: int,
                     max_new_tokens: int, output_source: str, run_dir: str | Path | None, dataset: str | None,
                     progress: bool, shard: Shard | None = None) -> list[SampleStats]:
    """``collect_detection_stats`` on a backend already built (``score_heads`` resolves its backend once)."""
    vlm = runner.vlm
    check_samples(samples, minimum=1, what="detection samples")
    check_prompts_fit(vlm, samples, max_new_tokens)
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    config = shard_config({**detection_config(vlm, samples, output_source=output_source, max_new_tokens=max_new_tokens,
                                              dataset=dataset), **backend_config(runner)}, shard, batch_size)
    mine = shard.select(samples, batch_size) if shard is not None else list(samples)
    position = {s.sample_id: p for p, s in enumerate(samples)}
    folder = RunFolder(run_dir, config) if run_dir is not None else None
    log = folder.log(LOG, key_fields=RECORD_KEY) if folder else None
    done = {r["sample_id"] for r in log.read()} if log else set()
    todo = [s for s in mine if s.sample_id not in done]
    collected: list[SampleStats] = []
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc="detect: scoring samples",
               disable=not progress, unit="sample", leave=False)
    for start in range(0, len(todo), batch_size):
        chunk = todo[start: start + batch_size]
        collected_now = batch_stats(runner, chunk, max_new_tokens=max_new_tokens, output_source=output_source)
        if folder is not None and log is not None:
            # named by the batch's position in the FULL list: a shard writes the files an unsharded run writes
            name = f"batch-{position[chunk[0].sample_id]:06d}-{chunk[0].sample_id}".replace(os.sep, "_")
            file = _save_batch(folder.path / "detect_stats", name, collected_now)
            log.append({"sample_id": s.sample_id, "file": file, "index": i, "region_tokens": s.region_tokens,
                        "answer": s.answer, "iou": s.iou, "parsed": s.parsed, "grade": s.grade}
                       for i, s in enumerate(collected_now))
        collected.extend(collected_now)
        bar.update(len(chunk))
    bar.close()
    if folder is not None:
        by_id = {s.sample_id: s for s in load_stats(folder.path)}
        return [by_id[s.sample_id] for s in mine]
    return collected


def score_heads(vlm: VLM, samples: Sequence[GroundingSampleLike], design: ScoringDesign | str = "vrh", *,
                batch_size: int = 8, max_new_tokens: int = 24, run_dir: str | Path | None = None,
                dataset: str | None = None, progress: bool = True) -> HeadScores:
    """Score every head of ``vlm`` on ``samples`` with ``design`` (a preset name or a ScoringDesign).

    Where it runs is the handle's (``vlm.on(backend=..., remote=...)``). A remote handle runs the model on NDIF
    (``remote=True``, nnsight's configured host and API key) or serialises as for NDIF and runs in-process
    (``"local"``), one request per batch; the scores equal a local run's. The provenance records only whether the
    run was remote (``remote_provenance``), never the host or key. A backend other than nnsight
    ("transformer-lens") is recorded in the provenance and the run folder. The scores equal nnsight's
    within the tolerance docs/recipes/transformer-lens.md states.

    To split the work across machines, shard ``collect_detection_stats`` instead, merge the shard folders
    (``vrh_interp.experiments.merge.merge_runs``) and score the merged folder with ``scores_from_run``.
    """
    design = resolve_design(design)
    runner = backend_for(vlm)
    stats = _detection_stats(runner, samples, batch_size=batch_size, max_new_tokens=max_new_tokens,
                             output_source=design.output_source, run_dir=run_dir, dataset=dataset, progress=progress)
    config = {**detection_config(vlm, samples, output_source=design.output_source, max_new_tokens=max_new_tokens,
                                 dataset=dataset), **backend_config(runner)}
    return scores_from_stats(stats, design, {**_provenance(config, design, stats),
                                             "remote": remote_provenance(vlm)})


def scores_from_run(run_dir: str | Path, design: ScoringDesign | str = "vrh") -> HeadScores:
    """Score a complete detection run folder (e.g. merged shards) without the model: what ``score_heads`` on
    the same samples returns (provenance from the folder's manifest)."""
    design = resolve_design(design)
    config = _complete_detection_config(Path(run_dir))
    if config["output_source"] != design.output_source:
        raise ValueError(f"{run_dir} holds {config['output_source']!r} statistics; design {design.label} needs "
                         f"{design.output_source!r} ones")
    stats = stats_from_run(run_dir)
    return scores_from_stats(stats, design, _provenance(config, design, stats))


def stats_from_run(run_dir: str | Path) -> list[SampleStats]:
    """The statistics of a complete (unsharded or merged) detection run folder, in the run's sample order: what
    ``collect_detection_stats`` returned for it."""
    run_dir = Path(run_dir)
    config = _complete_detection_config(run_dir)
    by_id = {s.sample_id: s for s in load_stats(run_dir)}
    return [by_id[i] for i in config["sample_ids"]]


def _complete_detection_config(run_dir: Path) -> dict[str, Any]:
    """The manifest of a detection run folder, after checking the folder is a whole run with every sample."""
    config = whole_run_manifest(run_dir, "detect", "a detection run")
    done = {r["sample_id"] for r in RecordLog(run_dir / f"{LOG}.jsonl", key_fields=RECORD_KEY).read()}
    missing = [i for i in config["sample_ids"] if i not in done]
    if missing:
        raise ValueError(f"{run_dir} is incomplete: {len(missing)} of {len(config['sample_ids'])} samples have no "
                         f"statistics (e.g. {missing[:3]}); rerun its command to resume it")
    return config


def _provenance(config: dict[str, Any], design: ScoringDesign, stats: Sequence[SampleStats]) -> dict[str, Any]:
    return {
        **config,
        "design": design.as_dict(),
        "libraries": library_versions(),
        "created": now_utc(),
        "grounding_accuracy_at_detection": float(np.mean([s.iou >= 0.5 for s in stats])),
    }
