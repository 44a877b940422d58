"""Synthetic data: seeded shape scenes with exact boxes, referring expressions and VQA items."""

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
