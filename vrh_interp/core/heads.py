"""Typed attention-head identities.

A head is always a ``Head(layer, head)``: an immutable, ordered, hashable value printed as ``L19H17``.
Bare ``(layer, head)`` tuples never cross the public API, because the order convention is exactly what
peer code gets wrong (VERA swaps it). ``HeadSet`` is an ordered, duplicate-free collection (a ranking
keeps its order; set operations keep the left operand's order) and ``HeadGeometry`` is a model's
(layers, heads, KV heads, head_dim) grid, read from the config, against which head sets are validated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, overload

_HEAD_PATTERN = re.compile(r"^\s*L(\d+)H(\d+)\s*$", re.IGNORECASE)


class HeadOutOfRangeError(ValueError):
    """A head does not exist in the model it is applied to."""


class HeadSpecError(ValueError):
    """A head or head-set text (``L19H17``, ``L1H2,L3H0``) that cannot be read."""


HEAD_SPEC_HELP = "write heads as 'L<layer>H<head>' separated by commas, e.g. 'L2H6,L2H7'"


@dataclass(frozen=True, order=True, slots=True)
class Head:
    """One attention head of the language backbone: ``layer`` and ``head`` are 0-based."""

    layer: int
    head: int

    def __post_init__(self) -> None:
        for name in ("layer", "head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Head.{name} must be an int, got {value!r}")
            if value < 0:
                raise ValueError(f"Head.{name} must be >= 0, got {value}")

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"

    @classmethod
    def parse(cls, text: str) -> "Head":
        """Parse ``"L19H17"`` (case-insensitive) back into ``Head(19, 17)``."""
        if not isinstance(text, str):
            raise HeadSpecError(f"a head is parsed from text such as 'L19H17', got {type(text).__name__} {text!r}")
        match = _HEAD_PATTERN.match(text)
        if match is None:
            raise HeadSpecError(f"cannot parse {text!r} as a head: expected the form 'L<layer>H<head>', e.g. 'L19H17'")
        return cls(int(match.group(1)), int(match.group(2)))


class HeadSet:
    """An ordered collection of distinct heads (order = ranking order, or insertion order).

    ``HeadSet("L2H6,L2H7")`` reads the text with ``HeadSet.parse`` (a string is never iterated character by
    character).
    """

    __slots__ = ("_heads", "_members")

    def __init__(self, heads: Iterable[Head | str] | str = ()) -> None:
        if isinstance(heads, str):
            heads = HeadSet.parse(heads)
        seen: dict[Head, None] = {}
        for item in heads:
            head = Head.parse(item) if isinstance(item, str) else item
            if not isinstance(head, Head):
                raise TypeError(
                    f"HeadSet takes Head objects or 'L<l>H<h>' strings, got {item!r}; "
                    "write Head(layer, head) instead of a bare tuple"
                )
            if head in seen:
                raise HeadSpecError(f"duplicate head {head} in head set: list each head once")
            seen[head] = None
        self._heads: tuple[Head, ...] = tuple(seen)
        self._members: frozenset[Head] = frozenset(seen)

    def __iter__(self) -> Iterator[Head]:
        return iter(self._heads)

    def __len__(self) -> int:
        return len(self._heads)

    def __contains__(self, item: object) -> bool:
        return item in self._members

    @overload
    def __getitem__(self, index: int) -> Head: ...
    @overload
    def __getitem__(self, index: slice) -> "HeadSet": ...
    def __getitem__(self, index: int | slice) -> "Head | HeadSet":
        if isinstance(index, slice):
            return HeadSet(self._heads[index])
        return self._heads[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeadSet) and self._heads == other._heads

    def __hash__(self) -> int:
        return hash(self._heads)

    def __repr__(self) -> str:
        return f"HeadSet([{', '.join(str(h) for h in self._heads)}])"

    def __str__(self) -> str:
        return ",".join(str(h) for h in self._heads)

    @classmethod
    def parse(cls, text: str) -> "HeadSet":
        """Parse ``"L1H2,L3H0"`` (commas and/or whitespace) into a head set. The paper's published lists
        (``"published:MODEL/BENCHMARK"``) are read by ``vrh_interp.published.parse_heads``, which takes both forms
        (``heads`` sits below ``published`` in the layers)."""
        if not isinstance(text, str):
            raise HeadSpecError(f"a head set is parsed from text, got {type(text).__name__} {text!r}; "
                                f"{HEAD_SPEC_HELP}")
        if text.strip().lower().startswith("published:"):
            raise HeadSpecError(f"{text!r} names a published head set: read it with "
                                "vrh_interp.published.parse_heads(text), which takes head lists as well")
        parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
        if not parts:
            raise HeadSpecError(f"empty head set {text!r}: {HEAD_SPEC_HELP}, or 'published:MODEL/BENCHMARK'")
        return cls(Head.parse(p) for p in parts)

    def union(self, other: Iterable[Head]) -> "HeadSet":
        return HeadSet([*self._heads, *(h for h in other if h not in self)])

    def difference(self, other: Iterable[Head]) -> "HeadSet":
        drop = set(other)
        return HeadSet(h for h in self._heads if h not in drop)

    def intersection(self, other: Iterable[Head]) -> "HeadSet":
        keep = set(other)
        return HeadSet(h for h in self._heads if h in keep)

    def by_layer(self) -> dict[int, list[int]]:
        """Head indices grouped by layer, layers ascending (the order in which a forward pass meets them)."""
        grouped: dict[int, list[int]] = {}
        for head in sorted(self._heads):
            grouped.setdefault(head.layer, []).append(head.head)
        return grouped

    def to_list(self) -> list[str]:
        return [str(h) for h in self._heads]


@dataclass(frozen=True, slots=True)
class HeadGeometry:
    """The language backbone's attention grid, read from the model config (never hidden // heads)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if min(self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim) <= 0:
            raise ValueError(f"invalid head geometry {self}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def total_heads(self) -> int:
        return self.num_layers * self.num_heads

    def all_heads(self) -> HeadSet:
        return HeadSet(Head(l, h) for l in range(self.num_layers) for h in range(self.num_heads))

    def validate(self, heads: Iterable[Head]) -> HeadSet:
        """Return ``heads`` as a HeadSet, raising HeadOutOfRangeError for any head the model lacks."""
        head_set = heads if isinstance(heads, HeadSet) else HeadSet(heads)
        bad = [h for h in head_set if h.layer >= self.num_layers or h.head >= self.num_heads]
        if bad:
            raise HeadOutOfRangeError(
                f"heads {', '.join(map(str, bad))} are out of range for a model with {self.num_layers} layers "
                f"x {self.num_heads} heads (valid: L0H0 .. L{self.num_layers - 1}H{self.num_heads - 1})"
            )
        return head_set
