"""Patch metrics as objects: what a patching recovery measures, and which answer tokens that needs forced.

A metric is one class, registered in ``PATCH_METRICS`` (the one place ``PairBatch``, ``prepare_pairs``, the
patching study's labels, ``vrh patch --metric`` and the grid's ``metric`` option read). Its ``name`` is what
tables, records and the study's run folder write (``"answer"``, ``"first_token"``), so folders of earlier
versions read the same.

Every patching measurement (head, head-set, position, mediation, attribution patching) scores one side of a
``PairBatch`` (all clean rows, or one copy of the corrupted rows) through ``batch.score_rows``: entry (r, l) of the
metric's ``scoring`` adds ``weight * log p(token | row r, position)`` to pair ``pair[r]``, coordinate group
``group`` (``GROUPS``: x1, y1, x2, y2, format). A metric decides three things: ``sequences``, how many rows a pair
contributes per input (each row with its own forced answer); ``forced``, the teacher-forced answer tokens of one
side's rows (pairs 1..n for the first sequence, then again for the next); and ``scoring``, those index tensors.
``check`` refuses a batch the metric cannot measure. The module imports no torch at import time: ``vrh --help``
reads the registry.

Adding a metric: subclass ``PatchMetric``, set ``name``, ``label`` (the sentence tables and reports print) and
``sequences``, implement ``forced`` and ``scoring`` from the batch's fields (``prefixes``, ``clean_token`` /
``corrupted_token`` at the divergence point, ``clean_ids`` / ``corrupted_ids`` and their ``*_groups``), and add
an instance to ``PATCH_METRICS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # torch only for the types
    import torch

GROUPS: tuple[str, ...] = ("x1", "y1", "x2", "y2", "format")
FORMAT = len(GROUPS) - 1


class PatchMetric:
    """One patch metric (subclass it; module doc). Instances are stateless and shared (``patch_metric``)."""

    name: ClassVar[str]
    label: ClassVar[str]
    sequences: ClassVar[int] = 1  # rows per input and pair, each with its own forced answer

    def check(self, batch: Any) -> None:
        """Refuse (``ValueError``) a ``PairBatch`` this metric cannot measure."""

    def forced(self, batch: Any) -> list[list[int]]:
        """The teacher-forced answer tokens of one side's rows (``batch.side`` of them)."""
        raise NotImplementedError

    def scoring(self, batch: Any) -> dict[str, "torch.Tensor"]:
        """``positions``, ``tokens``, ``weights``, ``groups`` (each ``[batch.side, L]``) of one side."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class AnswerMetric(PatchMetric):
    """``log P(A | x) - log P(B | x)``: both answers teacher-forced in full, every answer token's log-probability
    summed (two rows per input and pair: A-forced, then B-forced); splits exactly into per-coordinate terms."""

    name = "answer"
    label = ("whole-answer log-probability difference log P(clean box) - log P(corrupted box), every box token "
             "teacher-forced")
    sequences = 2

    def check(self, batch: Any) -> None:
        if len(batch.clean_ids) != len(batch.pairs):
            raise ValueError("the whole-answer metric needs every pair's full answers (clean_ids, corrupted_ids); "
                             "build the batch with prepare_pairs, or use metric='first_token'")

    def forced(self, batch: Any) -> list[list[int]]:
        return [list(ids) for ids in batch.clean_ids + batch.corrupted_ids]

    def scoring(self, batch: Any) -> dict[str, "torch.Tensor"]:
        import torch

        sequences = batch.clean_ids + batch.corrupted_ids
        groups = batch.clean_groups + batch.corrupted_groups
        signs = [1.0] * batch.n + [-1.0] * batch.n
        width = max(len(s) for s in sequences)
        positions = torch.full((batch.side, width), batch.prompt_length - 1)
        tokens = torch.zeros(batch.side, width, dtype=torch.long)
        weights = torch.zeros(batch.side, width)
        group = torch.full((batch.side, width), FORMAT)
        for r, (ids, labels) in enumerate(zip(sequences, groups)):
            positions[r, :len(ids)] = torch.arange(len(ids)) + batch.prompt_length - 1
            tokens[r, :len(ids)] = torch.tensor(ids)
            weights[r, :len(ids)] = signs[r]
            group[r, :len(ids)] = torch.tensor(labels)
        return {"positions": positions, "tokens": tokens, "weights": weights, "groups": group}


class FirstTokenMetric(PatchMetric):
    """``logit(A_d) - logit(B_d)`` at the position predicting the first differing answer token ``d``, the common
    prefix teacher-forced (one row per input and pair; one coordinate only)."""

    name = "first_token"
    label = ("single-token logit difference at the first answer token where the clean and corrupted answers "
             "differ (one coordinate only)")

    def forced(self, batch: Any) -> list[list[int]]:
        return [list(p) for p in batch.prefixes]

    def scoring(self, batch: Any) -> dict[str, "torch.Tensor"]:
        import torch

        positions = batch.metric_positions[:, None].repeat(1, 2)
        tokens = torch.stack([batch.clean_token, batch.corrupted_token], dim=1)
        weights = torch.tensor([[1.0, -1.0]]).repeat(batch.n, 1)
        divergence = [groups[len(p)] if groups else FORMAT for groups, p in
                      zip(batch.clean_groups or [[]] * batch.n, batch.prefixes)]
        group = torch.tensor(divergence)[:, None].repeat(1, 2)
        return {"positions": positions, "tokens": tokens, "weights": weights, "groups": group}


PATCH_METRICS: dict[str, PatchMetric] = {metric.name: metric for metric in (AnswerMetric(), FirstTokenMetric())}
DEFAULT_PATCH_METRIC = "answer"


def patch_metric(name: str) -> PatchMetric:
    """The registered metric ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return PATCH_METRICS[name]
    except (KeyError, TypeError):
        raise ValueError(f"metric must be one of {tuple(PATCH_METRICS)}, not {name!r}") from None
