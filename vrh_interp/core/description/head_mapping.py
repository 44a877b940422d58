"""Cross-model index transfer: apply a head list found in one model to another.

The paper's transfer claim (sec. 5.3) compares heads by index between VLMs that share a language
backbone, so indices carry over unchanged ("identity") only when the (layer, head) grids are equal;
anything else is refused with the reason, never silently remapped. ``relative_depth`` is an explicit,
documented option for different depths: layer l of L maps to round(l * (L' - 1) / (L - 1)) with the
head index kept (it requires equal head counts); it is a heuristic, not a claim of correspondence.
"""

from __future__ import annotations

from typing import Literal

from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet


class IncompatibleHeadGridError(ValueError):
    """Two models' head grids do not allow the requested head transfer."""


TransferMapping = Literal["identity", "relative_depth"]


def transfer_heads(heads: HeadSet, source: HeadGeometry, target: HeadGeometry,
                   mapping: TransferMapping = "identity") -> HeadSet:
    """The heads of ``target`` that correspond to ``heads`` of ``source`` under ``mapping``."""
    heads = source.validate(heads)
    if mapping == "identity":
        if (source.num_layers, source.num_heads) != (target.num_layers, target.num_heads):
            raise IncompatibleHeadGridError(
                f"cannot transfer heads by index: source grid {source.num_layers} layers x {source.num_heads} heads, "
                f"target grid {target.num_layers} x {target.num_heads}. Index transfer is meaningful only between "
                "models sharing a language backbone; pass mapping='relative_depth' to map layers by relative depth "
                "explicitly (a heuristic)."
            )
        if source.head_dim != target.head_dim or source.num_kv_heads != target.num_kv_heads:
            raise IncompatibleHeadGridError(
                f"head grids match in size but not in shape (head_dim {source.head_dim} vs {target.head_dim}, "
                f"KV heads {source.num_kv_heads} vs {target.num_kv_heads}): these are not the same backbone"
            )
        return target.validate(heads)
    if mapping == "relative_depth":
        if source.num_heads != target.num_heads:
            raise IncompatibleHeadGridError(
                f"relative_depth keeps head indices, so it needs equal head counts ({source.num_heads} vs "
                f"{target.num_heads})"
            )
        scale = (target.num_layers - 1) / max(source.num_layers - 1, 1)
        mapped: dict[Head, None] = {}
        for head in heads:
            mapped.setdefault(Head(round(head.layer * scale), head.head), None)
        return target.validate(HeadSet(mapped))
    raise ValueError(f"unknown mapping {mapping!r}: use 'identity' or 'relative_depth'")
