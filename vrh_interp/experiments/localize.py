"""Attention boxes beside the model's own boxes: does a head set know where the referent is when the answer does not?

Localization Heads (Kang et al., CVPR 2025) read a box from a few heads' attention and report RefCOCO Acc@0.5 of
86.5 / 89.8 / 80.2 on LLaVA-1.5-7B, but never beside the same model's generated boxes on the same items. Here both
are scored on the same items: per item the model's greedy answer (parsed in its family's native format,
``evaluation.grounding``) and the attention box of each head set (``evaluation.attention_box``, read from the
query rows of the same prompt; ``query="output"``: the rows of that greedy answer), each right when its IoU with
the ground truth is at least ``iou_threshold``. The four-way table per head set: ``both`` right, ``heads_only``
("knows where, says otherwise"), ``answer_only``, ``neither``; Acc@0.5 of each side, and the exact McNemar test
between them on the discordant items (two-sided, ``statistics.mcnemar_exact``; and each one-sided direction,
``inference.drop_p``).

A run folder (``run_dir``) holds the manifest (model, samples, head sets, readout, answer budget: a rerun with
another configuration is refused) and one record per (head set, sample), appended per batch: a rerun resumes.
``localize_from_run`` reads a folder without the model; ``write_localize`` writes ``localize.csv`` (the records),
``localize_summary.csv`` (one row per head set) and ``localize.json`` (the summary with the provenance).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from vrh_interp.core._display import Card
from tqdm.auto import tqdm

from vrh_interp.core.execution.backends.base import backend_config
from vrh_interp.core.execution.backends.select import backend_for
from vrh_interp.core.description.heads import HeadSet, HeadsLike
from vrh_interp.core.execution.limits import check_prompts_fit
from vrh_interp.core.description.model import VLM
from vrh_interp.core.bookkeeping.provenance import library_versions, model_provenance
from vrh_interp.core.bookkeeping.runs import RunFolder, whole_run_manifest, write_atomic
from vrh_interp.core.execution.templates.ablation import ZERO_ABLATION
from vrh_interp.data.checks import GroundingSampleLike, as_box, check_samples
from vrh_interp.evaluation.attention_box import BoxReadout, attention_boxes
from vrh_interp.evaluation.grounding import _outcomes
from vrh_interp.evaluation.inference import drop_p
from vrh_interp.evaluation.statistics import mcnemar_exact
from vrh_interp.experiments.declared import experiment

LOCALIZE = experiment("localize")
OUTCOMES: tuple[str, ...] = ("both", "heads_only", "answer_only", "neither")
RECORD_FIELDS = ("heads", "sample_id", "truth", "answer", "parsed", "answer_box", "answer_iou", "heads_box",
                 "heads_iou", "components")
CSV, SUMMARY_CSV, JSON = "localize.csv", "localize_summary.csv", "localize.json"


def outcome(heads_right: bool, answer_right: bool) -> str:
    """The four-way cell of one item: ``both``, ``heads_only``, ``answer_only`` or ``neither``."""
    if heads_right:
        return "both" if answer_right else "heads_only"
    return "answer_only" if answer_right else "neither"


@dataclass(repr=False)
class LocalizeResult(Card):
    """One record per (head set, sample) (``records``), the head sets in order, the readout and the threshold."""

    records: pd.DataFrame
    head_sets: dict[str, list[str]]
    readout: BoxReadout
    iou_threshold: float = 0.5
    provenance: dict[str, Any] | None = None

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        """Per head set the two accuracies and the four-way counts (not the records frame)."""
        rows = [(str(r["heads"]), f"attention box {r['heads_acc']:.2f} vs generated box {r['answer_acc']:.2f} on "
                 f"{r['n']} items; " + " / ".join(f"{r[name]}" for name in OUTCOMES) + f" ({' / '.join(OUTCOMES)})")
                for r in self.summary().to_dict(orient="records")]
        return (f"LocalizeResult: Acc@{self.iou_threshold:g} of attention boxes beside the model's own (summary(), "
                "four_way(), items())", rows[:8])

    def items(self) -> pd.DataFrame:
        """The records with ``heads_right``, ``answer_right`` and the four-way ``outcome`` of each."""
        frame = self.records.copy()
        frame["heads_right"] = frame["heads_iou"] >= self.iou_threshold
        frame["answer_right"] = frame["answer_iou"] >= self.iou_threshold
        frame["outcome"] = [outcome(h, a) for h, a in zip(frame["heads_right"], frame["answer_right"])]
        return frame

    def summary(self) -> pd.DataFrame:
        """One row per head set: ``n``, Acc@IoU of the attention box (``heads_acc``) and of the generated box
        (``answer_acc``), their mean IoUs, the four-way counts, the two-sided exact McNemar ``mcnemar_p`` and the
        one-sided ``p_heads_better`` / ``p_answer_better``, the share of items with no attention box."""
        rows = []
        items = self.items()
        for label in self.head_sets:
            part = items[items["heads"] == label]
            heads, answer = part["heads_right"].to_numpy(), part["answer_right"].to_numpy()
            counts = {name: int((part["outcome"] == name).sum()) for name in OUTCOMES}
            rows.append({"heads": label, "n": len(part), "heads_acc": float(heads.mean()) if len(part) else np.nan,
                         "answer_acc": float(answer.mean()) if len(part) else np.nan,
                         "heads_mean_iou": float(part["heads_iou"].mean()),
                         "answer_mean_iou": float(part["answer_iou"].mean()), **counts,
                         "mcnemar_p": mcnemar_exact(heads, answer)["p_value"],
                         "p_heads_better": drop_p(heads, answer)[0], "p_answer_better": drop_p(answer, heads)[0],
                         "no_box": float(part["heads_box"].isna().mean())})
        return pd.DataFrame(rows)

    def four_way(self, heads: str | None = None) -> pd.DataFrame:
        """The 2 x 2 table of one head set (default: the first): rows attention box right / wrong, columns
        generated box right / wrong."""
        label = heads if heads is not None else next(iter(self.head_sets))
        part = self.items()
        part = part[part["heads"] == label]
        table = pd.crosstab(part["heads_right"], part["answer_right"]).reindex(index=[True, False],
                                                                                columns=[True, False], fill_value=0)
        table.index = ["attention box right", "attention box wrong"]
        table.columns = ["generated box right", "generated box wrong"]
        return table


def _label_sets(head_sets: Mapping[str, HeadsLike] | HeadsLike, vlm: VLM) -> dict[str, HeadSet]:
    """``{label: heads}``; a single head set is labelled by its text."""
    if isinstance(head_sets, Mapping):
        sets = {str(k): vlm.geometry.validate(v, f"head_sets[{k!r}]") for k, v in head_sets.items()}
    else:
        heads = vlm.geometry.validate(head_sets, "head_sets")
        sets = {str(heads): heads}
    if not sets or any(not len(h) for h in sets.values()):
        raise ValueError("localize needs at least one head set, each of at least one head")
    return sets


def _batch_records(vlm: VLM, chunk: Sequence[GroundingSampleLike], sets: Mapping[str, HeadSet], readout: BoxReadout,
                   max_new_tokens: int) -> list[dict[str, Any]]:
    """The records of one batch: one greedy generation, then one row readout per head set."""
    batch = vlm.encode_grounding([s.image for s in chunk], [s.expression for s in chunk])
    ids = backend_for(vlm).generate_conditions(batch.encoding, [(None, ZERO_ABLATION)], max_new_tokens=max_new_tokens,
                                               sample_ids=[s.sample_id for s in chunk])[0]
    outcomes = _outcomes(vlm, chunk, batch, ids)
    s = batch.prompt_length
    lengths = vlm.answer_lengths(ids, s)
    answer_ids = [ids[i, s: s + n].tolist() for i, n in enumerate(lengths)]
    records = []
    for label, heads in sets.items():
        boxes = attention_boxes(vlm, batch, heads, readout, answer_ids=answer_ids)
        for sample, found, answer in zip(chunk, boxes, outcomes):
            truth = as_box(sample.box)
            records.append({"heads": label, "sample_id": sample.sample_id, "truth": list(truth.as_tuple()),
                            "answer": answer.answer, "parsed": answer.parsed,
                            "answer_box": list(answer.box) if answer.box is not None else None,
                            "answer_iou": answer.iou,
                            "heads_box": list(found.box.as_tuple()) if found.box is not None else None,
                            "heads_iou": found.iou(truth), "components": found.components})
    return records


def localize(vlm: VLM, samples: Sequence[GroundingSampleLike], head_sets: Mapping[str, HeadsLike] | HeadsLike,
             readout: BoxReadout = BoxReadout(), *, iou_threshold: float = 0.5, batch_size: int = 8,
             max_new_tokens: int = 24, run_dir: str | Path | None = None, progress: bool = True,
             heads_source: Mapping[str, Any] | None = None) -> LocalizeResult:
    """The attention box of each head set (``{label: heads}``, or one head set) beside the model's generated box on
    ``samples`` (module doc); resumable through ``run_dir``. ``heads_source``: how the heads were chosen (e.g. the
    detection preset and its samples), recorded in the manifest."""
    check_samples(samples, minimum=1, what="localization samples")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold={iou_threshold} is not in (0, 1]")
    check_prompts_fit(vlm, samples, max_new_tokens)
    sets = _label_sets(head_sets, vlm)
    config = {"kind": LOCALIZE.name, "model": model_provenance(vlm), "sample_ids": [s.sample_id for s in samples],
              "head_sets": {k: v.to_list() for k, v in sets.items()}, "readout": readout.as_dict(),
              "max_new_tokens": max_new_tokens,
              "libraries": {k: v for k, v in library_versions().items() if k in ("transformers", "torch")},
              **backend_config(backend_for(vlm))}
    if heads_source is not None:
        config["heads_source"] = dict(heads_source)
    folder = RunFolder(run_dir, config) if run_dir is not None else None
    log = LOCALIZE.open_log(folder) if folder is not None else None
    records = log.read() if log is not None else []
    recorded = {(r["heads"], r["sample_id"]) for r in records}
    done = {s.sample_id for s in samples if all((label, s.sample_id) in recorded for label in sets)}
    todo = [s for s in samples if s.sample_id not in done]
    bar = tqdm(total=len(samples), initial=len(samples) - len(todo), desc="localize: attention vs generated boxes",
               disable=not progress, unit="sample", leave=False)
    for start in range(0, len(todo), batch_size):
        chunk = todo[start: start + batch_size]
        new = _batch_records(vlm, chunk, sets, readout, max_new_tokens)
        if log is not None:
            log.append(new)
        records += new
        bar.update(len(chunk))
    bar.close()
    return LocalizeResult(_frame(records, list(sets), [s.sample_id for s in samples]),
                          {k: v.to_list() for k, v in sets.items()}, readout, iou_threshold, config)


def _frame(records: Sequence[Mapping[str, Any]], labels: Sequence[str], sample_ids: Sequence[str]) -> pd.DataFrame:
    """Records in head-set order, then sample order (whatever order a resumed run appended them in)."""
    frame = pd.DataFrame([{f: r.get(f) for f in RECORD_FIELDS} for r in records], columns=list(RECORD_FIELDS))
    frame = frame.drop_duplicates(subset=["heads", "sample_id"], keep="last")
    order, position = {k: i for i, k in enumerate(labels)}, {k: i for i, k in enumerate(sample_ids)}
    frame = frame.assign(_h=frame["heads"].map(order), _s=frame["sample_id"].map(position))
    return frame.sort_values(["_h", "_s"]).drop(columns=["_h", "_s"]).reset_index(drop=True)


def localize_from_run(run_dir: str | Path, *, iou_threshold: float = 0.5) -> LocalizeResult:
    """A finished localize folder, read without the model (what ``localize`` returned)."""
    config = whole_run_manifest(Path(run_dir), LOCALIZE.name, "a localize run")
    records = LOCALIZE.read_log(run_dir).read()
    labels = list(config["head_sets"])
    missing = len(labels) * len(config["sample_ids"]) - len({(r["heads"], r["sample_id"]) for r in records})
    if missing:
        raise ValueError(f"{run_dir} is incomplete: {missing} (head set, sample) records are missing; rerun its "
                         "command to resume it")
    return LocalizeResult(_frame(records, labels, config["sample_ids"]), dict(config["head_sets"]),
                          BoxReadout(**config["readout"]), iou_threshold, config)


def write_localize(result: LocalizeResult, out: str | Path) -> dict[str, Any]:
    """``OUT/localize.csv`` (the items with their outcome), ``OUT/localize_summary.csv`` and ``OUT/localize.json``
    (the summary, the four-way tables, the readout, the threshold and the provenance); returns the JSON's content."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = result.items()
    frame = items.assign(**{c: items[c].map(lambda v: None if v is None else json.dumps(v))
                            for c in ("truth", "answer_box", "heads_box")})
    write_atomic(out / CSV, frame.to_csv(index=False))
    summary = result.summary()
    write_atomic(out / SUMMARY_CSV, summary.to_csv(index=False))
    facts = {"iou_threshold": result.iou_threshold, "readout": result.readout.as_dict(),
             "head_sets": result.head_sets, "summary": json.loads(summary.to_json(orient="records")),
             "provenance": result.provenance or {}}
    write_atomic(out / JSON, json.dumps(facts, indent=2, default=str) + "\n")
    return facts


