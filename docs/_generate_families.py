"""Render docs/families.md from the built-in family adapters.

    python docs/_generate_families.py          # rewrite docs/families.md
    python docs/_generate_families.py --check  # exit 1 if docs/families.md is stale

The paper's eleven models are listed from ``vrh_interp.families.paper_models`` (how each is verified: ``TINY_CHECK``).
Facts come from the adapter classes themselves: ClassVars (names, config model types, module paths, box
format, non-causal flag), the grounding instruction the adapter really builds, the head_dim rule its
``geometry()`` really applies, and the module docstring (the sources read and the full rules), quoted
verbatim. Only the one-line layout summary and the caveats below are written by hand; a family without them
fails ``tests/test_docs.py``, so a new adapter cannot be added without documenting it.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vrh_interp.families import FamilyAdapter, builtin_adapter_classes  # noqa: E402
from vrh_interp.families.paper_models import PAPER_MODELS  # noqa: E402

OUTPUT = ROOT / "docs" / "families.md"

LAYOUT: dict[str, str] = {
    "qwen2_vl": "whole image stretched (`smart_resize`, axes independent, no crop or pad) to multiples of 28 "
                "(patch 14 x merge 2); one row-major grid of merged tokens, shape read from `image_grid_thw`",
    "qwen2_5_vl": "as Qwen2-VL",
    "qwen3_vl": "as Qwen2-VL with factor 32 (patch 16 x merge 2)",
    "internvl": "closest-aspect cols x rows tiles (within `min_patches`..`max_patches`), image stretched to "
                "(cols T, rows T), tiles row-major, whole-image thumbnail LAST when there is more than one tile; "
                "G x G pixel-shuffled tokens per tile (448 px -> 16 x 16)",
    "llava": "one row-major (S/14)^2 grid over the processed view: pad-to-square (pad mode) or shortest-edge "
             "resize + centre crop (crop mode, the llava-hf processors), read from the processor's settings",
    "llava_next": "base view (whole image stretched to the tile size) FIRST, then best-resolution tiles "
                  "(aspect-fit, centred pad) reassembled into one grid, padded rows/cols removed on the token "
                  "grid, one newline token after each row; one block per tile",
    "llava_onevision": "LLaVA-NeXT's rule, plus bilinear downsampling of large grids (a downsampled token "
                       "covers its source tokens' pixels)",
    "paligemma": "image stretched to S x S, (S/14)^2 tokens row-major, FIRST in the sequence",
    "gemma3": "image stretched to S x S, patches average-pooled to a 16 x 16 row-major grid; with pan & scan "
              "(opt-in) one more block per crop",
    "idefics3": "longest edge resized to L, each side stretched up to a multiple of M, M x M tiles row-major, "
                "global image LAST; g x g pixel-shuffled tokens per frame",
    "glm4v": "as Qwen2-VL (GLM's `smart_resize` to multiples of 28, 2 x 2 downsampling, row-major)",
    "mistral3": "downscaled to fit `longest_edge`, each side rounded up to a multiple of 28, rows x cols "
                "row-major; `[IMG_BREAK]` / `[IMG_END]` are visual positions in no block",
    "aya_vision": "InternVL's tiling rule (GOT-OCR2 processor), 364 px tiles, 13 x 13 tokens per tile, "
                  "thumbnail LAST",
}

CAVEATS: dict[str, list[str]] = {
    "qwen2_vl": ["The attention module uses `hidden_size // num_attention_heads` whatever the config says; the "
                 "geometry follows the module."],
    "qwen2_5_vl": ["Boxes are absolute pixels of the RESIZED input, not 0-1000: `box_frame` needs the encoding "
                   "(`image_grid_thw`). Tools that guess the frame from value ranges misread them."],
    "qwen3_vl": ["DeepStack adds vision features to the image positions after the first LM layers, outside the "
                 "layer modules.", "The attention module reads `config.head_dim` (unlike Qwen2/2.5-VL)."],
    "internvl": ["HF-native `-hf` checkpoints only (`trust_remote_code` stays off).",
                 "Only `<IMG_CONTEXT>` positions are visual; `<img>`/`</img>` are text.",
                 "A call-time override of `min_patches`/`max_patches` raises instead of giving wrong tokens."],
    "llava": ["Crop mode: parts of a non-square image outside the central square reach no token, so a box "
              "there selects nothing (the sample is skipped by scoring).",
              "LLaVA issue threads (#606, #623, #822) report mixed box frames in the training data (padded "
              "square for Visual Genome, unpadded image for RefCOCO)."],
    "llava_next": ["Newline tokens are visual positions but cover no pixels."],
    "llava_onevision": ["SigLIP 384 / 14 leaves 6-pixel gaps per tile; downsampled tokens' rectangles overlap."],
    "paligemma": ["No chat template: the prompt is `<image>detect EXPR` (the model card's detection prefix).",
                  "Attention is non-causal over the whole prefix (image, `<bos>`, prompt).",
                  "PaliGemma 2 (Gemma 2) interleaves sliding-window layers and soft-caps logits (the readout applies "
                  "both; Gemma 2 runs eager attention, sdpa cannot soft-cap): during generation a readout of a "
                  "sliding layer raises `ReadoutUnavailableError` once prompt + answer fill the window.",
                  "The processor's `labels` output is dropped by `encode`."],
    "gemma3": ["No documented grounding format: the Gemini convention is requested (not a trained format).",
               "Sliding-window layers (5:1 in released checkpoints): the region readout during generation "
               "raises `ReadoutUnavailableError` for prompts longer than the window; the window also bounds the "
               "bidirectional image block.",
               "Scores are scaled by `query_pre_attn_scalar**-0.5` (handled: the readout reads the real scaling)."],
    "idefics3": ["Released checkpoints were not trained to ground: the requested format is not a trained one.",
                 "The backbone lives at `model.text_model`, not `model.language_model`."],
    "glm4v": ["Thinking checkpoints: the box is read after the last `</think>`; the bracket style may vary."],
    "mistral3": ["Mistral documents no grounding format: the LLaVA-style format is requested."],
    "aya_vision": ["No documented grounding format: the requested one is not trained.",
                   "Cohere2 interleaves sliding-window layers (RoPE) with full-attention layers (no position "
                   "encoding): generation-time region readout is limited by the window."],
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    ticks = "``" if "`" in text else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


class _FakeConfig:
    """A text config whose head_dim (32) differs from hidden // heads (16): reveals each adapter's rule."""

    def get_text_config(self) -> SimpleNamespace:
        return SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                               head_dim=32)


