"""A batch of clean/corrupted pairs prepared for patching, and the metric patching recovers.

Answers. For each pair the unpatched model answers both inputs greedily (or, with
``targets="ground_truth"``, the two answers are the referents' boxes in the native format): the clean
answer A and the corrupted answer B. They share a prefix (``[`` and often the first coordinates) and part
at answer token ``d``. Pairs whose two answers are identical carry no signal and are excluded (counted in
``excluded``).

Metrics (``PairBatch.metric``, a name in ``patching.metrics.PATCH_METRICS``: one class per metric; every recovery
is of the chosen one, and tables say which):

* ``"answer"`` (default, the whole box): ``log P(A | x) - log P(B | x)``, both answers teacher-forced in
  full, every answer token's log-probability summed. It sees every coordinate, not just the first one the
  answers disagree on, and splits exactly into per-token terms grouped by coordinate (``GROUPS``: x1, y1,
  x2, y2 and ``format`` for brackets, commas, box tags): ``per_coordinate_recovery``. Tokens of the shared
  prefix add 0 (same token, same context on both sides).
* ``"first_token"`` (single token, labelled as such): ``logit(A_d) - logit(B_d)`` at the position predicting
  token ``d`` with the common prefix teacher-forced. On toy A the prefix is ``[`` in every pair, so this
  metric is the first coordinate (x1) only.

Both are positive on the clean input and negative on the corrupted one, in the model's native box format.

Layout. A pair contributes S rows per input (``sequences``: 2 for ``answer``, A-forced then B-forced; 1 for
``first_token``), so a *side* is ``n * S`` rows: ``[A-forced rows of pairs 1..n, B-forced rows of pairs
1..n]``. One encoding holds the clean side then the corrupted side (optionally repeated, one copy per
patched head). Row j of the clean side and row j of a corrupted copy hold the same pair and the same forced
answer, so patches copy row j to row j. Prompts are left-padded, so every prompt ends at
``prompt_length - 1`` and the forced answer follows; a position index names the same slot in both rows.

Recovery. ``(patched - corrupted) / (clean - corrupted)``, as a ratio of means over pairs (a mean of per-pair
ratios explodes when a pair's clean and corrupted values are close); 0 = no effect, 1 = clean behaviour.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import nnsight
import numpy as np
import torch

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core._display import Card, mean_spread, shorten
from vrh_interp.core.description.boxes import BoxParseFailure
from vrh_interp.evaluation.statistics import bootstrap_statistic_ci
from vrh_interp.core.description.model import VLM, GroundingBatch
from vrh_interp.patching.pairs import PatchingPair
from vrh_interp.data.checks import as_box
from vrh_interp.core.execution.templates import LayerTemplate, apply_in_order
from vrh_interp.patching.metrics import FORMAT, GROUPS, PATCH_METRICS, PatchMetric, patch_metric

PatchPositions = Literal["answer", "all"]
AnswerTargets = Literal["greedy", "ground_truth"]
Metric = str  # a name in PATCH_METRICS: "answer", "first_token", ...
METRICS: tuple[Metric, ...] = tuple(PATCH_METRICS)
METRIC_LABELS = {name: metric.label for name, metric in PATCH_METRICS.items()}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def token_coordinates(vlm: VLM, ids: Sequence[int], frame: Any) -> list[int]:
    """Per answer token, the box coordinate it writes (index into ``GROUPS``; ``FORMAT`` for the rest).

    Found without knowing the family's coordinate order: each number in the decoded answer is nudged by one
    unit in its last digit and the answer re-parsed with the family's own parser; the number is coordinate c
    when exactly c changes (numbers that break the parse, like the 2 of ``box_2d``, are format). A token
    belongs to the coordinate whose digits it overlaps (an unparsable answer is all format).
    """
    decode = vlm.tokenizer.decode
    text = decode(list(ids), skip_special_tokens=False)
    box = vlm.adapter.parse_box(text, frame)
    labels = [FORMAT] * len(ids)
    if isinstance(box, BoxParseFailure):
        return labels
    original = (box.x1, box.y1, box.x2, box.y2)
    chars = [FORMAT] * len(text)
    for match in _NUMBER.finditer(text):
        number = match.group()
        digits = number.replace(".", "")
        for step in (1, -1):
            value = int(digits) + step
            if value < 0:
                continue
            nudged = str(value).zfill(len(digits))
            if "." in number:
                point = number.index(".") - len(number) + 1  # from the end: a longer integer part still fits
                nudged = nudged[:point] + "." + nudged[point:]
            parsed = vlm.adapter.parse_box(text[:match.start()] + nudged + text[match.end():], frame)
            if isinstance(parsed, BoxParseFailure):
                continue
            changed = [c for c, (a, b) in enumerate(zip(original, (parsed.x1, parsed.y1, parsed.x2, parsed.y2)))
                       if abs(a - b) > 1e-9]
            if len(changed) == 1:
                chars[match.start():match.end()] = [changed[0]] * (match.end() - match.start())
                break
    start = 0
    for t in range(len(ids)):
        end = len(decode(list(ids[:t + 1]), skip_special_tokens=False))
        covered = [c for c in chars[start:end] if c != FORMAT]
        labels[t] = covered[0] if covered else FORMAT
        start = end
    return labels


@dataclass(repr=False)
class PairBatch(Card):
    """Pairs kept for patching with their answers, divergence points, forced tokens and the metric (shown as a few
    lines: pairs kept and excluded, the metric, one pair's two answers; ``pairs`` holds the pairs)."""

    pairs: list[PatchingPair]
    excluded: list[tuple[str, str]]  # (pair_id, reason)
    clean_answers: list[str]
    corrupted_answers: list[str]
    prefixes: list[list[int]]  # common answer prefix per pair (teacher-forced by the first-token metric)
    clean_token: torch.Tensor  # [n] the clean answer's token at the divergence point
    corrupted_token: torch.Tensor  # [n]
    prompt_length: int
    clean_ids: list[list[int]] = dataclasses.field(default_factory=list)  # the whole clean answer, per pair
    corrupted_ids: list[list[int]] = dataclasses.field(default_factory=list)
    clean_groups: list[list[int]] = dataclasses.field(default_factory=list)  # GROUPS index per clean answer token
    corrupted_groups: list[list[int]] = dataclasses.field(default_factory=list)
    metric: Metric = "answer"

    def __post_init__(self) -> None:
        patch_metric(self.metric).check(self)

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        kinds = sorted({p.kind for p in self.pairs})
        reasons = Counter(reason for _, reason in self.excluded)
        rows = [("excluded", f"{len(self.excluded)}" + (f" ({', '.join(f'{r}: {n}' for r, n in reasons.items())})"
                                                        if reasons else "")),
                ("metric", f"{self.metric}: {shorten(METRIC_LABELS.get(self.metric, ''), 70)}"),
                ("rows", f"{self.side} per side ({self.sequences} per pair), prompt length {self.prompt_length}")]
        if self.pairs:
            rows.append((f"answers of {self.pairs[0].pair_id}",
                         f"clean {shorten(repr(self.clean_answers[0]), 40)}, corrupted "
                         f"{shorten(repr(self.corrupted_answers[0]), 40)}"))
        return f"PairBatch: {self.n} pairs kept ({', '.join(kinds)})", rows

    def _card_table(self) -> str:
        import pandas as pd

        frame = pd.DataFrame({"pair": [p.pair_id for p in self.pairs], "clean answer": self.clean_answers,
                              "corrupted answer": self.corrupted_answers})
        return frame.head(10).to_html(index=False)

    @property
    def metric_kind(self) -> PatchMetric:
        """The metric's class instance (``patching.metrics``): rows per pair, forced tokens, scoring."""
        return patch_metric(self.metric)

    def with_metric(self, metric: Metric) -> "PairBatch":
        """The same pairs measured with another metric (no model call)."""
        return dataclasses.replace(self, metric=metric)

    @property
    def n(self) -> int:
        return len(self.pairs)

    @property
    def sequences(self) -> int:
        """Rows per input and pair: 2 (A-forced, B-forced) for ``answer``, 1 for ``first_token``."""
        return self.metric_kind.sequences

    @property
    def side(self) -> int:
        """Rows of one side (all clean rows, or one copy of the corrupted rows)."""
        return self.n * self.sequences

    @property
    def metric_positions(self) -> torch.Tensor:
        """Per pair, the position predicting the first diverging answer token."""
        return torch.tensor([self.prompt_length - 1 + len(p) for p in self.prefixes])

    def forced(self) -> list[list[int]]:
        """The teacher-forced answer tokens of one side's rows."""
        return self.metric_kind.forced(self)

    def positions(self, which: PatchPositions) -> tuple[int, ...] | None:
        """``answer``: the prompt end and the teacher-forced tokens; ``all``: every position (None)."""
        if which == "all":
            return None
        if which != "answer":
            raise ValueError(f"positions must be 'answer' or 'all', not {which!r}")
        width = max(len(p) for p in self.forced())
        return tuple(range(self.prompt_length - 1, self.prompt_length + width))

    def encode(self, vlm: VLM, copies: int = 1) -> tuple[GroundingBatch, dict[str, Any]]:
        """Rows ``[clean side, corrupted side x copies]`` with each row's forced answer appended."""
        cleans = [p.clean for p in self.pairs] * self.sequences
        corrupteds = [p.corrupted for p in self.pairs] * (self.sequences * copies)
        rows = cleans + corrupteds
        batch = vlm.encode_grounding([s.image for s in rows], [s.expression for s in rows])
        if batch.prompt_length != self.prompt_length:
            raise RuntimeError(f"re-encoded prompt length {batch.prompt_length} != {self.prompt_length}")
        return batch, vlm.teacher_forced(batch, self.forced() * (1 + copies))

    def require_aligned(self, encoding: dict[str, Any], which: PatchPositions, *, offset: int | None = None) -> None:
        """Patching at ``all`` positions needs each pair's two prompts to have the same length (same padding).

        ``offset``: where the corrupted rows start (default: after the clean side of ``encode``)."""
        if which != "all":
            return
        lengths = encoding["attention_mask"].sum(dim=1)
        offset = self.side if offset is None else offset
        bad = [p.pair_id for i, p in enumerate(self.pairs) if lengths[i] != lengths[offset + i]]
        if bad:
            raise ValueError("positions='all' needs clean and corrupted prompts of equal length; "
                             f"{len(bad)} pairs differ "
                             f"(e.g. {bad[:3]}): use positions='answer', or build pairs with "
                             "make_pairs(..., same_expression_length=True)")

    def clean_rows(self) -> list[int]:
        return list(range(self.side))

    def corrupted_rows(self, copy: int = 0) -> list[int]:
        return [self.side * (1 + copy) + i for i in range(self.side)]

    def pair_of_row(self) -> list[int]:
        """The pair each row of a side belongs to."""
        return list(range(self.n)) * self.sequences

    def scoring(self) -> dict[str, torch.Tensor]:
        """One side's metric as index tensors: entry (r, l) adds ``weight * log p(token | row r, position)``
        to pair ``pair[r]``, group ``group``; plain tensors, so they can travel in a remote request."""
        return {**self.metric_kind.scoring(self), "pair": torch.tensor(self.pair_of_row())}


def score_rows(logits: Any, rows: torch.Tensor, scoring: dict[str, torch.Tensor], n: int) -> Any:
    """The metric split by group, ``[n, len(GROUPS)]``, of the side whose rows are ``rows`` (see ``scoring``).

    Plain torch on the logits, so it runs inside a trace (the full logits never leave it) and is
    differentiable (attribution patching backpropagates through it). Log-softmax in at least float32.
    """
    picked = logits[rows[:, None], scoring["positions"]]  # [R, L, vocab]
    picked = picked.to(torch.promote_types(picked.dtype, torch.float32)).log_softmax(dim=-1)
    logp = picked.gather(2, scoring["tokens"][:, :, None])[:, :, 0] * scoring["weights"]  # [R, L]
    by_group = torch.zeros(logp.shape[0], len(GROUPS), dtype=logp.dtype, device=logp.device)
    by_group = by_group.scatter_add(1, scoring["groups"].to(logp.device), logp)  # [R, G]
    per_pair = torch.zeros(n, len(GROUPS), dtype=logp.dtype, device=logp.device)
    return per_pair.index_add(0, scoring["pair"].to(logp.device), by_group)


def _target_answers(vlm: VLM, pairs: Sequence[PatchingPair], batch: GroundingBatch, targets: AnswerTargets,
                    max_new_tokens: int) -> tuple[list[list[int] | None], list[str]]:
    """Answer token ids and texts per row ([clean..., corrupted...]); None where a row has no target."""
    n = len(pairs)
    if targets == "greedy":
        result = iv.run_generate(vlm, batch.encoding, max_new_tokens=max_new_tokens)
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
                  metric: Metric = "answer", max_new_tokens: int = 24) -> PairBatch:
    """Set up the metric for every pair; see the module docstring.

    ``targets="greedy"``: the two answers are the unpatched model's greedy answers (what the model does);
    ``"ground_truth"``: the clean and corrupted referents' boxes in the family's native format (what the
    inputs ask for; pairs without a corrupted referent are excluded). ``metric``: ``"answer"`` (the whole
    box) or ``"first_token"`` (the first differing token only).
    """
    if not pairs:
        raise ValueError("prepare_pairs needs at least one pair")
    patch_metric(metric)  # an unknown name fails before any model call
    rows = [p.clean for p in pairs] + [p.corrupted for p in pairs]
    batch = vlm.encode_grounding([s.image for s in rows], [s.expression for s in rows])
    new, answers = _target_answers(vlm, pairs, batch, targets, max_new_tokens)
    n = len(pairs)
    kept, excluded, prefixes, good, bad, clean_answers, corrupted_answers = [], [], [], [], [], [], []
    clean_ids, corrupted_ids, clean_groups, corrupted_groups = [], [], [], []
    for i, pair in enumerate(pairs):
        clean, corrupted = new[i], new[n + i]
        if corrupted is None:
            excluded.append((pair.pair_id, "no corrupted referent"))
            continue
        d = next((j for j, (a, b) in enumerate(zip(clean, corrupted)) if a != b), None)
        if d is None:
            excluded.append((pair.pair_id, "same answer" if clean == corrupted else "one answer is a prefix"))
            continue
        kept.append(pair)
        prefixes.append(clean[:d])
        good.append(clean[d])
        bad.append(corrupted[d])
        clean_answers.append(answers[i])
        corrupted_answers.append(answers[n + i])
        clean_ids.append(list(clean))
        corrupted_ids.append(list(corrupted))
        clean_groups.append(token_coordinates(vlm, clean, batch.frames[i]))
        corrupted_groups.append(token_coordinates(vlm, corrupted, batch.frames[n + i]))
    if not kept:
        raise ValueError(f"no pair has different clean and corrupted answers ({len(excluded)} excluded)")
    # the prompt length of the KEPT rows (dropping rows can shorten the padded length)
    kept_rows = [p.clean for p in kept] + [p.corrupted for p in kept]
    length = vlm.encode_grounding([s.image for s in kept_rows], [s.expression for s in kept_rows]).prompt_length
    return PairBatch(kept, excluded, clean_answers, corrupted_answers, prefixes, torch.tensor(good),
                     torch.tensor(bad), length, clean_ids, corrupted_ids, clean_groups, corrupted_groups, metric)


