"""Render docs/families.md from the built-in family adapters.

    python docs/_generate_families.py          # rewrite docs/families.md
    python docs/_generate_families.py --check  # exit 1 if docs/families.md is stale

The paper's eleven models are listed from ``vrh_interp.core.description.families.paper_models`` (how each is verified:
``TINY_CHECK``). Facts come from the family registry (``vrh_interp.core.description.families.registry``: names, config
model types, model classes, TransformerLens support, and the hand-written one-line layout summary and caveats of each
row) and from the adapter classes themselves: ClassVars (module paths, box format, non-causal flag), the grounding
instruction the adapter really builds, the head_dim rule its ``geometry()`` really applies, and the module
docstring (the sources read and the full rules), quoted verbatim. A row without a layout summary or caveats
fails ``tests/families/test_registry.py``, so a new family cannot be added without documenting it.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vrh_interp.core.description.families import FamilyAdapter, adapter_class  # noqa: E402
from vrh_interp.core.description.families.paper_models import PAPER_MODELS  # noqa: E402
from vrh_interp.core.description.families.registry import FAMILIES  # noqa: E402

OUTPUT = ROOT / "docs" / "families.md"

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


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


# Remote-code models whose language model transformers ships (``PaperModel.backbone_config``)
BACKBONE_CHECK = ("language model built on the meta device from the recorded facts (its hub parameter count, head "
                  "grid, the description fits every layer); tiny random `{type}` language model: described masking, "
                  "capture and readout vs o_proj pre-hooks and attention computed by hand")


def _paper_models() -> list[str]:
    lines = [
        "## The paper's eleven models",
        "",
        "`vrh families --paper` prints this list. Configuration facts: "
        "`vrh_interp/core/description/families/paper_models.py`,",
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
        if m.backbone_type is not None:
            check += "; " + BACKBONE_CHECK.format(type=m.backbone_type)
        lines.append(f"| {m.name} | {m.backbone} | [`{m.checkpoint}`]({m.source}) | {grid} | {m.status} | "
                     f"{_cell(check)} |")
    return lines + [""]


def render() -> str:
    lines = [
        "# Supported families",
        "",
        "<!-- Generated by docs/_generate_families.py from the family registry and the adapter classes; "
        "do not edit by hand. -->",
        "",
        "One adapter per family (`vrh_interp/core/description/families/<family>.py`), picked from `config.model_type` "
        "by",
        "`vrh.wrap` / `vrh.load`; `vrh families` prints the same list. The list is the family registry",
        "(`vrh_interp/core/description/families/registry.py`, one row per family); to add one, see",
        "[the new-family recipe](recipes/new-family.md). Every family has a tiny random-weight fixture",
        "(`vrh_interp.core.description.tiny.build_tiny(family)`, built from its row) on which ablation, readout and "
        "capture",
        "are checked against plain-PyTorch references, and its layout rule is checked by experiment",
        "(`tests.layout_probe`).",
        "",
        "Boxes cross the API in ORIGINAL image pixels (xyxy); each adapter converts from its native frame.",
        "",
        "| key | family | `model_type` | native box format | non-causal image attention | TransformerLens |",
        "|---|---|---|---|---|---|",
    ]
    for row in FAMILIES:
        cls = adapter_class(row)
        lines.append(f"| [`{row.name}`](#{row.name}) | {_cell(row.display_name)} | "
                     f"{', '.join(f'`{t}`' for t in row.model_types)} | {_cell(_code(cls.box_format))} | "
                     f"{_yes(cls.non_causal_image_attention)} | {_yes(row.transformer_lens)} |")
    lines += ["", *_paper_models()]
    for row in FAMILIES:
        cls = adapter_class(row)
        adapter = cls(None)
        intro, facts = _intro_and_facts(cls)
        attention = adapter.attention_path(0).replace(".0.", "[i].")
        table = [
            ("registry key", f"`{row.name}`"),
            ("config `model_type`", ", ".join(f"`{t}`" for t in row.model_types)),
            ("model class", ", ".join(f"`{name}`" for name in row.model_classes)),
            ("attention module", f"`{attention}`, output projection `{cls.output_projection_attr}`"),
            ("head_dim", _head_dim_rule(cls)),
            ("non-causal image attention", _yes(cls.non_causal_image_attention)),
            ("native box format", _code(cls.box_format)),
            ("grounding prompt", _prompt(cls)),
            ("layout rule", row.layout),
            ("caveats", "<br>".join(row.caveats)),
            ("TransformerLens backend", _yes(row.transformer_lens)),
            ("adapter", f"`{cls.__module__}.{cls.__name__}`"),
        ]
        lines += ["", f"<a id=\"{row.name}\"></a>", "", f"## {row.display_name}", "", intro, "",
                  "| | |", "|---|---|"]
        lines += [f"| {name} | {_cell(value)} |" for name, value in table]
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
