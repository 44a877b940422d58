"""benchmarks/real_shape.py at a tiny shape (seconds): every line it promises, its options, its refusals.

The real-shape numbers are measured by hand (docs/benchmarks.md); here the script runs end to end with widths
scaled down (``--scale``), two language-model layers and one vision layer, so the code paths it times (readout,
masked generation, scoring, a condition batch, a patching pair, the bf16 / fp32 slice) are the ones tested.
No timing or memory ratio is asserted: they are measured, not promised, on a shared CPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from vrh_interp.core.description.families import adapter_for_config
from vrh_interp.core.description.families.paper_models import QWEN2_5_VL_3B, paper_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "real_shape.py"
TINY = ["--scale", "0.125", "--layers", "2", "--vision-layers", "1", "--image", "84x84", "--threads", "1"]


def _load_script():
    spec = importlib.util.spec_from_file_location("real_shape", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.parametrize(("model", "attention"), [("qwen2.5-vl-3b", "sdpa"), ("internvl3-8b", "eager")])
def test_prints_every_measured_line_at_a_tiny_shape(model: str, attention: str) -> None:
    result = _run("--model", model, "--attn-implementation", attention, "--device", "cpu", "--repeats", "2", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for line in ("readout / forward peak memory:", "masked / plain generate time:", "seconds per masked answer:",
                 "visual tokens:", "largest score difference", "Spearman of head rankings"):
        assert line in out, out
    assert f"attention {attention}" in out
    assert "medians of 2 alternated runs each" in out and "generate times, alternated:" in out
    visual = int(re.search(r"visual tokens: (\d+)", out).group(1))
    # the real processors at 84 x 84: Qwen2.5-VL 3 x 3 merged tokens of 28 px; InternVL3 one 448 px tile (a 4:3
    # image would get 4 x 3 tiles and a thumbnail, 3,328 tokens, at any size)
    assert visual == {"qwen2.5-vl-3b": 9, "internvl3-8b": 256}[model]
    rho = float(re.search(r"Spearman of head rankings (-?[\d.]+|nan)", out).group(1))
    assert rho == rho  # a number (the tiny slice's ranking agrees or not: measured, not asserted)


def test_slice_only_prints_the_bf16_comparison_alone() -> None:
    result = _run("--model", "paligemma2-10b", "--slice-only", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Spearman of head rankings" in result.stdout
    assert "readout / forward peak memory:" not in result.stdout and "masked / plain" not in result.stdout


def test_refuses_what_this_machine_cannot_run_in_one_line() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    result = _run("--device", "cuda", *TINY)
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [
        f"--device cuda: no CUDA device here (torch {torch.__version__}); use --device cpu"]
    result = _run("--attn-implementation", "flash_attention_2", *TINY)
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1
    assert "flash_attention_2" in result.stderr


def test_real_facts_keep_the_real_grid_and_cut_layers() -> None:
    """``--layers`` / ``--vision-layers`` keep the real widths and head grid; the 3B facts give the hub's size."""
    script = _load_script()
    with torch.device("meta"):
        full = AutoModelForImageTextToText.from_config(QWEN2_5_VL_3B.build_config())
        facts = script.real_facts(QWEN2_5_VL_3B, layers=2, vision_layers=1, scale=1.0)
        cut = AutoModelForImageTextToText.from_config(AutoConfig.for_model("qwen2_5_vl", **facts))
    assert round(sum(p.numel() for p in full.parameters()) / 1e9, 2) == 3.75  # the hub page's 3.75B
    assert adapter_for_config(full.config).geometry() == QWEN2_5_VL_3B.geometry
    geometry = adapter_for_config(cut.config).geometry()
    assert (geometry.num_layers, geometry.num_heads, geometry.num_kv_heads, geometry.head_dim) == (2, 16, 2, 128)
    assert cut.config.vision_config.depth == 1 and cut.config.vision_config.fullatt_block_indexes == [0]
    assert QWEN2_5_VL_3B.config["text_config"]["num_hidden_layers"] == 36  # the recorded facts are not changed
    small = script.real_facts(paper_model("InternVL3-8B"), layers=None, vision_layers=None, scale=0.125)
    assert (small["text_config"]["num_attention_heads"], small["text_config"]["hidden_size"]) == (4, 512)
    # PaliGemma's projector follows the scaled language model (it kept 3584 and the forward refused the features)
    pali = script.real_facts(paper_model("PaliGemma2-10B"), layers=2, vision_layers=1, scale=0.0625)
    assert pali["projection_dim"] == pali["vision_config"]["projection_dim"] == pali["text_config"]["hidden_size"]


