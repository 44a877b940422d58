"""Family adapters: one module per VLM family, selected from the model config's ``model_type``.

The map below is declarative (``model_type`` values live on each adapter class). To support a new
family, subclass ``FamilyAdapter`` (see docs/recipes/new-family.md) and pass an instance as
``adapter=`` to ``vrh_interp.wrap`` / ``vrh_interp.load``; nothing global is mutated.
"""

from __future__ import annotations

import importlib
from typing import Any

from vrh_interp.families.base import (
    BoxFrame,
    FamilyAdapter,
    UnsupportedModelError,
    VisualBlock,
    VisualLayout,
)

# "module:Class" of every built-in adapter, in the order `vrh families` lists them.
BUILTIN_ADAPTERS: tuple[str, ...] = (
    "vrh_interp.families.qwen2_vl:Qwen2VLAdapter",
    "vrh_interp.families.qwen2_5_vl:Qwen25VLAdapter",
    "vrh_interp.families.qwen3_vl:Qwen3VLAdapter",
    "vrh_interp.families.internvl:InternVLAdapter",
    "vrh_interp.families.llava:LlavaAdapter",
    "vrh_interp.families.llava_next:LlavaNextAdapter",
    "vrh_interp.families.llava_onevision:LlavaOnevisionAdapter",
    "vrh_interp.families.paligemma:PaliGemmaAdapter",
    "vrh_interp.families.gemma3:Gemma3Adapter",
    "vrh_interp.families.idefics3:Idefics3Adapter",
    "vrh_interp.families.glm4v:Glm4vAdapter",
    "vrh_interp.families.mistral3:Mistral3Adapter",
    "vrh_interp.families.aya_vision:AyaVisionAdapter",
)


def builtin_adapter_classes() -> list[type[FamilyAdapter]]:
    classes = []
    for spec in BUILTIN_ADAPTERS:
        module_name, class_name = spec.split(":")
        classes.append(getattr(importlib.import_module(module_name), class_name))
    return classes


def supported_families() -> dict[str, str]:
    """Registry key -> display name, for every built-in adapter."""
    return {cls.name: cls.display_name for cls in builtin_adapter_classes()}


def adapter_for_config(config: Any) -> FamilyAdapter:
    """The built-in adapter for a model config, or UnsupportedModelError listing what is supported."""
    model_type = getattr(config, "model_type", None)
    for cls in builtin_adapter_classes():
        if model_type in cls.model_types:
            return cls(config)
    listing = ", ".join(f"{cls.display_name} ({'/'.join(cls.model_types)})" for cls in builtin_adapter_classes())
    raise UnsupportedModelError(
        f"no vrh_interp adapter for model_type {model_type!r} ({type(config).__name__}). "
        f"Supported families: {listing}. To add one, subclass vrh_interp.families.FamilyAdapter and pass "
        "adapter=YourAdapter(model.config) to vrh_interp.wrap()/load() (recipe: docs/recipes/new-family.md)."
    )


__all__ = [
    "BUILTIN_ADAPTERS",
    "BoxFrame",
    "FamilyAdapter",
    "UnsupportedModelError",
    "VisualBlock",
    "VisualLayout",
    "adapter_for_config",
    "builtin_adapter_classes",
    "supported_families",
]
