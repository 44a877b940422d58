"""Family adapters: one module per VLM family, selected from the model config's ``model_type``.

The built-in families are the rows of ``vrh_interp.core.description.families.registry`` (adapter, model types, tiny
model, docs facts). To support a new family outside the library, subclass ``FamilyAdapter`` (see
docs/recipes/new-family.md) and pass an instance as ``adapter=`` to ``vrh_interp.wrap`` / ``vrh_interp.load``; nothing
global is mutated.
"""

from __future__ import annotations

import importlib
from typing import Any

from typing import TYPE_CHECKING

from vrh_interp.core.description.families.registry import FAMILIES, FamilyRow, row_for_model_type

if TYPE_CHECKING:
    from vrh_interp.core.description.families.base import (BoxFrame, FamilyAdapter, UnsupportedModelError, VisualBlock,
                                                           VisualLayout)

# imported on first use (PEP 562): the registry is data, and `vrh families` lists it without loading torch
_BASE_EXPORTS = ("BoxFrame", "FamilyAdapter", "UnsupportedModelError", "VisualBlock", "VisualLayout")


def __getattr__(name: str) -> Any:
    if name not in _BASE_EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from vrh_interp.core.description.families import base

    value = getattr(base, name)
    globals()[name] = value
    return value

# "module:Class" of every built-in adapter (its row's adapter in the module named after the key), in the order
# `vrh families` lists them.
BUILTIN_ADAPTERS: tuple[str, ...] = tuple(f"{__name__}.{row.name}:{row.adapter}" for row in FAMILIES)


def adapter_class(row: FamilyRow) -> type[FamilyAdapter]:
    """The adapter class a registry row names (its module imported on first use)."""
    return getattr(importlib.import_module(f"{__name__}.{row.name}"), row.adapter)


def builtin_adapter_classes() -> list[type[FamilyAdapter]]:
    return [adapter_class(row) for row in FAMILIES]


def supported_families() -> dict[str, str]:
    """Registry key -> display name, for every built-in adapter."""
    return {row.name: row.display_name for row in FAMILIES}


def adapter_for_config(config: Any) -> FamilyAdapter:
    """The built-in adapter for a model config, or UnsupportedModelError listing what is supported."""
    model_type = getattr(config, "model_type", None)
    row = row_for_model_type(model_type)
    if row is not None:
        return adapter_class(row)(config)
    from vrh_interp.core.description.families.base import UnsupportedModelError

    listing = ", ".join(f"{row.display_name} ({'/'.join(row.model_types)})" for row in FAMILIES)
    raise UnsupportedModelError(
        f"no vrh_interp adapter for model_type {model_type!r} ({type(config).__name__}). "
        f"Supported families: {listing}. To add one, subclass vrh_interp.core.description.families.FamilyAdapter and "
        "pass adapter=YourAdapter(model.config) to vrh_interp.wrap()/load() (recipe: docs/recipes/new-family.md)."
    )


__all__ = [
    "BUILTIN_ADAPTERS",
    "BoxFrame",
    "FamilyAdapter",
    "UnsupportedModelError",
    "VisualBlock",
    "VisualLayout",
    "adapter_class",
    "adapter_for_config",
    "builtin_adapter_classes",
    "supported_families",
]
