"""vqa_sweep on the tiny Qwen2-VL fixture: conditions, records, Table 3 layout, resume; the VQA prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_vlm
from tests.datasets import fixtures
from vrh_interp.experiments import vqa_sweep as vqa_sweep_module
from vrh_interp.data.datasets.countbench import load_countbench
from vrh_interp.data.datasets.cvbench import load_cvbench
from vrh_interp.data.datasets.images import ImageFile
from vrh_interp.data.datasets.samples import VQASample
from vrh_interp.data.datasets.vqa_prompt import vqa_prompt, vqa_user_text
from vrh_interp.experiments.vqa_sweep import vqa_conditions, vqa_sweep
from vrh_interp.core.description.heads import Head, HeadSet


def test_vqa_prompt_uses_the_chat_template_and_letters_the_choices(tmp_path: Path) -> None:
    item = VQASample(sample_id="x", benchmark="vaw", question="Which color does the cup have?", answer="B",
                     scorer="letter", image_source=ImageFile(tmp_path / "x.png", "x"), choices=("blue", "red"),
                     instruction="Answer with the option's letter from the given choices directly.")
    assert vqa_user_text(item) == ("Which color does the cup have?\nA. blue\nB. red\n"
                                   "Answer with the option's letter from the given choices directly.")
    prompt = vqa_prompt(tiny_vlm("qwen2_vl"), item)
    assert prompt.startswith("<|im_start|>system") and "<|vision_start|><|image_pad|><|vision_end|>" in prompt
    assert prompt.endswith("directly.<|im_end|>\n<|im_start|>assistant\n")


def test_random_controls_avoid_the_masked_heads() -> None:
    geometry = tiny_vlm("qwen2_vl").geometry
    heads = HeadSet([Head(1, 2), Head(0, 1)])
    conditions = vqa_conditions(geometry, heads, (0, 1, 2), detected=HeadSet([Head(0, 0)]))
    assert [c.key for c in conditions] == ["baseline:k=0", "top:k=2", "random:k=2:seed=0", "random:k=2:seed=1",
                                           "random:k=2:seed=2", "matched:k=2:seed=0", "matched:k=2:seed=1",
                                           "matched:k=2:seed=2"]
    for condition in conditions[2:]:
        assert len(condition.heads) == 2 and not set(condition.heads) & {Head(1, 2), Head(0, 1), Head(0, 0)}
    for condition in conditions[5:]:  # layer-matched: one head in each layer, as the masked set has
        assert sorted(h.layer for h in condition.heads) == [0, 1]
    assert len(vqa_conditions(geometry, heads, (0,), matched=False)) == 3
    with pytest.raises(ValueError, match="layer 0 .*matched=False"):  # 4 heads a layer: 3 masked leave 1 outside
        vqa_conditions(geometry, HeadSet([Head(0, 0), Head(0, 1), Head(0, 2)]), (0,))


def test_vqa_sweep_table_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixtures.write_cvbench(tmp_path / "cv", [{"idx": i, "choices": ["2", "3"], "answer": "(A)"} for i in range(3)])
    fixtures.write_countbench(tmp_path / "count", [2, 3])
    samples = [*load_cvbench(tmp_path / "cv"), *load_countbench(tmp_path / "count")]
    vlm = tiny_vlm("qwen2_vl")
    heads = HeadSet([Head(1, 0), Head(0, 3)])
    result = vqa_sweep(vlm, samples, heads, random_seeds=(0, 1), batch_size=2, run_dir=tmp_path / "run",
                       progress=False)
    records = result.records
    assert len(records) == 6 * 5 and result.benchmarks == ["cvbench", "countbench"]
    assert records.groupby("condition").size().to_dict() == {
        "baseline:k=0": 5, "random:k=2:seed=0": 5, "random:k=2:seed=1": 5, "matched:k=2:seed=0": 5,
        "matched:k=2:seed=1": 5, "top:k=2": 5}
    summary = result.summary()
    assert len(summary) == 2 * (6 + 2)  # per benchmark: 6 conditions + one distribution row per control kind
    cv_top = summary[(summary["benchmark"] == "cvbench") & (summary["condition"] == "top")].iloc[0]
    expected = records[(records["benchmark"] == "cvbench") & (records["kind"] == "top")]["correct"].mean()
    assert cv_top["n"] == 3 and cv_top["accuracy"] == pytest.approx(expected)
    assert cv_top["k_fraction"] == 2 / 8
    cv_sets = [records[(records["benchmark"] == "cvbench") & (records["condition"] == f"matched:k=2:seed={s}")]
               ["correct"].mean() for s in (0, 1)]
    assert cv_top["p_vs_matched"] == pytest.approx((1 + sum(a <= expected for a in cv_sets)) / 3)
    table = result.table()
    assert list(table.index) == ["Baseline (k=0)", "Random (k=2)", "Layer-matched (k=2)", "VRH (k=2)"]
    assert list(table.columns.get_level_values(0).unique()) == ["cvbench", "countbench"]
    assert table.loc["VRH (k=2)", ("cvbench", "accuracy")] == pytest.approx(100 * expected)
    pooled = records[(records["benchmark"] == "countbench") & (records["kind"] == "random")]["correct"].mean()
    assert table.loc["Random (k=2)", ("countbench", "accuracy")] == pytest.approx(100 * pooled)
    assert table.loc["Baseline (k=0)", ("countbench", "delta")] == 0

    def no_generation(*args: object, **kwargs: object) -> list[str]:
        raise AssertionError("a resumed sweep must not generate again")

    monkeypatch.setattr(vqa_sweep_module, "answer_conditions", no_generation)
    resumed = vqa_sweep(vlm, samples, heads, random_seeds=(0, 1), batch_size=2, run_dir=tmp_path / "run",
                        progress=False)
    assert resumed.records.sort_values(["condition", "sample_id"]).reset_index(drop=True).equals(
        records.sort_values(["condition", "sample_id"]).reset_index(drop=True))
    with pytest.raises(AssertionError, match="must not generate"):  # the guard fires on work left to do
        vqa_sweep(vlm, samples, heads, random_seeds=(0, 1), batch_size=2, run_dir=tmp_path / "fresh", progress=False)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
@pytest.mark.parametrize("kind", ["mean", "resample"])
def test_vqa_mean_and_resample_ablation_equal_the_hook_reference(family: str, kind: str) -> None:
    """VQA answers with heads mean / resample ablated equal greedy generation under the plain-hook reference
    (visual tokens found by the image token id, slices replaced position by position; tests/reference.py);
    the sweep keys its masked conditions by kind and refuses mean / resample without reference values."""
    import torch

    from tests.reference import reference_segments, replaced_heads
    from tests.test_ablation_kinds import _reference_tables, _reference_values
    from vrh_interp.data.datasets.synthetic_vqa import synthetic_vqa
    from vrh_interp.experiments.vqa_sweep import answer_batch
    from vrh_interp.evaluation.grounding import ablation_values
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.core.execution.templates.ablation import Ablation

    vlm = tiny_vlm(family)
    reference = synthetic_samples("detect", 4)
    values = ablation_values(vlm, reference, batch_size=3)
    samples = synthetic_vqa("eval", 2)[:3]
    heads = HeadSet([Head(0, 1), Head(vlm.geometry.num_layers - 1, 0)])
    got = answer_batch(vlm, samples, heads, max_new_tokens=4, ablation=Ablation(kind, values))
    sums, counts = _reference_values(vlm, reference)
    tables = _reference_tables(kind, values.sample_ids, sums, counts, [s.sample_id for s in samples],
                               heads.by_layer())
    encoding = vlm.adapter.encode(vlm.processor, [s.image for s in samples],
                                  [vqa_prompt(vlm, s) for s in samples]).to(vlm.device)
    length = int(encoding["input_ids"].shape[1])
    with torch.no_grad(), replaced_heads(vlm.hf_model, heads.by_layer(), tables,
                                         reference_segments(vlm.hf_model, encoding, length)):
        want = vlm.hf_model.generate(**encoding, max_new_tokens=4, do_sample=False)
    assert got == vlm.decode_answers(want, length)
    assert got != answer_batch(vlm, samples, HeadSet(), max_new_tokens=4) or kind == "resample"
    result = vqa_sweep(vlm, samples, heads, random_seeds=(0,), matched=False, progress=False, ablation=kind,
                       ablation_values=values)
    assert [c.key for c in result.conditions] == ["baseline:k=0", f"top:k=2:ablation={kind}",
                                                  f"random:k=2:seed=0:ablation={kind}"]
    with pytest.raises(ValueError, match=f"{kind} ablation needs reference outputs"):
        vqa_sweep(vlm, samples, heads, random_seeds=(0,), progress=False, ablation=kind)
