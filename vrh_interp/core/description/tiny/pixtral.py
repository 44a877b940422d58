"""``PixtralProcessor`` without its module-level torchvision import, for the tiny Mistral3 (registry row ``mistral3``).

Facts (transformers 5.24, models/pixtral/): ``transformers.models.pixtral.processing_pixtral`` imports torchvision
at module level (through ``image_processing_pixtral``), so ``PixtralProcessor`` cannot be imported without
torchvision. ``PixtralProcessorPort`` is a port of its ``__init__`` token attributes, ``_process_images`` and
``replace_image_token`` (nothing else differs; ``ProcessorMixin.__call__`` does the rest):
``PixtralImageProcessorPil`` downscales an image to fit ``longest_edge`` and stretches each side up to a multiple
of patch x spatial_merge; ``replace_image_token`` writes, per merged row, ``[IMG]`` x cols then ``[IMG_BREAK]``, the
last ``[IMG_BREAK]`` replaced by ``[IMG_END]``. ``tests/families/test_families.py -k mistral3`` compares it with
the real class when torchvision is installed.
"""

from __future__ import annotations

from typing import Any

from transformers import ProcessorMixin


class PixtralProcessorPort(ProcessorMixin):
    """``PixtralProcessor`` (transformers 5.24) without its module-level torchvision import."""

    text_kwargs = {"return_tensors": "pt"}
    images_kwargs = {"return_tensors": "pt"}

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, patch_size: int = 16,
                 spatial_merge_size: int = 1, chat_template: str | None = None, image_token: str = "[IMG]",
                 image_break_token: str = "[IMG_BREAK]", image_end_token: str = "[IMG_END]", **kwargs: Any) -> None:
        super().__init__(image_processor, tokenizer, chat_template=chat_template)
        self.patch_size = patch_size
        self.spatial_merge_size = spatial_merge_size
        self.image_token = image_token
        self.image_break_token = image_break_token
        self.image_end_token = image_end_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.image_break_token_id = tokenizer.convert_tokens_to_ids(image_break_token)
        self.image_end_token_id = tokenizer.convert_tokens_to_ids(image_end_token)

    @property
    def image_token_ids(self) -> list[int]:
        return [self.image_token_id, self.image_break_token_id, self.image_end_token_id]

    def _process_images(self, images: Any, **images_kwargs: Any) -> Any:
        images_kwargs["patch_size"] = self.patch_size * self.spatial_merge_size
        return super()._process_images(images, **images_kwargs)

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs: Any) -> str:
        patch_size = self.patch_size * self.spatial_merge_size
        height, width = image_inputs["image_sizes"][image_idx]
        row = [self.image_token] * (width // patch_size) + [self.image_break_token]
        tokens = row * (height // patch_size)
        tokens[-1] = self.image_end_token
        return "".join(tokens)
