"""Typed attention-head identities.

A head is always a ``Head(layer, head)``: an immutable, ordered, hashable value printed as ``L19H17``.
``HeadSet`` is an ordered, duplicate-free collection (a ranking keeps its order; set operations keep the left
operand's order) and ``HeadGeometry`` is a model's (layers, heads, KV heads, head_dim) grid, read from the config,
against which head sets are validated.

One vocabulary for heads across the public API: ``Head.coerce`` reads one head (``Head(3, 2)``, ``"L3H2"`` or a
``(layer, head)`` tuple of two ints, layer first) and ``HeadSet.coerce`` reads any head collection (those, a
``HeadSet``, text ``"L3H2,L1H0"``, a list of any of them, or a ranking such as ``HeadScores``); every function
that takes heads reads them through these two, and names the argument in its error.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Union, overload

_HEAD_PATTERN = re.compile(r"^\s*L(\d+)H(\d+)\s*$", re.IGNORECASE)


class HeadOutOfRangeError(ValueError):
    """A head does not exist in the model it is applied to."""


class HeadSpecError(ValueError):
    """A head or head-set text (``L19H17``, ``L1H2,L3H0``) that cannot be read."""


class HeadTypeError(HeadSpecError, TypeError):
    """A value given as heads whose type names no head (None, a float, a bare int, a dict)."""


HEAD_SPEC_HELP = "write heads as 'L<layer>H<head>' separated by commas, e.g. 'L2H6,L2H7'"
HEAD_FORMS = ("Head(3, 2), 'L3H2', (layer, head) = (3, 2), a HeadSet, 'L3H2,L1H0', a list of these, or a "
              "HeadScores (its ranking)")
HeadLike = Union["Head", str, tuple[int, int]]
HeadsLike = Union[HeadLike, "HeadSet", Iterable[Any], Any]  # any form ``HeadSet.coerce`` reads


def _is_index(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_pair(value: object) -> bool:
    """A ``(layer, head)`` tuple of two ints (a tuple, not a list: ``[3, 2]`` could be two of something)."""
    return isinstance(value, tuple) and len(value) == 2 and all(_is_index(v) for v in value)


def names_one_head(value: object) -> bool:
    """Whether ``value`` is a single-head form (``Head``, ``"L3H2"``, ``(3, 2)``) rather than a collection."""
    return isinstance(value, Head) or _is_pair(value) or (isinstance(value, str) and bool(_HEAD_PATTERN.match(value)))


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

    def _repr_html_(self) -> str:
        """A notebook shows the head's name, ``L3H2`` (layer 3, head 2, 0-based)."""
        return f"<code>{self}</code> (layer {self.layer}, head {self.head})"

    @classmethod
    def parse(cls, text: str) -> "Head":
        """Parse ``"L19H17"`` (case-insensitive) back into ``Head(19, 17)``."""
        if not isinstance(text, str):
            raise HeadSpecError(f"a head is parsed from text such as 'L19H17', got {type(text).__name__} {text!r}")
        match = _HEAD_PATTERN.match(text)
        if match is None:
            raise HeadSpecError(f"cannot parse {text!r} as a head: expected the form 'L<layer>H<head>', e.g. 'L19H17'")
        return cls(int(match.group(1)), int(match.group(2)))

    @classmethod
    def coerce(cls, value: HeadLike, argument: str = "head") -> "Head":
        """One head from ``Head(3, 2)``, ``"L3H2"`` or ``(3, 2)`` (layer first); errors name ``argument``."""
        if isinstance(value, Head):
            return value
        try:
            if isinstance(value, str):
                return cls.parse(value)
            if _is_pair(value):
                return cls(int(value[0]), int(value[1]))
        except ValueError as error:
            raise HeadSpecError(f"{argument}: {error}") from None
        hint = " (a bare int: write (layer, head), e.g. (3, 2))" if _is_index(value) else ""
        raise HeadTypeError(f"{argument}={value!r} is not a head{hint}: write Head(3, 2), 'L3H2' or (3, 2)")


