"""A batch of clean/corrupted pairs prepared for patching, and the logit-difference metric.

Metric. For each pair the unpatched model answers both inputs greedily (or, with
``targets="ground_truth"``, the two answers are the referents' boxes in the native format). The two
answers share a prefix
(``[`` and often the first coordinates) and then diverge at answer token ``d``. Both prompts are
teacher-forced with that common prefix, and the metric is the logit difference at the position that
predicts token ``d``: ``logit(clean answer token d) - logit(corrupted answer token d)``. It is positive on
the clean input and negative on the corrupted one, in the model's native box format, and it measures the
first decision where the two answers part. Pairs whose two answers are identical carry no signal and are
excluded (counted in ``excluded``).

Layout. One encoding holds ``[clean_1..clean_n, corrupted_1..corrupted_n]`` (optionally the corrupted block
repeated, one copy per patched head). Prompts are left-padded, so every prompt ends at ``prompt_length - 1``
and the common prefix follows; a position index therefore names the same slot in a clean row and its
corrupted row. The set of prompt lengths is the same in every copy, so the padded length is too.

Recovery. ``(patched - corrupted) / (clean - corrupted)``, as a ratio of means over pairs (a mean of per-pair
ratios explodes when a pair's clean and corrupted values are close); 0 = no effect, 1 = clean behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import nnsight
import numpy as np
import torch

from vrh_interp import interventions as iv
from vrh_interp.evaluation.statistics import bootstrap_statistic_ci
from vrh_interp.model import VLM, GroundingBatch
from vrh_interp.patching.pairs import PatchingPair
from vrh_interp.samples import as_box
from vrh_interp.templates import LayerTemplate, apply_in_order

PatchPositions = Literal["answer", "all"]
AnswerTargets = Literal["greedy", "ground_truth"]


@dataclass
class PairBatch:
    """Pairs kept for patching with their answers, divergence points and metric tokens."""

    pairs: list[PatchingPair]
    excluded: list[tuple[str, str]]  # (pair_id, reason)
    clean_answers: list[str]
    corrupted_answers: list[str]
    prefixes: list[list[int]]  # common answer prefix per pair (teacher-forced)
    clean_token: torch.Tensor  # [n] the clean answer's token at the divergence point
    corrupted_token: torch.Tensor  # [n]
    prompt_length: int

    @property
    def n(self) -> int:
        return len(self.pairs)

    @property
    def metric_positions(self) -> torch.Tensor:
        """Per pair, the position predicting the first diverging answer token."""
        return torch.tensor([self.prompt_length - 1 + len(p) for p in self.prefixes])

    def positions(self, which: PatchPositions) -> tuple[int, ...] | None:
        """``answer``: the prompt end and the teacher-forced prefix; ``all``: every position (None)."""
        if which == "all":
            return None
        if which != "answer":
            raise ValueError(f"positions must be 'answer' or 'all', not {which!r}")
        width = max(len(p) for p in self.prefixes)
        return tuple(range(self.prompt_length - 1, self.prompt_length + width))

    def encode(self, vlm: VLM, copies: int = 1) -> tuple[GroundingBatch, dict[str, Any]]:
        """Rows ``[clean (n), corrupted (n) x copies]`` with the common prefixes appended."""
        cleans = [p.clean for p in self.pairs]
        corrupteds = [p.corrupted for p in self.pairs] * copies
        rows = cleans + corrupteds
        batch = vlm.encode_grounding([s.image for s in rows], [s.expression for s in rows])
        if batch.prompt_length != self.prompt_length:
            raise RuntimeError(f"re-encoded prompt length {batch.prompt_length} != {self.prompt_length}")
        prefixes = self.prefixes + self.prefixes * copies
        return batch, vlm.teacher_forced(batch, prefixes)

    def require_aligned(self, encoding: dict[str, Any], which: PatchPositions) -> None:
        """Patching at ``all`` positions needs each pair's two prompts to have the same length (same padding)."""
        if which != "all":
            return
        lengths = encoding["attention_mask"].sum(dim=1)
        bad = [p.pair_id for i, p in enumerate(self.pairs) if lengths[i] != lengths[self.n + i]]
        if bad:
            raise ValueError(f"positions='all' needs clean and corrupted prompts of equal length; {len(bad)} pairs differ "
                             f"(e.g. {bad[:3]}): use positions='answer', or build pairs with "
                             "make_pairs(..., same_expression_length=True)")

    def corrupted_rows(self, copy: int = 0) -> list[int]:
        return [self.n * (1 + copy) + i for i in range(self.n)]


def _target_answers(vlm: VLM, pairs: Sequence[PatchingPair], batch: GroundingBatch, targets: AnswerTargets,
                    max_new_tokens: int, remote: bool | str) -> tuple[list[list[int] | None], list[str]]:
    """Answer token ids and texts per row ([clean..., corrupted...]); None where a row has no target."""
    n = len(pairs)
    if targets == "greedy":
        result = iv.run_generate(vlm, batch.encoding, max_new_tokens=max_new_tokens, remote=remote)
        lengths = vlm.answer_lengths(result.ids, batch.prompt_length)
        new = result.ids[:, batch.prompt_length:].tolist()
        return [row[:length] for row, length in zip(new, lengths)], vlm.decode_answers(result.ids, batch.prompt_length)
    if targets != "ground_truth":
        raise ValueError(f"targets must be 'greedy' or 'ground_truth', not {targets!r}")
    boxes = [p.clean.box for p in pairs] + [p.corrupted_box for p in pairs]
    texts = [vlm.adapter.format_box(as_box(box), frame) if box is not None else ""
             for box, frame in zip(boxes, batch.frames)]
    ids = [vlm.tokenizer(t, add_special_tokens=False)["input_ids"] if i < n or boxes[i] is not None else None
           for i, t in enumerate(texts)]
    return ids, texts