def measure(vlm: VLM, pairs: PairBatch, encoding: dict[str, Any], sides: Sequence[int], *,
            templates: Sequence[LayerTemplate] = (), extra: Callable[[Any], None] | None = None) -> np.ndarray:
    """The metric by group, ``[len(sides), n, len(GROUPS)]``, of side blocks ``sides`` (0 = the clean side,
    1 + k = corrupted copy k) under ``templates``; sum the last axis for the metric itself.

    ``extra(model)`` runs inside the trace after the templates (for interventions that are not layer
    templates, e.g. ``HeadKeyValuePatch.apply``). The logits never leave the trace in full.
    """
    model = iv.nnsight_model(vlm)
    scoring, n, side = pairs.scoring(), pairs.n, pairs.side  # plain values: `pairs` holds images
    row_blocks = [torch.arange(side) + side * s for s in sides]
    iv.prepare_remote(vlm)
    with torch.no_grad(), iv.remote_errors(vlm):
        with model.trace(**encoding, remote=vlm.remote):
            apply_in_order(model, templates)
            if extra is not None:
                extra(model)
            logits = model.output.logits
            values = nnsight.save(torch.stack([score_rows(logits, rows, scoring, n) for rows in row_blocks]))
    return values.detach().cpu().double().numpy()


@dataclass(frozen=True, repr=False)
class Baseline(Card):
    """Unpatched metric on both sides of every pair, and split by group (``GROUPS``); shown as the means, not the
    arrays."""

    clean: np.ndarray  # [n]
    corrupted: np.ndarray  # [n]
    clean_parts: np.ndarray  # [n, len(GROUPS)]
    corrupted_parts: np.ndarray

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        gap = np.asarray(self.clean) - np.asarray(self.corrupted)
        parts = (np.asarray(self.clean_parts) - np.asarray(self.corrupted_parts)).reshape(len(gap), -1)
        by_group = ", ".join(f"{name} {value:.3g}" for name, value in zip(GROUPS, parts.mean(axis=0))) if len(gap) \
            else "n/a"
        mean = gap.mean() if len(gap) else float("nan")
        return (f"Baseline: {len(gap)} pairs, mean gap clean - corrupted {mean:.3g}",
                [("clean", mean_spread(self.clean)), ("corrupted", mean_spread(self.corrupted)),
                 ("gap by coordinate", by_group)])