def _head_dim_rule(cls: type[FamilyAdapter]) -> str:
    head_dim = cls(_FakeConfig()).geometry().head_dim
    if head_dim == 32:
        return "`head_dim` from the text config (hidden // heads only when the config has none)"
    return "`hidden_size // num_attention_heads`, whatever the config's `head_dim` says"


def _prompt(cls: type[FamilyAdapter]) -> str:
    instruction = cls(None).grounding_instruction("EXPR")
    if cls.grounding_prompt is FamilyAdapter.grounding_prompt:
        return f"{_code(instruction)} as the user turn, with the image, through the processor's chat template"
    doc = inspect.getdoc(cls.grounding_prompt) or ""
    return f"{_code(instruction)}; {doc.splitlines()[0] if doc else 'custom prompt'}"


def _intro_and_facts(cls: type[FamilyAdapter]) -> tuple[str, str]:
    doc = inspect.getdoc(sys.modules[cls.__module__]) or ""
    intro, _, facts = doc.partition("\n\n")
    return " ".join(intro.split()), facts.strip()


META_CHECK = ("meta-device build from the config facts (parameter count = the hub's, adapter, head grid vs the "
              "attention modules, template module paths)")
# How each paper model's language backbone is checked on tiny models (tests/families/test_paper_models.py and
# the family tests); remote-code models have no native check.
TINY_CHECK: dict[str, str] = {
    "Qwen2.5-VL-7B": "tiny `qwen2_5_vl` reference equality; every published set fits",
    "Qwen3-VL-8B": "tiny `qwen3_vl` reference equality; every published set fits",
    "InternVL3-8B": "tiny `internvl` (Qwen2 backbone) reference equality; every published set fits",
    "InternVL3.5-8B": "tiny `internvl_qwen3` (Qwen3 backbone) reference equality; every published set fits",
    "LLaVA-NeXT-Llama3-8B": "tiny `llava_next_llama3` (Llama 3 backbone) reference equality",
    "PaliGemma2-10B": "tiny `paligemma2` (Gemma 2: soft-capping, sliding windows) reference equality, soft-capped "
                      "windowed readout vs eager, sliding layers refused during generation",
    "GLM-4.6V-Flash": "tiny `glm46v` (transformers' glm46v classes, GLM-4.6V-Flash's 16:1 GQA shape at 4:1) "
                      "reference equality and layout experiment, plus tiny `glm4v`",
}


