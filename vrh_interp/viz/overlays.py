"""Prediction-stage attention maps over the image (the paper's Fig. 1 / A1 / A2).

The map of a head subset is its attention from the answer-token rows (captured during greedy
generation, as for scoring) to the visual tokens, averaged over rows, layers and the subset's heads.
It is laid back onto the image through the family's layout blocks (tiles, thumbnails and newline tokens
handled by ``VisualLayout``), never by a square reshape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.boxes import Box, BoxParseFailure
from vrh_interp.core.description.families.base import VisualBlock
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.data.checks import GroundingSampleLike, as_box


@dataclass
class AttentionOverlay:
    name: str
    block: VisualBlock
    grid: np.ndarray  # [rows, cols] mean attention mass per visual token of the block


@dataclass
class OverlayResult:
    image: Any
    answer: str
    predicted: Box | BoxParseFailure
    truth: Box
    overlays: list[AttentionOverlay]


def prediction_overlays(vlm: VLM, sample: GroundingSampleLike, vrhs: HeadSet, *,
                        max_new_tokens: int = 24) -> OverlayResult:
    """Mean answer-row attention of all heads, the VRHs, and all heads except the VRHs.

    On a remote handle (``vlm.on(remote=...)``) it is one request; the last query row's attention over the prompt comes
    back per step and layer (no full maps).
    """
    batch = vlm.encode_grounding([sample.image], [sample.expression])
    readout = iv.attention_readout(vlm, [-1])
    result = iv.run_generate(vlm, batch.encoding, [readout], max_new_tokens=max_new_tokens)
    layers = sorted(result.steps[0][0])
    prompt_len = batch.prompt_length
    rows = [torch.stack([step[0][layer][0, :, -1, :prompt_len] for layer in layers]) for step in result.steps]
    answer = vlm.decode_answers(result.ids, prompt_len)[0]
    n_answer = max(1, vlm.answer_lengths(result.ids, prompt_len)[0])
    mean_rows = torch.stack(rows[:n_answer]).mean(0)  # [L, H, prompt_len]
    geometry = vlm.geometry
    vrh_mask = torch.zeros(geometry.num_layers, geometry.num_heads, dtype=torch.bool)
    for head in vrhs:
        vrh_mask[head.layer, head.head] = True
    subsets = {"all heads": torch.ones_like(vrh_mask), "VRHs": vrh_mask, "all heads except VRHs": ~vrh_mask}
    layout = batch.layouts[0]
    block = layout.grid_block()
    positions = torch.tensor(block.positions)
    overlays = []
    for name, mask in subsets.items():
        if not mask.any():
            continue
        mean = mean_rows[mask].mean(0)  # [prompt_len]
        overlays.append(AttentionOverlay(name, block, mean[positions].reshape(block.rows, block.cols).numpy()))
    predicted = vlm.adapter.parse_box(answer, batch.frames[0])
    return OverlayResult(sample.image, answer, predicted, as_box(sample.box), overlays)


def overlay_figures(result: OverlayResult) -> list[Any]:
    from vrh_interp.viz.plots import attention_overlay

    boxes = {"ground truth": result.truth.as_tuple()}
    if isinstance(result.predicted, Box):
        boxes["prediction"] = result.predicted.as_tuple()
    return [attention_overlay(result.image, o.grid, o.block.region, boxes, title=o.name) for o in result.overlays]
