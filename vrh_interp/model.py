"""The ``VLM`` handle: a HF vision-language model, its processor, its family adapter, and its nnsight wrapper.

One code path for everything: ``load`` reads a hub id or a local folder exactly as ``from_pretrained``
does (``device_map``, ``dtype``, ``revision``; ``trust_remote_code`` stays off unless the caller turns
it on) and ``wrap`` takes a model the user already has; both end in the same ``VLM``. The tiny test
fixtures, the shipped toy models and 7B checkpoints all go through ``wrap``.

The nnsight ``TransformersModel`` is built lazily, because wrapping replaces every submodule's forward in
place (a few percent slower even outside a trace). Plain-PyTorch paths (the references in tests) use
``hf_model`` directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from PIL import Image

from vrh_interp.boxes import Box
from vrh_interp.families import FamilyAdapter, adapter_for_config
from vrh_interp.families.base import BoxFrame, VisualLayout
from vrh_interp.heads import HeadGeometry


@dataclass
class GroundingBatch:
    """A processor encoding of (image, expression) pairs plus each row's visual layout and box frame."""

    encoding: Any  # BatchFeature / dict of tensors, left-padded
    layouts: list[VisualLayout]
    frames: list[BoxFrame]
    prompts: list[str]

    @property
    def batch_size(self) -> int:
        return len(self.prompts)

    @property
    def prompt_length(self) -> int:
        return int(self.encoding["input_ids"].shape[1])


@dataclass
class VLM:
    """A vision-language model ready for head-level work."""

    hf_model: Any
    processor: Any
    adapter: FamilyAdapter
    model_id: str | None = None
    revision: str | None = None
    _nnsight_model: Any = field(default=None, repr=False)

    @property
    def geometry(self) -> HeadGeometry:
        return self.adapter.geometry()

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def nn(self) -> Any:
        """The nnsight ``TransformersModel`` wrapping ``hf_model`` (built on first use)."""
        if self._nnsight_model is None:
            import nnsight

            self._nnsight_model = nnsight.TransformersModel(
                self.hf_model, task="image-text-to-text", processor=self.processor
            )
        return self._nnsight_model

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def image_token_id(self) -> int:
        return self.adapter.image_token_id(self.processor)

    def encode_grounding(self, images: Sequence[Image.Image], expressions: Sequence[str]) -> GroundingBatch:
        """Encode a left-padded batch of grounding prompts, one image each, with layouts and box frames."""
        if len(images) != len(expressions):
            raise ValueError(f"{len(images)} images but {len(expressions)} expressions")
        if not images:
            raise ValueError("encode_grounding needs at least one (image, expression) pair")
        prompts = [self.adapter.grounding_prompt(self.processor, e) for e in expressions]
        encoding = self.adapter.encode(self.processor, [img.convert("RGB") for img in images], prompts)
        encoding = encoding.to(self.device)
        sizes = [img.size for img in images]
        layouts = [self.adapter.visual_layout(encoding, size, self.processor, i) for i, size in enumerate(sizes)]
        frames = [self.adapter.box_frame(encoding, size, i, processor=self.processor) for i, size in enumerate(sizes)]
        return GroundingBatch(encoding=encoding, layouts=layouts, frames=frames, prompts=prompts)

    def answer_lengths(self, generated: torch.Tensor, prompt_length: int) -> list[int]:
        """Answer tokens per row: the new tokens before the first EOS (tokenizer's or generation config's) / pad."""
        stop = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        configured = getattr(self.hf_model.generation_config, "eos_token_id", None)
        if configured is not None:
            stop.update(configured if isinstance(configured, list) else [configured])
        lengths = []
        for row in generated[:, prompt_length:].tolist():
            n = 0
            while n < len(row) and row[n] not in stop:
                n += 1
            lengths.append(n)
        return lengths

    def decode_answers(self, generated: torch.Tensor, prompt_length: int) -> list[str]:
        """Decode each row's answer tokens (special tokens kept: several box formats use them)."""
        new_tokens = generated[:, prompt_length:].tolist()
        return [self.tokenizer.decode(row[:n], skip_special_tokens=False)
                for row, n in zip(new_tokens, self.answer_lengths(generated, prompt_length))]


def wrap(model: Any, processor: Any, *, adapter: FamilyAdapter | None = None, model_id: str | None = None,
         revision: str | None = None) -> VLM:
    """Wrap a HF ``*ForConditionalGeneration`` already in memory (any device / dtype)."""
    if adapter is None:
        adapter = adapter_for_config(model.config)
    model.eval()
    return VLM(hf_model=model, processor=processor, adapter=adapter,
               model_id=model_id or getattr(model.config, "_name_or_path", None) or None, revision=revision)


def load(model_id_or_path: str | os.PathLike[str], *, device_map: Any = None, dtype: Any = None,
         revision: str | None = None, trust_remote_code: bool = False, adapter: FamilyAdapter | None = None,
         attn_implementation: str = "sdpa", **from_pretrained_kwargs: Any) -> VLM:
    """Load a checkpoint from a hub id or a local folder and wrap it.

    ``trust_remote_code`` is never enabled on the user's behalf: HF-native classes are used.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    source = os.path.expanduser(os.fspath(model_id_or_path))
    looks_like_path = os.path.isabs(source) or source.startswith(".") or source.count("/") > 1
    if looks_like_path and not os.path.exists(source):
        raise FileNotFoundError(f"model folder {source!r} does not exist (pass a hub id or an existing folder)")
    model = AutoModelForImageTextToText.from_pretrained(
        source, device_map=device_map, dtype=dtype, revision=revision, trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation, **from_pretrained_kwargs,
    )
    processor = AutoProcessor.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    return wrap(model, processor, adapter=adapter, model_id=source, revision=revision)