def _head_sets(spec: Any, vlm: VLM, folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({label: heads}, how they were chosen)`` from ``heads``, ``scores`` or a detection run here."""
    from vrh_interp.core.description.published import check_geometry, parse_heads
    from vrh_interp.data.sources import load_data
    from vrh_interp.scoring.detect import score_heads
    from vrh_interp.scoring.scores import HeadScores

    if spec.heads is not None:
        return {spec.heads: check_geometry(parse_heads(spec.heads), vlm.geometry)}, {"heads": spec.heads}
    if spec.scores is not None:
        scores = HeadScores.load(spec.scores)
        return {f"{scores.design.label} top-{spec.k}": scores.top(spec.k)}, {"scores": str(spec.scores), "k": spec.k}
    detection = list(load_data(spec.detection_data))
    evaluation = {s.sample_id for s in load_data(spec.data)}
    overlap = sorted(evaluation & {s.sample_id for s in detection})
    if overlap:
        raise ValueError(f"{len(overlap)} --data samples are also --detect-data samples (e.g. {overlap[:3]}): the "
                         "heads must be chosen on other items than they are tested on")
    scores = score_heads(vlm, detection, spec.preset, batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens,
                         run_dir=folder / "detect", progress=spec.progress)
    return ({f"{spec.preset} top-{spec.k}": scores.top(spec.k)},
            {"preset": spec.preset, "k": spec.k, "detect_data": spec.detection_data})


def run(spec: Any, vlm: VLM, folder: Path) -> LocalizeResult:
    """``vrh localize`` / a grid's cell (``builtin_specs.LocalizeSpec``): the attention box of the head set beside
    the generated box on every item, ``localize.csv`` and ``localize.json`` in ``folder``."""
    from vrh_interp.data.sources import load_data

    readout = BoxReadout(sigma=spec.sigma, threshold=spec.threshold, component=spec.component, blocks=spec.blocks,
                         query=spec.query)
    sets, source = _head_sets(spec, vlm, folder)
    result = localize(vlm, list(load_data(spec.data)), sets, readout, iou_threshold=spec.iou,
                      batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens, run_dir=folder / "localize",
                      progress=spec.progress, heads_source=source)
    write_localize(result, folder)
    return result