def test_spearman_is_the_rank_correlation() -> None:
    import numpy as np

    script = _load_script()
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert script.spearman(a, a ** 3) == pytest.approx(1.0)
    assert script.spearman(a, -a) == pytest.approx(-1.0)
    assert script.spearman(np.array([1.0, 2.0, 3.0]), np.array([1.0, 3.0, 2.0])) == pytest.approx(0.5)


# the real processors at 1024 x 768: Qwen2.5-VL / GLM 37 x 27 merged tokens of 28 px, Qwen3-VL 32 x 24 of 32 px,
# InternVL 12 tiles of 448 px and a thumbnail (13 x 256), LLaVA-NeXT a 576-token base view and a 2 x 2 grid of
# 336 px tiles (672 x 672) unpadded to 48 x 36 tokens plus a newline per row, PaliGemma2-448 32 x 32
REAL_VISUAL_TOKENS = {"qwen2.5-vl-3b": 999, "qwen2.5-vl-7b": 999, "qwen3-vl-8b": 768, "internvl3-8b": 3328,
                      "internvl3.5-8b": 3328, "llava-next-llama3-8b": 576 + 48 * 36 + 36, "paligemma2-10b": 1024,
                      "glm-4.6v-flash": 999}


@pytest.mark.parametrize("model", sorted(REAL_VISUAL_TOKENS))
def test_every_model_has_its_real_processor_and_visual_tokens(model: str) -> None:
    """Every ``--model`` has its checkpoint's image processor recorded (the script refuses one without), and it
    gives the real visual-token count for a 1024 x 768 image (processor only: no model is built)."""
    from PIL import Image

    from vrh_interp.core.description.families.registry import TINY_RECIPES

    script = _load_script()
    assert set(script.model_names()) == set(REAL_VISUAL_TOKENS)
    paper = script.model_names()[model]
    processor = script.build_processor(paper, TINY_RECIPES[paper.family])
    if processor.chat_template:
        text = processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "find x"}]}],
            add_generation_prompt=True)
    else:  # PaliGemma: no chat template
        text = "<image>detect x"
    encoded = processor(images=[Image.new("RGB", (1024, 768), "gray")], text=[text], return_tensors="pt")
    image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    assert int((encoded["input_ids"] == image_token).sum()) == REAL_VISUAL_TOKENS[model]


def test_attention_defaults_to_eager_for_gemma2_and_refuses_sdpa_there() -> None:
    """PaliGemma 2's Gemma 2 has no sdpa path in transformers (it refused to build under the old sdpa default)."""
    script = _load_script()
    names = script.model_names()
    assert script.attention_for(names["paligemma2-10b"], None) == "eager"
    assert script.attention_for(names["qwen3-vl-8b"], None) == "sdpa"
    assert script.attention_for(names["qwen3-vl-8b"], "eager") == "eager"
    with pytest.raises(SystemExit, match="no sdpa path"):
        script.attention_for(names["paligemma2-10b"], "sdpa")


def test_rotary_precision_shows_the_half_precision_rotary_error_and_its_fix() -> None:
    """benchmarks/rotary_precision.py at a tiny width: PaliGemma2's 1,024 visual tokens at 1-D positions, so a bf16
    ``inv_freq`` (``model.to``) must put a larger logit error on far keys than ``cast_model``."""
    script = ROOT / "benchmarks" / "rotary_precision.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(script), "--model", "paligemma2-10b", "--scale", "0.125"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = {label: float(value) for label, value in
              re.findall(r"^(model\.to|cast_model)\(bfloat16\): logits .* bf16 logit error std ([\d.]+)", result.stdout,
                         re.M)}
    assert set(errors) == {"model.to", "cast_model"}, result.stdout
    assert errors["model.to"] > 5 * errors["cast_model"], errors
    assert result.stdout.count("Spearman") == 2
