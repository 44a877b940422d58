"""The shipped toy VLMs by name, without torch or transformers: which names exist (``FAMILIES``), which checkpoints
this installation ships (``is_shipped``) and a toy's head grid read from its ``config.json`` (``head_grid``), so the
command line refuses a mistyped ``toy:NAME`` or a k beyond the toy's heads before anything heavy loads.
``vrh_interp.toy`` (loading) and ``vrh_interp.toy.configs`` re-export what they share with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

ModelName = Literal["a", "b", "planted", "planted-b", "planted-x", "c", "d"]
Family = Literal["a", "b"]
# each toy model's family: its model class, processor, prompt and native box format ("planted", the positive
# control of docs/results/planted.md, is a LLaVA-class model like "a" with a wider-headed backbone)
# "c" and "d" are the paper-regime pair (128-head backbone shared by a LLaVA-class and an InternVL-class model);
# "planted-b" is the planted backbone behind an InternVL-class vision stack (the positive control's transfer pair),
# "planted-x" the same model with its heads relabelled (the negative transfer control: no index is shared)
FAMILIES: dict[str, Family] = {"a": "a", "b": "b", "planted": "a", "planted-b": "b", "planted-x": "b", "c": "a",
                               "d": "b"}
CHECKPOINT_ROOT = Path(__file__).resolve().parent / "checkpoints"


def family(name: str) -> Family:
    """The family (``"a"``: LLaVA class, ``"b"``: InternVL class) of toy model ``name``."""
    if name not in FAMILIES:
        raise ValueError(f"unknown toy model {name!r}; expected one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def checkpoint_dir(name: str) -> Path:
    if name not in FAMILIES:
        raise ValueError(f"unknown toy model {name!r}; expected one of {sorted(FAMILIES)}")
    return CHECKPOINT_ROOT / name


def is_shipped(name: str) -> bool:
    """Whether toy model ``name``'s checkpoint is in this installation (the one test for it)."""
    return (checkpoint_dir(name) / "model.safetensors").exists()


def shipped_names() -> list[str]:
    """The toy models whose checkpoints this installation ships, sorted."""
    return sorted(name for name in FAMILIES if is_shipped(name))


def config_head_grid(config: dict) -> tuple[int, int] | None:
    """``(layers, heads per layer)`` of a VLM's language backbone from its ``config.json`` contents (``text_config``,
    else the top level); None where the config does not say."""
    for part in (config.get("text_config"), config):
        if isinstance(part, dict):
            layers, heads = part.get("num_hidden_layers"), part.get("num_attention_heads")
            if isinstance(layers, int) and isinstance(heads, int) and layers > 0 and heads > 0:
                return layers, heads
    return None


def head_grid(name: str) -> tuple[int, int] | None:
    """``(layers, heads per layer)`` of shipped toy ``name``'s backbone, from its ``config.json`` (no weights read)."""
    try:
        return config_head_grid(json.loads((checkpoint_dir(name) / "config.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