def prepare_pairs(vlm: VLM, pairs: Sequence[PatchingPair], *, targets: AnswerTargets = "greedy",
                  max_new_tokens: int = 24, remote: bool | str = False) -> PairBatch:
    """Set up the metric for every pair; see the module docstring.

    ``targets="greedy"``: the two answers are the unpatched model's greedy answers (what the model does);
    ``"ground_truth"``: the clean and corrupted referents' boxes in the family's native format (what the
    inputs ask for; pairs without a corrupted referent are excluded).
    """
    if not pairs:
        raise ValueError("prepare_pairs needs at least one pair")
    rows = [p.clean for p in pairs] + [p.corrupted for p in pairs]
    batch = vlm.encode_grounding([s.image for s in rows], [s.expression for s in rows])
    new, answers = _target_answers(vlm, pairs, batch, targets, max_new_tokens, remote)
    n = len(pairs)
    kept, excluded, prefixes, good, bad, clean_answers, corrupted_answers = [], [], [], [], [], [], []
    for i, pair in enumerate(pairs):
        clean_ids, corrupted_ids = new[i], new[n + i]
        if corrupted_ids is None:
            excluded.append((pair.pair_id, "no corrupted referent"))
            continue
        d = next((j for j, (a, b) in enumerate(zip(clean_ids, corrupted_ids)) if a != b), None)
        if d is None:
            excluded.append((pair.pair_id, "same answer" if clean_ids == corrupted_ids else "one answer is a prefix"))
            continue
        kept.append(pair)
        prefixes.append(clean_ids[:d])
        good.append(clean_ids[d])
        bad.append(corrupted_ids[d])
        clean_answers.append(answers[i])
        corrupted_answers.append(answers[n + i])
    if not kept:
        raise ValueError(f"no pair has different clean and corrupted answers ({len(excluded)} excluded)")
    # the prompt length of the KEPT rows (dropping rows can shorten the padded length)
    kept_rows = [p.clean for p in kept] + [p.corrupted for p in kept]
    length = vlm.encode_grounding([s.image for s in kept_rows], [s.expression for s in kept_rows]).prompt_length
    return PairBatch(kept, excluded, clean_answers, corrupted_answers, prefixes, torch.tensor(good),
                     torch.tensor(bad), length)


def logit_differences(vlm: VLM, encoding: dict[str, Any], rows: Sequence[int], positions: torch.Tensor,
                      clean_token: torch.Tensor, corrupted_token: torch.Tensor, *,
                      templates: Sequence[LayerTemplate] = (), extra: Callable[[Any], None] | None = None,
                      remote: bool | str = False) -> torch.Tensor:
    """``logit(clean) - logit(corrupted)`` at ``positions`` of ``rows`` under ``templates``; only [len(rows)] returns.

    ``extra(model)`` runs inside the trace after the templates (for interventions that are not layer
    templates, e.g. ``HeadKeyValuePatch.apply``). The logits never leave the trace in full.
    """
    model = vlm.nn
    iv.prepare_remote(remote)
    row_index = torch.as_tensor(list(rows))
    with torch.no_grad(), iv.remote_errors(model, remote):
        with model.trace(**encoding, remote=remote):
            apply_in_order(model, templates)
            if extra is not None:
                extra(model)
            logits = model.output.logits
            picked = logits[row_index, positions]
            diff = nnsight.save(picked.gather(1, clean_token[:, None]) - picked.gather(1, corrupted_token[:, None]))
    return diff[:, 0].float()


@dataclass(frozen=True)
class Baseline:
    """Unpatched metric on both sides of every pair."""

    clean: np.ndarray  # [n]
    corrupted: np.ndarray  # [n]


def baseline(vlm: VLM, pairs: PairBatch, *, remote: bool | str = False) -> Baseline:
    _, encoding = pairs.encode(vlm)
    n = pairs.n
    positions = pairs.metric_positions
    values = logit_differences(vlm, encoding, list(range(2 * n)), torch.cat([positions, positions]),
                               torch.cat([pairs.clean_token] * 2), torch.cat([pairs.corrupted_token] * 2),
                               remote=remote).numpy()
    return Baseline(values[:n], values[n:])


def recovery(patched: np.ndarray, base: Baseline) -> float:
    """Ratio of means: ``mean(patched - corrupted) / mean(clean - corrupted)``."""
    return float(np.mean(patched - base.corrupted) / np.mean(base.clean - base.corrupted))


def recovery_ci(patched: np.ndarray, base: Baseline, *, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap over pairs of the ratio-of-means recovery."""
    gap = base.clean - base.corrupted
    gain = patched - base.corrupted
    return bootstrap_statistic_ci(lambda idx: float(gain[idx].mean() / gap[idx].mean()), len(gap), seed=seed)
