"""The VQA user turn: one image, the question, lettered options (unless the question lists them), an answer format.

``vqa_user_text`` builds the text; ``vqa_prompt`` wraps it with the model's own chat template through its
processor (``apply_chat_template`` with an image entry and ``add_generation_prompt``), the same way the
family adapters build grounding prompts. A processor without a chat template (PaliGemma) gets the image
token followed by the text, its task-prefix convention.
"""

from __future__ import annotations

from vrh_interp.data.datasets.samples import VQASample
from vrh_interp.core.description.model import VLM


def vqa_user_text(sample: VQASample) -> str:
    parts = [sample.question.strip()]
    if sample.choices and not sample.choices_in_question:
        parts.append("\n".join(f"{letter}. {choice}" for letter, choice in zip(sample.letters, sample.choices)))
    if sample.instruction:
        parts.append(sample.instruction)
    return "\n".join(parts)


def vqa_messages(sample: VQASample) -> list[dict]:
    """One user turn: the image, then the question text."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": vqa_user_text(sample)}]}]


def vqa_prompt(vlm: VLM, sample: VQASample) -> str:
    processor = vlm.processor
    if getattr(processor, "chat_template", None) is None:
        return f"{vlm.adapter.image_token(processor)}{vqa_user_text(sample)}"
    return processor.apply_chat_template(vqa_messages(sample), add_generation_prompt=True, tokenize=False)
