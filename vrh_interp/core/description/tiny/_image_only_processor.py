"""Image-only variants of processors whose ``__init__`` also takes a ``video_processor``.

Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, InternVL, SmolVLM and LLaVA-OneVision processors take
``(image_processor, tokenizer, video_processor, chat_template)``; their video processors import
torchvision, which the fixtures do not need. Passing ``video_processor=None`` fails the processor's
argument check, but ``ProcessorMixin`` reads its list of sub-processors from the ``__init__`` signature of
the concrete class (``ProcessorMixin.get_attributes`` in transformers/processing_utils.py). A subclass
whose signature names only ``image_processor`` and ``tokenizer`` therefore constructs without a video
processor and runs the parent's own ``__init__`` (token attributes) and ``__call__`` unchanged.
"""

from __future__ import annotations

from typing import Any

from transformers import ProcessorMixin


def image_only_processor_class(processor_class: type[ProcessorMixin]) -> type[ProcessorMixin]:
    """A subclass of ``processor_class`` constructed from an image processor and a tokenizer only."""

    def __init__(self: ProcessorMixin, image_processor: Any = None, tokenizer: Any = None,
                 chat_template: str | None = None, **kwargs: Any) -> None:
        processor_class.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type(f"{processor_class.__name__}ImageOnly", (processor_class,), {"__init__": __init__})
