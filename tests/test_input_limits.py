"""Inputs the model cannot take are refused before any work, naming the limit (issue 34): prompts plus answer
budget longer than the model's context, answer budgets the context cannot hold. Real tiny models of every family
and the shipped toy (512 positions); the prompt lengths are checked against each sample encoded alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_vlm
from vrh_interp.core.description.boxes import Box
from vrh_interp.core.execution.limits import (InputLimitError, check_answer_budget, check_prompts_fit, context_length,
                                              prompt_lengths)
from vrh_interp.core.description.model import wrap
from vrh_interp.core.description.tiny import build_tiny
from vrh_interp.data.datasets.images import LoadedImage
from vrh_interp.data.datasets.samples import GroundingSample
from vrh_interp.data.sources import synthetic_samples

LONG = " ".join(["the small red cup just left of the big blue ball"] * 40)[:1990]


def sample(expression: str, sample_id: str, size: tuple[int, int] = (64, 48)) -> GroundingSample:
    from PIL import Image

    return GroundingSample(sample_id=sample_id, expression=expression, box=Box(1, 1, 9, 9), image_size=size,
                           image_source=LoadedImage(Image.new("RGB", size, "white"), sample_id))


def test_the_context_is_the_text_configs_positions_and_prompt_lengths_are_exact(family: str) -> None:
    vlm = tiny_vlm(family)
    assert context_length(vlm) == vlm.hf_model.config.get_text_config().max_position_embeddings
    samples = [*synthetic_samples("detect", 3), sample("a much longer expression about the cup " * 3, "x", (96, 80))]
    alone = [vlm.encode_grounding([s.image], [s.expression]).prompt_length for s in samples]
    estimated = prompt_lengths(vlm, samples)
    # the largest image: the estimate is exact for it, and never below the truth for the rest
    largest = max(range(4), key=lambda i: samples[i].image_size[0] * samples[i].image_size[1])
    assert estimated[largest] == alone[largest]
    assert all(e >= a for e, a in zip(estimated, alone)), (estimated, alone)


def _shrunk(family: str, positions: int):
    tiny = build_tiny(family, seed=0)
    tiny.model.config.get_text_config().max_position_embeddings = positions
    return wrap(tiny.model, tiny.processor)


@pytest.mark.parametrize("family_name", ["qwen2_vl", "llava", "paligemma", "idefics3"])
def test_a_prompt_and_budget_longer_than_the_context_is_refused_at_the_exact_limit(family_name: str) -> None:
    probe = tiny_vlm(family_name)
    samples = synthetic_samples("detect", 2)
    longest = max(prompt_lengths(probe, samples))
    vlm = _shrunk(family_name, longest + 10)
    check_prompts_fit(vlm, samples, 10)  # prompt + budget == context: fits
    with pytest.raises(InputLimitError, match=rf"do not fit the model's context of {longest + 10} positions .*"
                                              rf"its prompt is {longest} tokens .* \+ max_new_tokens=11"):
        check_prompts_fit(vlm, samples, 11)


@pytest.mark.parametrize("budget, words", [
    (0, "must be a whole number >= 1, got 0"), (True, "got True"), (2.5, "got 2.5"), ("24", "got '24'"),
    (512, "max_new_tokens=512 answer tokens cannot be produced: the model's context is 512 positions"),
    (10_000, "context is 512 positions"),
])
def test_an_answer_budget_the_model_cannot_produce_is_refused(budget: object, words: str) -> None:
    vlm = _shrunk("qwen2_vl", 512)
    with pytest.raises(InputLimitError, match=words.replace("+", r"\+")):
        check_answer_budget(vlm, budget)
    check_answer_budget(vlm, 511)


def test_the_api_refuses_before_any_work(tmp_path: Path) -> None:
    """score_heads and run_conditions check first: no run folder is created, no answer generated."""
    from vrh_interp.experiments.sweep import run_conditions
    from vrh_interp.experiments.conditions import sweep_conditions
    from vrh_interp.core.description.heads import HeadSet
    from vrh_interp.scoring.detect import score_heads

    vlm = _shrunk("qwen2_vl", 120)
    samples = [*synthetic_samples("detect", 1), sample(LONG, "long")]
    with pytest.raises(InputLimitError, match="1 of 2 samples do not fit .* sample 'long'"):
        score_heads(vlm, samples, "vrh", max_new_tokens=4, run_dir=tmp_path / "detect", progress=False)
    conditions = sweep_conditions(HeadSet.parse("L0H0"), vlm.geometry, [0], [0])
    with pytest.raises(InputLimitError, match="sample 'long'"):
        run_conditions(vlm, samples, conditions, max_new_tokens=4, run_dir=tmp_path / "sweep", progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_cli_refuses_an_expression_longer_than_the_toys_context(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's silent-wrong case: an expression under the 2,000-character limit but over the toy's 512
    positions ran and printed scores from a garbage answer."""
    import json

    from PIL import Image

    from tests.test_cli_hostile import assert_one_clear_error, run_main

    Image.new("RGB", (64, 64)).save(tmp_path / "a.png")
    rows = [{"id": "short", "image": "a.png", "expression": "the cup", "box": [1, 1, 9, 9]},
            {"id": "long", "image": "a.png", "expression": LONG, "box": [1, 1, 9, 9]}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, err = run_main(["detect", "--model", "toy:a", "--data", f"jsonl:{tmp_path / 'd.jsonl'}", "--out",
                          str(tmp_path / "run")], capsys, limit_s=120)
    assert_one_clear_error(code, err, "1 of 2 samples do not fit the model's context of 512 positions",
                           "sample 'long'")
    assert not (tmp_path / "run").exists()
