"""Tiny random-weight VLM fixtures, one module per family, built offline in seconds on CPU.

Each module ``vrh_interp/testing/tiny/<family>.py`` exposes ``build(seed: int = 0) -> TinyVLM``. The
model is a real transformers ``*ForConditionalGeneration`` class with a tiny config (LM: hidden 64,
2 layers, 4 heads, 2 KV heads, head_dim 16 unless the family needs otherwise), its real processor, and a
tokenizer built locally (``vrh_interp.testing.tokenizer``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

# Registry key of each family adapter -> fixture module (same name).
TINY_FAMILIES: tuple[str, ...] = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "internvl",
    "llava",
    "llava_next",
    "llava_onevision",
    "paligemma",
    "gemma3",
    "idefics3",
    "glm4v",
    "mistral3",
    "aya_vision",
)


@dataclass
class TinyVLM:
    """A tiny VLM plus what the layout experiment needs to switch off mixing inside the vision tower."""

    family: str
    model: Any  # the *ForConditionalGeneration, eval mode, fp32
    processor: Any
    vision_attention_modules: Callable[[Any], list[torch.nn.Module]]  # model -> vision-tower attention modules


def build_tiny(family: str, seed: int = 0) -> TinyVLM:
    if family not in TINY_FAMILIES:
        raise ValueError(f"no tiny fixture for {family!r}; available: {', '.join(TINY_FAMILIES)}")
    module = importlib.import_module(f"vrh_interp.testing.tiny.{family}")
    return module.build(seed=seed)
