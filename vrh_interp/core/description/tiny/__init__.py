"""Tiny random-weight VLM fixtures, built offline in seconds on CPU from the recipes of the family registry.

Each built-in family's row (``vrh_interp.core.description.families.registry``) carries a ``TinyRecipe``: the real
transformers ``*ForConditionalGeneration`` class with a tiny config (LM: hidden 64, 2 layers, 4 heads, 2 KV heads,
head_dim 16 unless the family needs otherwise), its real processor, and a tokenizer built locally
(``vrh_interp.core.description.tiny.tokenizer``). ``build_recipe`` turns any recipe into a ``TinyVLM``;
``build_tiny(name)`` builds a family's own recipe or one of its ``tiny_variants`` (the language backbones of the
paper's models: ``internvl_qwen3``, ``llava_next_llama3``, ``paligemma2``, ``glm46v``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import transformers

from vrh_interp.core.description.families.registry import FAMILIES, TINY_RECIPES, Call, TinyRecipe
from vrh_interp.core.description.tiny._image_only_processor import image_only_processor_class
from vrh_interp.core.description.tiny.tokenizer import build_byte_tokenizer

# Registry key of every built-in family, each with its tiny fixture.
TINY_FAMILIES: tuple[str, ...] = tuple(row.name for row in FAMILIES)
# The paper models' language backbones in a family's tiny model (name -> family): tests/families/test_paper_models.py
# runs the reference checks on them.
TINY_BACKBONE_VARIANTS: dict[str, str] = {name: row.name for row in FAMILIES for name in row.tiny_variants}

__all__ = ["TINY_BACKBONE_VARIANTS", "TINY_FAMILIES", "TinyVLM", "build_processor", "build_recipe", "build_tiny",
           "modules_at", "resolve"]


@dataclass
class TinyVLM:
    """A tiny VLM plus what the layout experiment needs to switch off mixing inside the vision tower."""

    family: str
    model: Any  # the *ForConditionalGeneration, eval mode, fp32
    processor: Any
    vision_attention_modules: Callable[[Any], list[torch.nn.Module]]  # model -> vision-tower attention modules


def resolve(target: str) -> Any:
    """A transformers attribute by name, or ``".module:attribute"`` of a module in this package."""
    if ":" in target:
        module_name, attribute = target.split(":")
        return getattr(importlib.import_module(module_name, package=__name__), attribute)
    return getattr(transformers, target)


def _instantiate(part: Call | Mapping[str, Any], **extra: Any) -> Any:
    """A ``Call`` built as ``target(**kwargs, **extra)``; a mapping returned as a dict with ``extra`` merged."""
    if isinstance(part, Call):
        return resolve(part.target)(**part.kwargs, **extra)
    return {**part, **extra}


def modules_at(path: str) -> Callable[[Any], list[torch.nn.Module]]:
    """``model -> modules`` at a dotted ``path`` in which ``*`` stands for every item of a module list."""

    def modules(model: Any) -> list[torch.nn.Module]:
        found = [model]
        for part in path.split("."):
            found = [item for obj in found for item in obj] if part == "*" else [getattr(obj, part) for obj in found]
        return found

    return modules


def build_processor(recipe: TinyRecipe) -> Any:
    """The recipe's processor: its image processor and a fresh byte tokenizer, with the tokenizer's chat template."""
    spec = recipe.tokenizer
    tokenizer = build_byte_tokenizer(spec.special_tokens, named_special_tokens=spec.named,
                                     extra_special_tokens=spec.extra or None, chat_template=spec.chat_template)
    processor_class = resolve(recipe.processor.target)
    if recipe.image_only_processor:
        processor_class = image_only_processor_class(processor_class)
    return processor_class(image_processor=_instantiate(recipe.image_processor), tokenizer=tokenizer,
                           chat_template=tokenizer.chat_template, **recipe.processor.kwargs)


def _token_ids(tokenizer: Any, fields: Mapping[str, str | tuple[str, ...]]) -> dict[str, Any]:
    ids = tokenizer.convert_tokens_to_ids
    return {key: [ids(t) for t in token] if isinstance(token, tuple) else ids(token) for key, token in fields.items()}


def build_recipe(recipe: TinyRecipe, seed: int = 0, family: str = "") -> TinyVLM:
    """The tiny model of ``recipe`` with weights drawn after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    processor = build_processor(recipe)
    tokenizer = processor.tokenizer  # PaliGemma's processor adds tokens: sizes are read after it is built
    if recipe.text_token_ids is None:
        text_ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                    "pad_token_id": tokenizer.pad_token_id}
    else:
        text_ids = _token_ids(tokenizer, recipe.text_token_ids)
    config = _instantiate(
        recipe.config,
        text_config=_instantiate(recipe.text_config, vocab_size=len(tokenizer), **text_ids),
        vision_config=_instantiate(recipe.vision_config),
        **_token_ids(tokenizer, recipe.token_ids),
    )
    model = resolve(recipe.model)(config).eval()
    if recipe.set_vocab_size:  # composite configs do not carry the text config's vocabulary size at the top level
        model.config.vocab_size = len(tokenizer)
    with torch.no_grad():
        for path, std in recipe.reinit.items():
            torch.nn.init.normal_(model.get_parameter(path), std=std)
    return TinyVLM(family=family, model=model, processor=processor,
                   vision_attention_modules=modules_at(recipe.vision_attention))


def build_tiny(name: str, seed: int = 0) -> TinyVLM:
    """The tiny fixture of a family (``TINY_FAMILIES``) or of one of its variants (``TINY_BACKBONE_VARIANTS``)."""
    if name not in TINY_RECIPES:
        raise ValueError(f"no tiny fixture for {name!r}; available: {', '.join(TINY_RECIPES)}")
    return build_recipe(TINY_RECIPES[name], seed, name)
