"""What a model can take, checked before any work: a prompt plus its answer budget must fit the model's context.

A grounding prompt longer than the context (a 2,000-character expression is well over a thousand tokens; a toy
model has 512 positions) does not fail: it runs, and the answer read from positions the model never saw is
garbage that scores as a plain miss. ``check_prompts_fit`` refuses it up front, naming the sample, its length in
tokens and the limit. The context is the text config's ``max_position_embeddings`` (each family's adapter knows
its text config); a family whose config does not say is not checked.

Lengths are counted with the model's own processor: the prompt of the sample with the largest image (the image
tokens grow with it for dynamic-resolution families) is encoded whole, and every other sample's prompt is that
prompt with its own expression's tokens in place of the largest one's (the tokenizer alone, batched, so ten
thousand samples cost a fraction of a second).
"""

from __future__ import annotations

from typing import Any, Sequence


class InputLimitError(ValueError):
    """An input the model cannot take (a prompt and answer longer than its context); the message names the limit."""


def context_length(vlm: Any) -> int | None:
    """Positions the model's language model takes (text config ``max_position_embeddings``); None when unknown."""
    value = getattr(vlm.adapter.text_config(), "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _image_size(sample: Any) -> tuple[int, int]:
    size = getattr(sample, "image_size", None)
    return tuple(size) if size is not None else sample.image.size  # type: ignore[return-value]


def check_answer_budget(vlm: Any, max_new_tokens: Any, *, option: str = "max_new_tokens") -> None:
    """``max_new_tokens`` must be a whole number >= 1 and leave room for a prompt in the model's context."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputLimitError(f"{option} must be a whole number >= 1, got {max_new_tokens!r}")
    limit = context_length(vlm)
    if limit is not None and max_new_tokens >= limit:
        raise InputLimitError(f"{option}={max_new_tokens} answer tokens cannot be produced: the model's context is "
                              f"{limit} positions (text config max_position_embeddings) for prompt and answer "
                              f"together; use at most a few dozen (a box takes about 20)")


def prompt_lengths(vlm: Any, samples: Sequence[Any]) -> list[int]:
    """Each sample's grounding prompt length in tokens (image tokens included, at the largest image's count)."""
    largest = max(range(len(samples)), key=lambda i: _image_size(samples[i])[0] * _image_size(samples[i])[1])
    reference = samples[largest]
    full = vlm.encode_grounding([reference.image], [reference.expression]).prompt_length
    counts = [len(ids) for ids in vlm.tokenizer([s.expression for s in samples], add_special_tokens=False)["input_ids"]]
    return [full - counts[largest] + count for count in counts]


def check_prompts_fit(vlm: Any, samples: Sequence[Any], max_new_tokens: int, *,
                      option: str = "max_new_tokens") -> None:
    """Refuse samples whose prompt plus ``max_new_tokens`` answer tokens exceed the model's context
    (``InputLimitError`` naming the first such sample, the lengths and the limit); the answer budget itself is
    checked first (``check_answer_budget``)."""
    check_answer_budget(vlm, max_new_tokens, option=option)
    limit = context_length(vlm)
    if limit is None or not samples:
        return
    lengths = prompt_lengths(vlm, samples)
    over = [i for i, length in enumerate(lengths) if length + max_new_tokens > limit]
    if over:
        first = samples[over[0]]
        raise InputLimitError(
            f"{len(over)} of {len(samples)} samples do not fit the model's context of {limit} positions (text "
            f"config max_position_embeddings), e.g. sample {first.sample_id!r}: its prompt is {lengths[over[0]]} "
            f"tokens (its expression {len(first.expression)} characters) + {option}={max_new_tokens}: the model "
            "would answer from positions it never saw. Shorten those expressions or remove those samples")
