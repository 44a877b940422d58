"""Key/value-position patching: from which input positions does a head's contribution come?

For one head, the keys and values at the positions of ONE region are copied from the clean run into the
corrupted run, the head's output at the answer positions is recomputed (``HeadKeyValuePatch``), and the
recovery of the metric (``vrh_interp.patching.batch``) is measured. Regions, per pair, in prompt positions:

* ``clean_referent`` / ``corrupted_referent``: visual tokens whose patch overlaps the referent's box in
  the clean / corrupted image (the family's layout rule, the same one head scoring uses);
* ``distractors``: visual tokens on the other objects (neither referent);
* ``background``: visual tokens on no object;
* ``text``: every non-visual position of the row (template, expression, the teacher-forced answer).

What to expect by construction: in an ``expression_swap`` pair the image precedes the text, so under
causal attention every visual key and value is identical in both runs and only ``text`` can recover
anything (exactly so for expressions of equal length; with unequal lengths the two images sit at
different positions and the copied keys keep the clean row's rotary phase: near 0, not exactly 0); in ``referent_moved`` / ``referent_recoloured`` pairs the text is identical and only visual
regions can. ``head_output`` (the whole head output patched at the answer positions) is the ceiling
any single region is compared with.
"""  # noqa: E501

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from vrh_interp.core.description.heads import Head, HeadLike, HeadSet
from vrh_interp.core.description.model import VLM, GroundingBatch
from vrh_interp.patching.batch import Baseline, PairBatch, baseline, measure, recovery, recovery_ci
from vrh_interp.patching.head_patching import patch_head_set
from vrh_interp.data.checks import as_box
from vrh_interp.core.execution.templates.position_patch import HeadKeyValuePatch, PatchedStates

REGIONS: tuple[str, ...] = ("clean_referent", "corrupted_referent", "distractors", "background", "text")


def region_positions(pairs: PairBatch, batch: GroundingBatch,
                     encoding: dict[str, Any]) -> dict[str, tuple[list[list[int]], list[list[int]]]]:
    """Per region: (positions in each CLEAN row, the matching positions in its CORRUPTED row), one entry per row
    of a side (``pairs.side``: a pair with two forced answers has two rows).

    Visual regions are computed on the visual-token grid and mapped into each row through its own layout,
    so a region names the same image patches in both rows even when the prompts are padded differently
    (expressions of different lengths shift the image). ``text`` holds positions aligned from the prompt
    end (where both rows have text), as everything after the image is. ``batch``/``encoding``: from
    ``pairs.encode``.
    """
    regions: dict[str, tuple[list[list[int]], list[list[int]]]] = {name: ([], []) for name in REGIONS}
    side = pairs.side
    mask = encoding["attention_mask"]
    for r, i in enumerate(pairs.pair_of_row()):
        pair = pairs.pairs[i]
        clean_layout, layout = batch.layouts[r], batch.layouts[side + r]
        if len(clean_layout.visual_positions) != len(layout.visual_positions):
            raise ValueError(f"pair {pair.pair_id}: the clean and corrupted images have different visual token "
                             "layouts; position patching needs images of the same size")
        index_of = {position: j for j, position in enumerate(layout.visual_positions)}

        def grid(box: Any) -> set[int]:
            return {index_of[p] for p in layout.positions_for_box(as_box(tuple(box)))}

        clean = grid(pair.clean.box)
        corrupted = grid(pair.corrupted_box) if pair.corrupted_box is not None else set()
        objects = clean | corrupted
        for box in list(pair.distractor_boxes) + list(pair.corrupted.meta.get("object_boxes", [])):
            objects |= grid(box)
        by_index = {
            "clean_referent": clean,
            "corrupted_referent": corrupted - clean,
            "distractors": objects - clean - corrupted,
            "background": set(range(len(layout.visual_positions))) - objects,
        }
        for name, indices in by_index.items():
            order = sorted(indices)
            regions[name][0].append([clean_layout.visual_positions[j] for j in order])
            regions[name][1].append([layout.visual_positions[j] for j in order])
        visual = set(layout.visual_positions) | set(clean_layout.visual_positions)
        text = [p for p in range(mask.shape[1]) if p not in visual and mask[r, p] and mask[side + r, p]]
        regions["text"][0].append(text)
        regions["text"][1].append(text)
    return regions


def key_value_patch(vlm: VLM, pairs: PairBatch, head: HeadLike, region: str = "clean_referent", *,
                    states: PatchedStates = "both",
                    regions: dict[str, tuple[list[list[int]], list[list[int]]]] | None = None) -> HeadKeyValuePatch:
    """The key/value patch of ``head`` at ``region`` (``REGIONS``) of every pair, clean -> corrupted, recomputed at
    the answer positions: what ``position_patching`` measures, as a template for your own trace over
    ``pairs.encode(vlm)`` (call ``.apply(model)`` inside it). ``regions``: ``region_positions`` already computed."""
    if region not in REGIONS:
        raise ValueError(f"unknown region {region!r}; expected one of {REGIONS}")
    if regions is None:
        batch, encoding = pairs.encode(vlm)
        regions = region_positions(pairs, batch, encoding)
    source_positions, positions = regions[region]
    return HeadKeyValuePatch.for_model(vlm, head, source_rows=pairs.clean_rows(), target_rows=pairs.corrupted_rows(),
                                       key_positions=positions, source_key_positions=source_positions,
                                       rows=pairs.positions("answer"), states=states)


def position_patching(vlm: VLM, pairs: PairBatch, heads: Sequence[Head] | HeadSet, *,
                      regions: Sequence[str] = REGIONS, states: PatchedStates = "both",
                      base: Baseline | None = None) -> pd.DataFrame:
    """Recovery per (head, region) from patching that head's keys/values at the region, clean -> corrupted."""
    unknown = [r for r in regions if r not in REGIONS]
    if unknown:
        raise ValueError(f"unknown regions {unknown}; expected some of {REGIONS}")
    heads = vlm.geometry.validate(HeadSet(heads))
    base = base if base is not None else baseline(vlm, pairs)
    batch, encoding = pairs.encode(vlm)
    by_region = region_positions(pairs, batch, encoding)
    n = pairs.n
    records = []
    for head in heads:
        whole = patch_head_set(vlm, pairs, HeadSet([head]), base=base)
        records.append({"head": str(head), "region": "head_output", "recovery": whole["recovery"],
                        "ci_low": whole["ci_low"], "ci_high": whole["ci_high"], "mean_positions": float("nan"),
                        "n_pairs": n})
        for region in regions:
            positions = by_region[region][1]
            template = key_value_patch(vlm, pairs, head, region, states=states, regions=by_region)
            values = measure(vlm, pairs, encoding, [1], extra=template.apply)[0].sum(-1)
            low, high = recovery_ci(values, base)
            records.append({"head": str(head), "region": region, "recovery": recovery(values, base),
                            "ci_low": low, "ci_high": high,
                            "mean_positions": float(np.mean([len(p) for p in positions])), "n_pairs": n})
    return pd.DataFrame(records)
