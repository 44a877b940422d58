"""Word-level tokenizer for the toy VLMs, built locally (no hub download).

Why word level: with byte-level tokens a query word ("circle") spans several tokens and a
coordinate ("0.37") spans four, so a tiny model must first assemble words and numbers before it
can bind the query to the image. With one token per word, per punctuation mark and per
coordinate value, the grounding answer is "retrieve the referent's visual token and copy one
coordinate token per step", which is exactly the mechanism a visual retrieval head implements.

The vocabulary is shared by both toy families (they share one Qwen2 language backbone, as the
paper's same-backbone VLM pairs do): Qwen2 chat specials, the LLaVA ``<image>`` token, the
InternVL image/ref/box tokens, every scene word, the LLaVA coordinates ``0.00``..``1.00`` and the
InternVL coordinates ``0``..``1000`` in steps of 10 (plus ``1``..``9`` for counts).

Text is lower-cased (special tokens are not normalised); pre-tokenisation splits on whitespace and isolates every punctuation mark, number and word;
decoding joins tokens with single spaces (e.g. ``[ 0.12, 0.34, 0.56, 0.78 ]`` after the WordPiece
decoder's punctuation cleanup), so box parsers must accept optional spaces.
"""  # noqa: E501

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from vrh_interp.data.scenes import COLOURS, ORDER_DIRECTIONS, ORDINALS, RELATIONS, SHAPES, SIZES

PAD_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<unk>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
LLAVA_IMAGE_TOKEN = "<image>"
INTERNVL_IMAGE_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
INTERNVL_REF_BOX_TOKENS = ("<ref>", "</ref>", "<box>", "</box>")
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    UNK_TOKEN,
    IM_START,
    IM_END,
    LLAVA_IMAGE_TOKEN,
    *INTERNVL_IMAGE_TOKENS.values(),
    *INTERNVL_REF_BOX_TOKENS,
)

PROMPT_WORDS = (
    "system user assistant you are a helpful please provide the bounding box coordinate of region this "
    "sentence describes what colour is how many are there answer with letter number word yes no from "
    "an object objects image in"
).split()
PUNCTUATION = tuple("[](),.?:;!'\"-_/")
LLAVA_COORDINATES = tuple(f"{v / 100:.2f}" for v in range(101))
INTERNVL_COORDINATES = tuple(str(v) for v in range(0, 1001, 10))
SMALL_INTEGERS = tuple(str(v) for v in range(1, 10))

PRE_TOKENIZER_PATTERN = r"\d+\.\d+|\d+|[A-Za-z]+|[^\sA-Za-z\d]"


def vocabulary_words() -> list[str]:
    """All non-special tokens, in a fixed order (ids are stable across builds)."""
    relation_words = [w for r in RELATIONS for w in r.split()]
    words = [
        *PROMPT_WORDS,
        *COLOURS,
        *SHAPES,
        *(f"{s}s" for s in SHAPES),
        *SIZES,
        *relation_words,
        *ORDINALS,
        *ORDER_DIRECTIONS,
        *PUNCTUATION,
        *LLAVA_COORDINATES,
        *INTERNVL_COORDINATES,
        *SMALL_INTEGERS,
    ]
    return list(dict.fromkeys(words))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Shared word-level tokenizer; specials are ``AddedToken(special=True)`` and never split."""
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *vocabulary_words()))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated"),
        ]
    )
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        eos_token=IM_END,
        bos_token=None,
        extra_special_tokens={"image_token": LLAVA_IMAGE_TOKEN, **INTERNVL_IMAGE_TOKENS},
        padding_side="left",
        model_max_length=512,
    )