def _paper_models() -> list[str]:
    lines = [
        "## The paper's eleven models",
        "",
        "`vrh families --paper` prints this list. Configuration facts: `vrh_interp/families/paper_models.py`,",
        "recorded from each checkpoint's public `config.json` (linked; written from public knowledge, since nothing",
        "can be downloaded where the tests run). Tests: `tests/families/test_paper_models.py`. \"Meta-device build\":",
        "the full-size model is built without weights from those facts; its parameter count must equal the one its",
        "hub page shows, the registry must pick the adapter, the adapter's head grid must match every attention",
        "module, and the module paths the ablation, capture and readout templates name must be that layer's",
        "attention and output projection. \"Reference equality\": a tiny random-weight model with the same language",
        "backbone passes the plain-PyTorch reference checks of `tests/test_templates.py`. Remote-code models need",
        "their authors' code (`trust_remote_code`, never enabled for the user): \"described\" ones have the",
        "`AttentionDescription` to pass in [the remote-code recipe](recipes/remote-code-models.md), read from the",
        "public model code; none of them was run here.",
        "",
        "| model | backbone | checkpoint | layers x heads (KV, head_dim) | status | verified by |",
        "|---|---|---|---|---|---|",
    ]
    for m in PAPER_MODELS:
        g = m.geometry
        grid = "not recorded" if g is None else f"{g.num_layers} x {g.num_heads} ({g.num_kv_heads}, {g.head_dim})"
        check = f"{META_CHECK}; {TINY_CHECK[m.name]}" if m.name in TINY_CHECK else (
            f"{m.note}; description not run on the checkpoint" if m.described else f"not yet: {m.note}")
        lines.append(f"| {m.name} | {m.backbone} | [`{m.checkpoint}`]({m.source}) | {grid} | {m.status} | "
                     f"{_cell(check)} |")
    return lines + [""]


def render() -> str:
    classes = builtin_adapter_classes()
    missing = [c.name for c in classes if c.name not in LAYOUT or c.name not in CAVEATS]
    if missing:
        raise KeyError(f"docs/_generate_families.py has no layout summary / caveats for {missing}")
    lines = [
        "# Supported families",
        "",
        "<!-- Generated by docs/_generate_families.py from the adapter classes; do not edit by hand. -->",
        "",
        "One adapter per family (`vrh_interp/families/<family>.py`), picked from `config.model_type` by",
        "`vrh.wrap` / `vrh.load`; `vrh families` prints the same list. To add one, see",
        "[the new-family recipe](recipes/new-family.md). Every family has a tiny random-weight fixture",
        "(`vrh_interp.testing.tiny.build_tiny(family)`) on which ablation, readout and capture are checked against",
        "plain-PyTorch references, and its layout rule is checked by experiment",
        "(`vrh_interp.testing.layout_probe`).",
        "",
        "Boxes cross the API in ORIGINAL image pixels (xyxy); each adapter converts from its native frame.",
        "",
        "| key | family | `model_type` | native box format | non-causal image attention |",
        "|---|---|---|---|---|",
    ]
    for cls in classes:
        lines.append(f"| [`{cls.name}`](#{cls.name}) | {_cell(cls.display_name)} | "
                     f"{', '.join(f'`{t}`' for t in cls.model_types)} | {_cell(_code(cls.box_format))} | "
                     f"{'yes' if cls.non_causal_image_attention else 'no'} |")
    lines += ["", *_paper_models()]
    for cls in classes:
        adapter = cls(None)
        intro, facts = _intro_and_facts(cls)
        attention = adapter.attention_path(0).replace(".0.", "[i].")
        rows = [
            ("registry key", f"`{cls.name}`"),
            ("config `model_type`", ", ".join(f"`{t}`" for t in cls.model_types)),
            ("attention module", f"`{attention}`, output projection `{cls.output_projection_attr}`"),
            ("head_dim", _head_dim_rule(cls)),
            ("non-causal image attention", "yes" if cls.non_causal_image_attention else "no"),
            ("native box format", _code(cls.box_format)),
            ("grounding prompt", _prompt(cls)),
            ("layout rule", LAYOUT[cls.name]),
            ("caveats", "<br>".join(CAVEATS[cls.name])),
            ("adapter", f"`{cls.__module__}.{cls.__name__}`"),
        ]
        lines += ["", f"<a id=\"{cls.name}\"></a>", "", f"## {cls.display_name}", "", intro, "",
                  "| | |", "|---|---|"]
        lines += [f"| {name} | {_cell(value)} |" for name, value in rows]
        lines += ["", "<details><summary>Facts and sources (the adapter module's docstring)</summary>", "",
                  facts, "", "</details>"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is stale: run python docs/_generate_families.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
