"""Prediction-stage overlays equal the brute-force mean of eager attention maps over the answer rows."""

from __future__ import annotations

import numpy as np
import torch

from tests.conftest import tiny_vlm
from tests.reference import eager_attention_maps
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.viz.overlays import overlay_figures, prediction_overlays
from vrh_interp.data.sources import synthetic_samples


def test_overlay_grids_equal_eager_mean_over_answer_rows():
    vlm = tiny_vlm("internvl")
    sample = synthetic_samples("eval", 1)[0]
    vrhs = HeadSet([Head(1, 0), Head(0, 3)])
    result = prediction_overlays(vlm, sample, vrhs, max_new_tokens=4)
    batch = vlm.encode_grounding([sample.image], [sample.expression])
    ids = iv.run_generate(vlm, batch.encoding, [], max_new_tokens=4).ids
    full = dict(batch.encoding)
    full["input_ids"] = ids
    full["attention_mask"] = torch.ones_like(ids)
    maps = torch.stack(eager_attention_maps(vlm.hf_model, full))[:, 0]  # [L, H, S, S]
    s = batch.prompt_length
    n = max(1, vlm.answer_lengths(ids, s)[0])
    rows = maps[:, :, s - 1: s - 1 + n, :s].mean(2)  # [L, H, s]
    by_name = {o.name: o for o in result.overlays}
    mask = torch.zeros(rows.shape[:2], dtype=torch.bool)
    mask[1, 0] = mask[0, 3] = True
    for name, subset in (("VRHs", mask), ("all heads except VRHs", ~mask), ("all heads", torch.ones_like(mask))):
        block = by_name[name].block
        want = rows[subset].mean(0)[list(block.positions)].reshape(block.rows, block.cols).numpy()
        np.testing.assert_allclose(by_name[name].grid, want, atol=1e-6)
    figures = overlay_figures(result)
    assert len(figures) == 3 and all(len(f.axes[0].images) == 2 for f in figures)
