"""``HeadScores``: the L x H score table with its ranking, per-position scores and provenance."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from vrh_interp.core._display import card_html, card_text
from vrh_interp.core.description.heads import Head, HeadLike, HeadOutOfRangeError, HeadSet, HeadsLike, names_one_head
from vrh_interp.core.bookkeeping.runs import write_atomic
from vrh_interp.scoring.design import ScoringDesign

MODEL_IDENTITY = ("model_id", "revision", "architecture", "geometry")  # what makes two models "the same model"


class ScoresTransferWarning(UserWarning):
    """Head scores of one model applied by index to another model."""


@dataclass
class HeadScores:
    scores: np.ndarray  # [layers, heads]
    design: ScoringDesign
    per_position: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))  # [P, layers, heads]
    position_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    sample_ids: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.scores.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.scores.shape[1])

    def ranking(self) -> HeadSet:
        """All heads, best first; ties broken by (layer, head) so the order is deterministic."""
        flat = [(-float(self.scores[l, h]), l, h) for l in range(self.num_layers) for h in range(self.num_heads)]
        return HeadSet(Head(l, h) for _, l, h in sorted(flat))

    def top(self, k: int) -> HeadSet:
        total = self.num_layers * self.num_heads
        if not 0 <= k <= total:
            raise ValueError(f"k={k} is out of range: the model has {total} heads")
        return self.ranking()[:k]

    def score_of(self, head: HeadLike) -> float:
        """The score of one head: ``Head(3, 2)``, ``"L3H2"`` or ``(3, 2)`` (layer first)."""
        return self._score(head, "score_of(head)")

    def _score(self, head: HeadLike, argument: str) -> float:
        found = self._in_grid(HeadSet([Head.coerce(head, argument)]), argument)[0]
        return float(self.scores[found.layer, found.head])

    def __getitem__(self, heads: HeadsLike) -> "float | pd.Series":
        """``scores[h]``: one head's score (``scores["L3H2"]``, ``scores[3, 2]``, ``scores[Head(3, 2)]``); several
        heads (a ``HeadSet``, a list, ``"L3H2,L1H0"``) give a Series of their scores indexed by head name, in order."""
        if names_one_head(heads):
            return self._score(heads, "scores[head]")
        chosen = self._in_grid(HeadSet.coerce(heads, "scores[heads]"), "scores[heads]")
        return pd.Series([float(self.scores[h.layer, h.head]) for h in chosen], index=chosen.to_list(), name="score",
                         dtype=float)

    def _in_grid(self, heads: HeadSet, argument: str) -> HeadSet:
        bad = [str(h) for h in heads if h.layer >= self.num_layers or h.head >= self.num_heads]
        if bad:
            raise HeadOutOfRangeError(f"{argument}: {', '.join(bad)} not in these scores ({self.num_layers} layers x "
                                      f"{self.num_heads} heads: L0H0 .. L{self.num_layers - 1}H{self.num_heads - 1})")
        return heads

    def _card(self, top: int = 5) -> tuple[str, list[tuple[str, str]]]:
        model = (self.provenance.get("model") or {}).get("model_id") or "a model the provenance does not name"
        best = self.top(min(top, self.scores.size))
        positions = f", {self.per_position.shape[0]} answer positions" if self.per_position.size else ""
        skipped = {reason: n for reason, n in self.skipped.items() if n}
        rows = [("model", model), ("design", self.design.label),
                ("samples", f"{len(self.sample_ids)} scored" + (f", skipped {skipped}" if skipped else "")
                 + positions),
                (f"top {len(best)}", ", ".join(f"{h} {self.score_of(h):.3g}" for h in best))]
        return f"HeadScores {self.num_layers} layers x {self.num_heads} heads", rows

    def __repr__(self) -> str:
        """A few lines (model, design, samples, top heads), not the arrays: ``to_frame()`` and ``scores`` hold them."""
        return card_text(*self._card())

    def _repr_html_(self) -> str:
        top = self.to_frame().head(10).to_html(index=False, float_format="{:.4g}".format)
        return card_html(*self._card(), table=top)

    def heatmap(self, title: str | None = None, *, ax: Any = None) -> Any:
        """The layer x head heatmap of the scores: a ``Figure`` a notebook cell ending in it shows as a picture, or
        drawn into ``ax`` (then its figure)."""
        from vrh_interp.viz.plots import score_heatmap

        return score_heatmap(self.scores, title or f"head scores ({self.design.label})", ax=ax)

    def to_frame(self) -> pd.DataFrame:
        ranking = {h: r for r, h in enumerate(self.ranking(), start=1)}
        rows = [{"head": str(Head(l, h)), "layer": l, "head_index": h, "score": float(self.scores[l, h]),
                 "rank": ranking[Head(l, h)]} for l in range(self.num_layers) for h in range(self.num_heads)]
        return pd.DataFrame(rows).sort_values("rank").reset_index(drop=True)

    def per_position_frame(self, top: int | None = 10) -> pd.DataFrame:
        """Scores at each answer position (row predicting answer token p), the top heads per position."""
        rows = []
        for p in range(self.per_position.shape[0]):
            order = np.argsort(-self.per_position[p].ravel(), kind="stable")
            for rank, flat in enumerate(order[: top or len(order)], start=1):
                l, h = divmod(int(flat), self.num_heads)
                rows.append({"position": p, "rank": rank, "head": str(Head(l, h)), "layer": l, "head_index": h,
                             "score": float(self.per_position[p, l, h]), "samples": int(self.position_counts[p])})
        return pd.DataFrame(rows)

    def sparsity(self, thresholds: tuple[float, ...] = (1e-3, 5e-3)) -> pd.DataFrame:
        """Share of heads whose score exceeds each threshold (the paper's sparsity numbers)."""
        total = self.scores.size
        return pd.DataFrame([{"threshold": t, "heads_above": int((self.scores > t).sum()),
                              "share_above": float((self.scores > t).sum() / total)} for t in thresholds])

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "vrh-interp/head-scores/1",
            "design": self.design.as_dict(),
            "scores": self.scores.tolist(),
            "ranking": self.ranking().to_list(),
            "per_position": self.per_position.tolist(),
            "position_counts": [int(c) for c in self.position_counts],
            "sample_ids": list(self.sample_ids),
            "skipped": dict(self.skipped),
            "provenance": self.provenance,
        }

    def transfer_to(self, model: Mapping[str, Any]) -> dict[str, Any] | None:
        """How these scores apply to the model ``model`` describes (``provenance.model_provenance``): None when
        they were computed on it; the index transfer (recorded as the run's ``heads_source``) when they come from
        another model whose heads all exist in this one (meaningful between models sharing a language backbone,
        ``vrh_interp.experiments.transfer``); ``HeadOutOfRangeError`` when some do not."""
        layers, heads = model["geometry"]["layers"], model["geometry"]["heads"]
        source = self.provenance.get("model") or {}
        name, target = source.get("model_id") or "a model the scores file does not name", model.get("model_id")
        grid = f"{self.num_layers} layers x {self.num_heads} heads"
        if self.num_layers > layers or self.num_heads > heads:
            raise HeadOutOfRangeError(
                f"the scores were computed on {name} ({grid}), but this model ({target}) has {layers} layers x "
                f"{heads} heads: heads up to L{self.num_layers - 1}H{self.num_heads - 1} do not exist in it. Use "
                "scores computed on this model (vrh detect), or on one whose head grid it contains")
        same_grid = (self.num_layers, self.num_heads) == (layers, heads)
        if same_grid and all(source.get(k) == model.get(k) for k in MODEL_IDENTITY if k in source):
            return None
        return {"kind": "scores-transfer", "scores_model": {k: source.get(k) for k in MODEL_IDENTITY},
                "note": f"head scores of {name} ({grid}) applied by index to {target} ({layers} layers x {heads} "
                        f"heads): an index transfer, meaningful only between models sharing a language backbone"
                        + ("" if same_grid else f"; the scores rank {self.scores.size} of its {layers * heads} heads")}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "HeadScores":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not a vrh-interp head-scores file (not JSON: {error})") from None
        if not isinstance(data, dict) or data.get("format") != "vrh-interp/head-scores/1":
            raise ValueError(f"{path} is not a vrh-interp head-scores file (format "
                             f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r})")
        return cls(
            scores=np.asarray(data["scores"], dtype=float),
            design=ScoringDesign(**data["design"]),
            per_position=np.asarray(data["per_position"], dtype=float).reshape(
                -1, *np.asarray(data["scores"]).shape) if data["per_position"] else np.zeros((0, 0, 0)),
            position_counts=np.asarray(data["position_counts"], dtype=int),
            sample_ids=list(data["sample_ids"]),
            skipped=dict(data["skipped"]),
            provenance=dict(data["provenance"]),
        )
