"""``Shard(index, count)``: which samples one of ``count`` machines (or GPUs) processes in a split run.

Rule: contiguous blocks of sample positions, in whole batches. With ``N`` samples and batches of ``B``,
the ``ceil(N / B)`` batches of the unsharded run are dealt out in contiguous runs: shard ``i`` of ``n`` takes
batches ``[i * m, (i + 1) * m)`` with ``m = ceil(ceil(N / B) / n)``, i.e. the sample positions
``[i * m * B, (i + 1) * m * B)`` (the last shards may be shorter or empty). ``index`` is 0-based, like
``Head`` layers: ``--shard 0/3``, ``1/3``, ``2/3``.

Why whole batches rather than ``i % n``: a left-padded batch pads every row to the longest prompt, and the
padding changes float rounding in the last bits of a row's logits and attention, so a sample's answer (and
its statistics) can depend on which samples share its batch. With batch-aligned blocks every batch a shard
runs is exactly a batch the unsharded run runs, so the merged records are bitwise those of an unsharded run,
on any device. The price is that the assignment depends on ``batch_size``; it is recorded in each shard's
manifest and ``merge_runs`` refuses shards run with different batch sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


class ShardSpecError(ValueError):
    """A shard that does not exist (``--shard I/N`` with I outside 0 .. N-1, N < 1, not INDEX/COUNT)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not all(type(value) is int for value in (self.index, self.count)):
            raise TypeError(f"Shard(index, count) takes two ints, got {self.index!r}, {self.count!r}")
        if self.count < 1:
            raise ShardSpecError(f"shard count must be >= 1, got {self.count}")
        if not 0 <= self.index < self.count:
            raise ShardSpecError(f"shard index {self.index} is out of range for {self.count} shards: indices are "
                             f"0-based, 0 .. {self.count - 1} (e.g. --shard 0/{self.count})")

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """``"1/3"`` -> ``Shard(1, 3)``."""
        parts = text.strip().split("/")
        if len(parts) != 2 or not all(p.strip().isdecimal() and len(p) < 20 for p in parts):  # not "²", not 10**5000
            raise ShardSpecError(f"shard {text!r} is not INDEX/COUNT: write e.g. 0/3, 1/3, 2/3 (0-based index)")
        return cls(int(parts[0]), int(parts[1]))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def positions(self, total: int, batch_size: int) -> range:
        """The sample positions (into the full, ordered sample list) this shard processes."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        per_shard = math.ceil(math.ceil(total / batch_size) / self.count) * batch_size
        return range(min(total, self.index * per_shard), min(total, (self.index + 1) * per_shard))

    def select(self, items: Sequence[T], batch_size: int) -> list[T]:
        """This shard's items, in their original order."""
        return [items[p] for p in self.positions(len(items), batch_size)]

    def manifest_entry(self, batch_size: int) -> dict[str, Any]:
        """What a shard's run folder records (``RunFolder`` config key ``"shard"``)."""
        return {"index": self.index, "count": self.count, "batch_size": batch_size, "rule": "batch-blocks/1"}


def shard_config(config: dict[str, Any], shard: Shard | None, batch_size: int) -> dict[str, Any]:
    """``config`` as a shard's run folder records it; unchanged (so unsharded folders resume) without a shard."""
    return config if shard is None else {**config, "shard": shard.manifest_entry(batch_size)}
