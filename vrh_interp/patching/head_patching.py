"""Head-output patching: copy chosen heads' outputs from the clean run into the corrupted run.

A head's output is its ``head_dim`` slice of the output projection's input (the site ablation zeroes).
Patching it from clean into corrupted and measuring how much of the clean-vs-corrupted metric comes back
(``recovery``; the whole-answer metric by default, see ``vrh_interp.patching.batch``) asks: is this head's
output, at these positions, SUFFICIENT to carry the clean input's answer? The complementary question
(necessary?) is ablation.

``patch_sets`` patches many head sets, each alone and exactly, batched: one forward holds the clean rows
and one copy of the corrupted rows per set (``RowPairHeadPatch``), so ``sets_per_forward`` sets cost one
pass; ``patch_each_head`` is that with one head per set. ``patch_head_set`` patches one set (e.g. the
detected VRHs) with its CI and per-coordinate recovery, and ``patched_answers`` lets the corrupted run
generate freely after a prefill-only patch, to read the effect on the box itself (IoU with the clean box).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import nnsight
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core._display import Card, mean_spread
from vrh_interp.core.description.boxes import BoxParseFailure
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.patching.batch import (GROUPS, Baseline, PairBatch, PatchPositions, baseline, measure, per_coordinate,
                                       recovery, recovery_ci)
from vrh_interp.data.checks import as_box
from vrh_interp.core.execution.templates import apply_in_order
from vrh_interp.core.execution.templates.head_outputs import RowPairHeadPatch


def recovery_card(name: str, frame: pd.DataFrame, top: int = 5) -> tuple[str, list[tuple[str, str]]]:
    """The card of a per-head recovery table (columns ``head``, ``recovery``, ``ci_low``, ``ci_high``, ``n_pairs``
    and the ``positions`` / ``metric`` / ``method`` it was measured with): the heads that recover most."""
    facts = [f"{frame[column].iloc[0]} {column}" for column in ("metric", "positions", "method")
             if column in frame and len(frame)]
    pairs = f", {int(frame['n_pairs'].iloc[0])} pairs" if "n_pairs" in frame and len(frame) else ""
    best = frame.sort_values("recovery", ascending=False).head(top) if len(frame) else frame
    rows = [(f"top {len(best)}", ", ".join(f"{r.head} {r.recovery:.3g} [{r.ci_low:.2g}, {r.ci_high:.2g}]"
                                           for r in best.itertuples()) or "none"),
            ("recovery", mean_spread(frame["recovery"]) if "recovery" in frame else "n/a")]
    if facts:
        rows.append(("measured", ", ".join(facts)))
    return f"{name}: {len(frame)} heads{pairs} (frame: the table)", rows


def recovery_table(frame: pd.DataFrame, top: int = 10) -> str:
    """The ``top`` heads by recovery as HTML (a notebook's view of a recovery card)."""
    columns = [c for c in ("head", "recovery", "ci_low", "ci_high") if c in frame]
    best = frame.sort_values("recovery", ascending=False).head(top) if "recovery" in frame else frame.head(top)
    return best[columns].to_html(index=False, float_format="{:.3g}".format)


@dataclass(repr=False)
class HeadPatchingResult(Card):
    """Per-head recovery (``frame``), the per-pair patched metric (and split by group) and the baseline; shown as
    the heads that recover most."""

    frame: pd.DataFrame
    per_pair: dict[Head, np.ndarray]  # [n]
    baseline: Baseline
    parts: dict[Head, np.ndarray] | None = None  # [n, len(GROUPS)]

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        return recovery_card("HeadPatchingResult", self.frame)

    def _card_table(self) -> str:
        return recovery_table(self.frame)

    def recovery_grid(self, num_layers: int, num_heads: int) -> np.ndarray:
        grid = np.full((num_layers, num_heads), np.nan)
        for row in self.frame.itertuples():
            grid[row.layer, row.head_index] = row.recovery
        return grid

    def heatmap(self, num_layers: int | None = None, num_heads: int | None = None, *,
                title: str = "recovery per head", ax: Any = None) -> Any:
        """Layer x head heatmap of the recovery (``viz.plots.patching_heatmap``; the grid defaults to the patched
        heads' extent): a ``Figure`` a notebook shows as a picture, or drawn into ``ax`` (then its figure)."""
        from vrh_interp.viz.plots import patching_heatmap

        layers = num_layers if num_layers is not None else int(self.frame["layer"].max()) + 1
        heads = num_heads if num_heads is not None else int(self.frame["head_index"].max()) + 1
        return patching_heatmap(self.recovery_grid(layers, heads), title, ax=ax)


def patch_sets(vlm: VLM, pairs: PairBatch, sets: Sequence[HeadSet], *, positions: PatchPositions = "answer",
               sets_per_forward: int = 8, progress: bool = False,
               desc: str = "patching head sets") -> np.ndarray:
    """The patched metric by group, ``[len(sets), n, len(GROUPS)]``: each set patched alone, exactly, with
    ``sets_per_forward`` sets per pass (one corrupted copy per set, ``RowPairHeadPatch``)."""
    sets = [vlm.geometry.validate(heads) for heads in sets]
    clean_rows = pairs.clean_rows()
    out = []
    chunks = [sets[i: i + sets_per_forward] for i in range(0, len(sets), sets_per_forward)]
    for chunk in tqdm(chunks, desc=desc, disable=not progress):
        _, encoding = pairs.encode(vlm, copies=len(chunk))
        pairs.require_aligned(encoding, positions)
        entries = [(head, clean_rows, pairs.corrupted_rows(k)) for k, heads in enumerate(chunk) for head in heads]
        templates = [RowPairHeadPatch.build(entries, vlm.geometry, iv.projection_path(vlm),
                                            positions=pairs.positions(positions))] if entries else []
        out.append(measure(vlm, pairs, encoding, range(1, len(chunk) + 1), templates=templates))
    return np.concatenate(out) if out else np.zeros((0, pairs.n, len(GROUPS)))


def patch_each_head(vlm: VLM, pairs: PairBatch, *, positions: PatchPositions = "answer", heads: HeadSet | None = None,
                    heads_per_forward: int = 8, base: Baseline | None = None,
                    progress: bool = True) -> HeadPatchingResult:
    """Patch each head alone (clean -> corrupted) at ``positions``; recovery with a bootstrap CI per head."""
    heads = vlm.geometry.validate(heads if heads is not None else vlm.geometry.all_heads())
    base = base if base is not None else baseline(vlm, pairs)
    values = patch_sets(vlm, pairs, [HeadSet([h]) for h in heads], positions=positions,
                        sets_per_forward=heads_per_forward, progress=progress, desc="patching heads")
    parts = dict(zip(heads, values))
    per_pair = {head: values.sum(-1) for head, values in parts.items()}
    records = []
    for head, values in per_pair.items():
        low, high = recovery_ci(values, base)
        records.append({"head": str(head), "layer": head.layer, "head_index": head.head,
                        "recovery": recovery(values, base), "ci_low": low, "ci_high": high,
                        **per_coordinate(parts[head], base), "n_pairs": pairs.n, "positions": positions,
                        "metric": pairs.metric})
    return HeadPatchingResult(pd.DataFrame(records), per_pair, base, parts)


def patch_head_set(vlm: VLM, pairs: PairBatch, heads: HeadSet, *, positions: PatchPositions = "answer",
                   base: Baseline | None = None) -> dict[str, float]:
    """Patch every head of ``heads`` at once; recovery with its bootstrap CI, per coordinate (``per_coordinate``)."""
    heads = vlm.geometry.validate(heads)
    base = base if base is not None else baseline(vlm, pairs)
    _, encoding = pairs.encode(vlm)
    pairs.require_aligned(encoding, positions)
    clean_rows, corrupted_rows = pairs.clean_rows(), pairs.corrupted_rows()
    templates = [RowPairHeadPatch.build([(h, clean_rows, corrupted_rows) for h in heads], vlm.geometry,
                                        iv.projection_path(vlm),
                                        positions=pairs.positions(positions))] if len(heads) else []
    parts = measure(vlm, pairs, encoding, [1], templates=templates)[0]
    values = parts.sum(-1)
    low, high = recovery_ci(values, base)
    return {"heads": len(heads), "recovery": recovery(values, base), "ci_low": low, "ci_high": high,
            **per_coordinate(parts, base), "n_pairs": pairs.n, "positions": positions, "metric": pairs.metric}


def patched_answers(vlm: VLM, pairs: PairBatch, heads: HeadSet, *, positions: PatchPositions = "answer",
                    max_new_tokens: int = 24) -> pd.DataFrame:
    """Greedy answers of the corrupted inputs with ``heads`` patched from the clean rows while generating.

    Clean and corrupted rows generate in lockstep in one batch; at every decode step the heads' outputs
    at the new token are copied from each clean row to its corrupted row, and in the prefill at the last
    prompt position (``answer``) or at every prompt position (``all``). So "answer" means every answer
    position, as in the teacher-forced metric. One row per pair: the clean row's answer in the same run, the patched corrupted answer, parse status, IoU of the
    patched box with the clean (ground-truth) box, with the model's own clean answer and with the
    corrupted referent's box.
    """  # noqa: E501
    heads = vlm.geometry.validate(heads)
    rows = [p.clean for p in pairs.pairs] + [p.corrupted for p in pairs.pairs]
    batch = vlm.encode_grounding([s.image for s in rows], [s.expression for s in rows])
    pairs.require_aligned(batch.encoding, positions, offset=pairs.n)
    n = pairs.n
    if len(heads):
        ids = _generate_with_row_patches(vlm, batch, [(h, list(range(n)), list(range(n, 2 * n))) for h in heads],
                                         positions, max_new_tokens)
    else:  # nothing to patch: a loop that touches no module would never advance
        ids = iv.run_generate(vlm, batch.encoding, max_new_tokens=max_new_tokens).ids
    answers = vlm.decode_answers(ids, batch.prompt_length)
    records = []
    for i, pair in enumerate(pairs.pairs):
        frame = batch.frames[n + i]
        parsed = vlm.adapter.parse_box(answers[n + i], frame)
        ok = not isinstance(parsed, BoxParseFailure)
        clean_box = vlm.adapter.parse_box(answers[i], batch.frames[i])
        clean_ok = not isinstance(clean_box, BoxParseFailure)
        records.append({
            "pair_id": pair.pair_id, "kind": pair.kind, "clean_answer": answers[i],
            "patched_answer": answers[n + i], "parsed": ok,
            "iou_clean_box": parsed.iou(as_box(pair.clean.box)) if ok else 0.0,
            "iou_clean_answer": parsed.iou(clean_box) if ok and clean_ok else float("nan"),
            "iou_corrupted_box": (parsed.iou(as_box(pair.corrupted_box)) if ok and pair.corrupted_box is not None
                                  else float("nan")),
        })
    return pd.DataFrame(records)


def _generate_with_row_patches(vlm: VLM, batch: Any, entries: list[tuple[Head, list[int], list[int]]],
                               positions: PatchPositions, max_new_tokens: int) -> torch.Tensor:
    """Greedy generation with the row patches applied in the prefill (``positions``) and at every decode step."""
    prefill = RowPairHeadPatch.build(entries, vlm.geometry, iv.projection_path(vlm),
                                     positions=None if positions == "all" else (batch.prompt_length - 1,))
    decode = RowPairHeadPatch.build(entries, vlm.geometry, iv.projection_path(vlm), positions=None)
    model = iv.nnsight_model(vlm)
    iv.prepare_remote(vlm)
    with torch.no_grad(), warnings.catch_warnings(), iv.remote_errors(vlm):
        warnings.filterwarnings("ignore", message=iv.OPEN_LOOP_WARNING)
        with model.generate(max_new_tokens=max_new_tokens, do_sample=False, remote=vlm.remote) as tracer:
            with tracer.invoke(**dict(batch.encoding)):
                for step in tracer.iter[:]:
                    apply_in_order(model, [prefill if step == 0 else decode])
            with tracer.invoke():
                ids = nnsight.save(tracer.result)
    return ids
