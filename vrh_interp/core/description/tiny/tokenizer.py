"""A tokenizer built locally: byte-level BPE with no merges plus a family's special tokens.

Any text encodes (256 byte symbols), special tokens are atomic, and nothing comes from a model hub.
Processors read attributes such as ``image_token`` from ``extra_special_tokens``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def build_byte_tokenizer(
    special_tokens: Sequence[str],
    *,
    named_special_tokens: Mapping[str, str] | None = None,
    extra_special_tokens: Mapping[str, str] | None = None,
    chat_template: str | None = None,
    padding_side: str = "left",
) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer whose vocabulary is the 256 bytes followed by ``special_tokens``.

    ``named_special_tokens`` maps standard roles (``bos_token``, ``eos_token``, ``pad_token``, ...) to
    tokens; ``extra_special_tokens`` maps processor-read attribute names (``image_token``, ...) to tokens.
    Every token named in either mapping must be listed in ``special_tokens``.
    """
    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(byte_alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    named = dict(named_special_tokens or {})
    extra = dict(extra_special_tokens or {})
    missing = [t for t in (*named.values(), *extra.values()) if t not in special_tokens]
    if missing:
        raise ValueError(f"tokens {missing} are named but not listed in special_tokens")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        extra_special_tokens=extra,
        padding_side=padding_side,
        **named,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.init_kwargs["name_or_path"] = "vrh-interp-tiny-byte-tokenizer"
    return tokenizer