class HeadSet:
    """An ordered collection of distinct heads (order = ranking order, or insertion order).

    ``HeadSet("L2H6,L2H7")`` reads the text with ``HeadSet.parse`` (a string is never iterated character by
    character); items are read by ``Head.coerce``. ``HeadSet.coerce`` reads every other form of heads.
    """

    __slots__ = ("_heads", "_members")

    def __init__(self, heads: Iterable[HeadLike] | str = ()) -> None:
        if isinstance(heads, str):
            heads = HeadSet.parse(heads)
        seen: dict[Head, None] = {}
        for index, item in enumerate(heads):
            head = Head.coerce(item, f"head set item {index}")
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

    def _repr_html_(self) -> str:
        """A notebook shows the count and the heads in order (the first 32, then how many more)."""
        shown = ", ".join(str(h) for h in self._heads[:32])
        more = f" and {len(self) - 32} more" if len(self) > 32 else ""
        return f"<b>HeadSet</b> of {len(self)} head{'' if len(self) == 1 else 's'}: <code>{shown}</code>{more}"

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

    @classmethod
    def coerce(cls, heads: HeadsLike, argument: str = "heads") -> "HeadSet":
        """Any form of heads as a ``HeadSet`` (a ``HeadSet`` itself, a published one included, unchanged): a head
        (``Head.coerce``), text ``"L3H2,L1H0"``, a ranking (an object with ``ranking()``, e.g. ``HeadScores``: all
        its heads, best first), or an iterable of any of these, flattened in order. Errors name ``argument``."""
        if isinstance(heads, HeadSet):
            return heads
        ranking = getattr(heads, "ranking", None)
        if callable(ranking) and not isinstance(heads, type):  # HeadScores: scoring sits above core
            return cls.coerce(ranking(), argument)
        if heads is None:
            raise HeadTypeError(f"{argument} is None: pass {HEAD_FORMS}")
        try:
            if isinstance(heads, str):
                return cls.parse(heads)
            if isinstance(heads, Head) or _is_pair(heads):
                return cls([Head.coerce(heads, argument)])
            if isinstance(heads, (bytes, dict)) or not isinstance(heads, Iterable):
                raise HeadTypeError(f"{argument}={heads!r} ({type(heads).__name__}) names no heads: pass {HEAD_FORMS}")
            if isinstance(heads, (tuple, list)) and heads and all(_is_index(v) for v in heads):
                raise HeadTypeError(f"{argument}={heads!r} names no heads: write one head as a (layer, head) tuple of "
                                    "two ints, e.g. (3, 2), several as a list of such tuples, or Head(3, 2)")
            items: list[Head] = []
            for index, item in enumerate(heads):
                where = f"{argument}[{index}]"
                if isinstance(item, Head) or _is_pair(item):
                    items.append(Head.coerce(item, where))
                elif item is None or _is_index(item):
                    raise HeadTypeError(f"{where}={item!r} is not a head: pass {HEAD_FORMS}")
                else:
                    items.extend(cls.coerce(item, where))
            return cls(items)
        except HeadTypeError:
            raise
        except HeadSpecError as error:
            message = str(error)
            raise HeadSpecError(message if message.startswith(argument) else f"{argument}: {message}") from None

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

    def describe(self) -> str:
        """``4 layers x 8 heads = 32 (4 KV heads, head_dim 64)``: the grid in one line (reprs and cards)."""
        return (f"{self.num_layers} layers x {self.num_heads} heads = {self.total_heads} "
                f"({self.num_kv_heads} KV heads, head_dim {self.head_dim})")

    def all_heads(self) -> HeadSet:
        return HeadSet(Head(l, h) for l in range(self.num_layers) for h in range(self.num_heads))

    def validate(self, heads: HeadsLike, argument: str = "heads") -> HeadSet:
        """Return ``heads`` (any form ``HeadSet.coerce`` reads) as a HeadSet, raising HeadOutOfRangeError for any
        head the model lacks."""
        head_set = HeadSet.coerce(heads, argument)
        bad = [h for h in head_set if h.layer >= self.num_layers or h.head >= self.num_heads]
        if bad:
            raise HeadOutOfRangeError(
                f"heads {', '.join(map(str, bad))} are out of range for a model with {self.num_layers} layers "
                f"x {self.num_heads} heads (valid: L0H0 .. L{self.num_layers - 1}H{self.num_heads - 1})"
            )
        return head_set
