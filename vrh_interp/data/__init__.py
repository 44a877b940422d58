"""Synthetic data: seeded shape scenes with exact boxes, referring expressions and VQA items."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vrh_interp.data.scenes import (
        COLOURS,
        IMAGE_SIZE,
        SHAPES,
        SIZES,
        SPLIT_SEED_RANGES,
        ExpressionSpec,
        GroundingSample,
        NounPhrase,
        Scene,
        SceneObject,
        VQASample,
        grounding_samples,
        make_scene,
        resolve,
        scene_seed,
        vqa_samples,
    )

# imported on first use (PEP 562): `vrh_interp.data.sources` parses a --data spec without numpy and PIL


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'vrh_interp.data' has no attribute {name!r}")
    value = getattr(importlib.import_module("vrh_interp.data.scenes"), name)
    globals()[name] = value
    return value


__all__ = [
    "COLOURS",
    "IMAGE_SIZE",
    "SHAPES",
    "SIZES",
    "SPLIT_SEED_RANGES",
    "ExpressionSpec",
    "GroundingSample",
    "NounPhrase",
    "Scene",
    "SceneObject",
    "VQASample",
    "grounding_samples",
    "make_scene",
    "resolve",
    "scene_seed",
    "vqa_samples",
]