def baseline(vlm: VLM, pairs: PairBatch) -> Baseline:
    _, encoding = pairs.encode(vlm)
    values = measure(vlm, pairs, encoding, [0, 1])
    return Baseline(values[0].sum(-1), values[1].sum(-1), values[0], values[1])


def recovery(patched: np.ndarray, base: Baseline) -> float:
    """Ratio of means: ``mean(patched - corrupted) / mean(clean - corrupted)``."""
    return float(np.mean(patched - base.corrupted) / np.mean(base.clean - base.corrupted))


def recovery_ci(patched: np.ndarray, base: Baseline, *, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap over pairs of the ratio-of-means recovery."""
    gap = base.clean - base.corrupted
    gain = patched - base.corrupted
    return bootstrap_statistic_ci(lambda idx: float(gain[idx].mean() / gap[idx].mean()), len(gap), seed=seed)


def per_coordinate(patched_parts: np.ndarray, base: Baseline) -> dict[str, float]:
    """Per group g (``GROUPS``): ``recovery_g`` = the group's own recovery, ``mean(patched_g - corrupted_g) /
    mean(clean_g - corrupted_g)`` (NaN when the group's gap is 0, e.g. a coordinate both answers share), and
    ``share_g`` = the same gain over the WHOLE gap. The shares sum to the total recovery exactly (the metric
    is a sum over groups); the per-coordinate recoveries do not (each has its own denominator)."""
    gain = (patched_parts - base.corrupted_parts).mean(axis=0)
    gap = (base.clean_parts - base.corrupted_parts).mean(axis=0)
    total = gap.sum()
    out: dict[str, float] = {}
    for g, name in enumerate(GROUPS):
        out[f"recovery_{name}"] = float(gain[g] / gap[g]) if abs(gap[g]) > 1e-9 * max(abs(total), 1.0) else float("nan")
        out[f"share_{name}"] = float(gain[g] / total)
    return out
