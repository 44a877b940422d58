"""Head scoring against brute force from eager attention maps, presets on hand-built statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.conftest import tiny_vlm
from tests.reference import eager_attention_maps
from vrh_interp.data import grounding_samples
from vrh_interp.core.description.heads import Head, HeadGeometry
from vrh_interp.data.checks import as_box
from vrh_interp.scoring.aggregate import aggregate
from vrh_interp.scoring.collect import SampleStats, collect_batch, negative_spatial_entropy
from vrh_interp.scoring.design import PRESETS, ScoringDesign, design_space_variants
from vrh_interp.scoring.detect import scores_from_stats
from vrh_interp.experiments.conditions import sweep_conditions
from vrh_interp.evaluation.controls import random_control

SCORING_FAMILIES = ("qwen2_vl", "llava", "gemma3", "idefics3")


def _samples(n: int = 3):
    return [grounding_samples("detect", i)[0] for i in range(n)]


@pytest.mark.parametrize("family", SCORING_FAMILIES)
def test_collected_statistics_equal_brute_force_from_eager_maps(family):
    vlm = tiny_vlm(family)
    samples = _samples(2)
    stats = collect_batch(vlm, samples, max_new_tokens=4)
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    from vrh_interp.core.execution import interventions as iv

    ids = iv.run_generate(vlm, batch.encoding, [], max_new_tokens=4).ids
    full = dict(batch.encoding)
    new = ids.shape[1] - batch.prompt_length
    full["input_ids"] = ids
    full["attention_mask"] = torch.cat([batch.encoding["attention_mask"],
                                        torch.ones(len(samples), new, dtype=torch.long)], 1)
    if "mm_token_type_ids" in full:
        full["mm_token_type_ids"] = torch.cat(
            [batch.encoding["mm_token_type_ids"], torch.zeros(len(samples), new, dtype=torch.long)], 1)
    maps = torch.stack(eager_attention_maps(vlm.hf_model, full))  # [L, b, H, S, S]
    for i, (sample, st) in enumerate(zip(samples, stats)):
        layout = batch.layouts[i]
        region = layout.positions_for_box(as_box(sample.box))
        visual = list(layout.visual_positions)
        assert st.region_tokens == len(region) > 0
        for t in range(len(st.output_rows)):
            row = maps[:, i, :, batch.prompt_length - 1 + t]  # [L, H, S]
            np.testing.assert_allclose(st.output_rows[t, ..., 0], row[..., region].sum(-1).numpy(), atol=1e-5)
            np.testing.assert_allclose(st.output_rows[t, ..., 1], row[..., visual].sum(-1).numpy(), atol=1e-5)
            hit = np.isin(row.argmax(-1).numpy(), region).astype(float)
            np.testing.assert_array_equal(st.output_rows[t, ..., 2], hit)
        start = max(visual) + 1
        for j, pos in enumerate(range(start, batch.prompt_length)):
            row = maps[:, i, :, pos]
            np.testing.assert_allclose(st.input_rows[j, ..., 0], row[..., region].sum(-1).numpy(), atol=1e-5)
        assert len(st.input_rows) == batch.prompt_length - start


def _stats(sample_id: str, out: np.ndarray, inp: np.ndarray | None = None, iou: float = 1.0,
           entropy: np.ndarray | None = None) -> SampleStats:
    L, H = out.shape[1:3]
    return SampleStats(sample_id, out, inp if inp is not None else out[:1], entropy if entropy is not None else
                       np.zeros((L, H)), region_tokens=3, answer="", iou=iou, parsed=True)


def _rows(values: list[list[list[tuple[float, float, float]]]]) -> np.ndarray:
    return np.asarray(values, dtype=float)  # [n, L, H, 3]


def test_key_and_sample_aggregations_on_hand_built_statistics():
    # 1 layer x 2 heads; rows: (region mass, visual mass, argmax-in-region)
    a = _stats("a", _rows([[[(0.6, 0.8, 1), (0.1, 0.9, 0)]], [[(0.2, 0.4, 0), (0.3, 0.3, 1)]]]))
    b = _stats("b", _rows([[[(0.0, 0.5, 0), (0.5, 0.5, 1)]]]))
    s = aggregate([a, b], ScoringDesign("output", "sum", "mean")).scores
    np.testing.assert_allclose(s, [[((0.6 + 0.2) / 2 + 0.0) / 2, ((0.1 + 0.3) / 2 + 0.5) / 2]])
    s = aggregate([a, b], ScoringDesign("output", "argmax", "mean")).scores
    np.testing.assert_allclose(s, [[(0.5 + 0) / 2, (0.5 + 1) / 2]])
    s = aggregate([a, b], ScoringDesign("output", "ratio", "mean")).scores
    np.testing.assert_allclose(s, [[((0.75 + 0.5) / 2 + 0) / 2, ((0.1 / 0.9 + 1) / 2 + 1) / 2]])
    s = aggregate([a, b], ScoringDesign("first_output", "sum", "mean")).scores
    np.testing.assert_allclose(s, [[0.3, 0.3]])
    # freq: per-sample top-1 -> a picks head 0 (0.4 vs 0.2), b picks head 1
    s = aggregate([a, b], ScoringDesign("output", "sum", "freq", freq_top_k=1)).scores
    np.testing.assert_allclose(s, [[0.5, 0.5]])
    per_position = aggregate([a, b], ScoringDesign("output", "sum", "mean"))
    np.testing.assert_allclose(per_position.per_position[0], [[0.3, 0.3]])
    np.testing.assert_allclose(per_position.per_position[1], [[0.2, 0.3]])
    assert list(per_position.position_counts) == [2, 1]


def test_presets_apply_their_definitions():
    right = _stats("right", _rows([[[(0.9, 0.9, 1), (0.0, 0.1, 0)]]]), iou=0.9)
    wrong = _stats("wrong", _rows([[[(0.0, 0.1, 0), (0.9, 0.9, 1)]]]), iou=0.1)
    # retrieval heads count only correctly answered samples
    np.testing.assert_allclose(aggregate([right, wrong], PRESETS["retrieval_heads"].design).scores, [[1.0, 0.0]])
    # OCR heads: the rows OF the gold tokens (answer token n's row is output row n + 1, the last one the row after
    # the answer), argmax over the prompt keys (column 3), times the graded correctness, pooled over entries; a head
    # with <= 10 % zero entries scores 0
    rows = np.zeros((4, 1, 3, 4))
    rows[[1, 3], 0, 0, 3] = 1  # head 0 hits at the rows OF tokens 0 and 2
    rows[[0, 2], 0, 1, 3] = 1  # head 1 hits at the rows PREDICTING tokens 0 and 2 (not read)
    rows[[1, 3], 0, 2, 3] = 1  # head 2 hits at every gold token's row (below)
    after = np.zeros((1, 1, 3, 4)); after[0, 0, 2, 3] = 1  # the row OF token 3 (it predicts the end)
    ocr = SampleStats("o", rows, rows[:1], np.zeros((1, 3)), 3, "", 1.0, True, next_row=after,
                      gold_tokens=np.array([True, False, True, True]), grade=0.5)
    # entries (tokens 0, 2, 3): head 0 (1, 1, 0) * 0.5; head 1 zeros; head 2 (1, 1, 1) * 0.5 but no zero entry
    np.testing.assert_allclose(aggregate([ocr], PRESETS["ocr_heads"].design).scores, [[1 / 3, 0.0, 0.0]])
    # VERA: ratio of region to visual mass at the first answer row
    np.testing.assert_allclose(aggregate([right], PRESETS["vera"].design).scores, [[1.0, 0.0]])
    # QRHead: input rows
    inp = _rows([[[(0.2, 0.5, 0), (0.4, 0.5, 1)]]])
    q = _stats("q", _rows([[[(0.9, 0.9, 1), (0.0, 0.1, 0)]]]), inp=inp)
    np.testing.assert_allclose(aggregate([q], PRESETS["qrhead"].design).scores, [[0.2, 0.4]])
    # localization heads: frequency of the box-free entropy score in the per-sample top-k
    ent = _stats("e", _rows([[[(0, 0, 0), (0, 0, 0)]]]), entropy=np.array([[-0.1, -2.0]]))
    ent.image_mass, ent.neg_entropy_mass = np.array([[0.5, 0.5]]), np.array([[-3.0, -0.2]])
    loc = aggregate([ent], PRESETS["localization_heads_paper"].design)
    np.testing.assert_allclose(loc.scores, [[1.0, 1.0]])  # top-10 of 2 heads: both
    one = ScoringDesign("last_input", "entropy", "freq", freq_top_k=1)
    np.testing.assert_allclose(aggregate([ent], one).scores, [[1.0, 0.0]])
    released = ScoringDesign("last_input", "entropy_mass", "freq", freq_top_k=1, elbow="per_sample")
    np.testing.assert_allclose(aggregate([ent], released).scores, [[0.0, 1.0]])  # the mass-weighted entropy
    assert len(design_space_variants()) == 8


def test_spatial_entropy_counts_components():
    one_blob = np.zeros((4, 4)); one_blob[1:3, 1:3] = 1
    two_blobs = np.zeros((4, 4)); two_blobs[0, 0] = 1; two_blobs[3, 3] = 1
    diagonal = np.zeros((3, 3)); diagonal[0, 0] = diagonal[1, 1] = 1  # 8-connected: one component
    assert negative_spatial_entropy(one_blob) == 0.0
    assert negative_spatial_entropy(two_blobs) == pytest.approx(-math.log(2))
    assert negative_spatial_entropy(diagonal) == 0.0


def test_empty_region_samples_are_counted_not_divided_by_zero():
    good = _stats("g", _rows([[[(0.5, 0.5, 1), (0.0, 0.5, 0)]]]))
    empty = _stats("e", _rows([[[(0.0, 0.0, 0), (0.0, 0.0, 0)]]]))
    empty.region_tokens = 0
    result = aggregate([good, empty], ScoringDesign())
    assert result.skipped["no_region_tokens"] == 1 and result.used_ids == ["g"]
    with pytest.raises(ValueError, match="no sample could be scored"):
        aggregate([empty], ScoringDesign())


def test_scores_object_ranking_top_json_roundtrip(tmp_path):
    a = _stats("a", _rows([[[(0.6, 0.8, 1), (0.1, 0.9, 0)], [(0.7, 0.8, 1), (0.1, 0.9, 0)]]]))
    scores = scores_from_stats([a], "vrh", provenance={"model_id": "m"})
    assert scores.ranking().to_list() == ["L1H0", "L0H0", "L0H1", "L1H1"]  # tie L0H1/L1H1 by order
    assert scores.top(2).to_list() == ["L1H0", "L0H0"]
    with pytest.raises(ValueError, match="out of range"):
        scores.top(5)
    frame = scores.to_frame()
    assert list(frame["head"][:2]) == ["L1H0", "L0H0"] and frame["score"].iloc[0] == pytest.approx(0.7)
    loaded = type(scores).load(scores.save(tmp_path / "s.json"))
    np.testing.assert_array_equal(loaded.scores, scores.scores)
    assert loaded.ranking() == scores.ranking() and loaded.provenance["model_id"] == "m"


def test_random_control_excludes_detected_and_is_seeded():
    g = HeadGeometry(4, 8, 2, 16)
    detected = g.all_heads()[:10]
    a = random_control(g, detected, 6, seed=3)
    assert not set(a) & set(detected)
    assert a == random_control(g, detected, 6, seed=3)
    assert a != random_control(g, detected, 6, seed=4)
    assert all(h.layer > 0 for h in random_control(g, detected, 20, seed=0, exclude_first_layer=True))
    with pytest.raises(ValueError, match="only 22 heads"):
        random_control(g, detected, 23, seed=0)
    conditions = sweep_conditions(g.all_heads(), g, [0, 1, 3], [0, 1], matched=False)
    assert [c.key for c in conditions] == ["baseline:k=0", "top:k=1", "random:k=1:seed=0", "random:k=1:seed=1",
                                           "top:k=3", "random:k=3:seed=0", "random:k=3:seed=1"]
    assert set(conditions[2].heads) <= set(conditions[5].heads)  # nested for one seed
    with pytest.raises(ValueError, match="out of range"):
        sweep_conditions(g.all_heads(), g, [0, 33], [0])
    assert Head(0, 0) in conditions[1].heads


@pytest.mark.parametrize("family", ("llava", "qwen2_vl"))
def test_teacher_forced_statistics_equal_brute_force(family):
    vlm = tiny_vlm(family)
    samples = _samples(2)
    stats = collect_batch(vlm, samples, max_new_tokens=4, output_source="teacher_forced")
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    for i, (sample, st) in enumerate(zip(samples, stats)):
        answer = vlm.adapter.format_box(as_box(sample.box), batch.frames[i])
        assert st.answer == answer
        answer_ids = vlm.tokenizer(answer, add_special_tokens=False, return_tensors="pt")["input_ids"]
        # one sample at a time, unpadded: prompt + answer in one forward
        single = vlm.encode_grounding([sample.image], [sample.expression])
        enc = dict(single.encoding)
        enc["input_ids"] = torch.cat([enc["input_ids"], answer_ids], 1)
        enc["attention_mask"] = torch.ones_like(enc["input_ids"])
        if "mm_token_type_ids" in enc:
            enc["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(answer_ids)], 1)
        maps = torch.stack(eager_attention_maps(vlm.hf_model, enc))[:, 0]
        region = single.layouts[0].positions_for_box(as_box(sample.box))
        s = single.prompt_length
        assert len(st.output_rows) == answer_ids.shape[1]
        for t in range(answer_ids.shape[1]):
            want = maps[:, :, s - 1 + t][..., region].sum(-1).numpy()
            np.testing.assert_allclose(st.output_rows[t, ..., 0], want, atol=1e-5)


@pytest.mark.parametrize("design", ["vrh", ScoringDesign("output", "sum", "mean", output_source="teacher_forced")],
                         ids=["greedy", "teacher_forced"])
def test_score_heads_through_the_serialised_remote_path_equals_the_local_run(design, tmp_path):
    """A ``vlm.on(remote="local")`` handle serialises each batch's request exactly as for NDIF, then runs it
    in-process."""
    from vrh_interp.scoring.detect import load_stats, score_heads

    vlm = tiny_vlm("llava")
    samples = _samples(3)
    local = score_heads(vlm, samples, design, batch_size=2, max_new_tokens=4, progress=False)
    remote = score_heads(vlm.on(remote="local"), samples, design, batch_size=2, max_new_tokens=4, progress=False,
                         run_dir=tmp_path / "run")
    assert np.ptp(local.scores) > 0, "scores must not be trivially constant"
    np.testing.assert_array_equal(remote.scores, local.scores)
    np.testing.assert_array_equal(remote.per_position, local.per_position)
    assert remote.sample_ids == local.sample_ids
    assert (local.provenance["remote"], remote.provenance["remote"]) == (False, "local")
    assert "remote" not in (tmp_path / "run" / "manifest.json").read_text(encoding="utf-8")
    # the stored statistics equal a local collection of the same batches
    stored = load_stats(tmp_path / "run")
    expected = [s for start in (0, 2) for s in collect_batch(vlm, samples[start:start + 2], max_new_tokens=4,
                                                             output_source=remote.design.output_source)]
    for got, want in zip(stored, expected):
        np.testing.assert_array_equal(got.output_rows, want.output_rows)
        np.testing.assert_array_equal(got.input_rows, want.input_rows)
        assert (got.answer, got.iou) == (want.answer, want.iou)
