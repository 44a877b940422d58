"""Mean and resample ablation against an independent plain-PyTorch reference (forward pre-hooks on o_proj).

The reference finds visual tokens by the config's image token id, captures o_proj inputs with its own hooks,
sums them per segment with loops and replaces head slices position by position: no adapter, template,
einsum or nnsight. Families: LLaVA-1.5, Qwen2-VL, InternVL, Idefics3 and PaliGemma (bidirectional prefix).
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from tests.conftest import noise_image, tiny_vlm
from tests.reference import reference_segments, replaced_heads, segment_sums
from vrh_interp.core.execution import interventions as iv
from vrh_interp.evaluation.grounding import ablation_values, ground_batch
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.data.checks import as_box
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.core.execution.templates.ablation import (
    ANSWER,
    PAD,
    PROMPT,
    VISUAL,
    Ablation,
    AblationValues,
    segment_ids,
)

FAMILIES = ["llava", "qwen2_vl", "internvl", "idefics3", "paligemma"]
KINDS = ["mean", "resample"]


def _reference_set():
    return synthetic_samples("detect", 4)  # batches of 3 and 1; the two evaluation samples get different donors


def _eval_samples():
    """Two evaluation samples of different prompt lengths (left padding exercised)."""
    first, second = synthetic_samples("eval", 2)
    return [first, dataclasses.replace(second, expression=second.expression + " on the far left side")]


def _heads(vlm) -> HeadSet:
    g = vlm.geometry
    return HeadSet([Head(0, 1), Head(g.num_layers - 1, 0), Head(g.num_layers - 1, g.num_heads - 1)])


def _teacher_forced(vlm, samples):
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    answers = [vlm.adapter.format_box(as_box(s.box), f) for s, f in zip(samples, batch.frames)]
    ids = [vlm.tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    return batch, vlm.teacher_forced(batch, ids)


def _reference_values(vlm, samples, batch_size: int = 3):
    """Per-sample segment sums and counts of ``samples`` by the reference (same batching as the library)."""
    sums, counts = [], []
    for start in range(0, len(samples), batch_size):
        batch, encoding = _teacher_forced(vlm, samples[start: start + batch_size])
        s, c = segment_sums(vlm.hf_model, encoding, reference_segments(vlm.hf_model, encoding, batch.prompt_length))
        sums.append(s)
        counts.append(c)
    return torch.cat(sums), torch.cat(counts)


def _reference_tables(kind, reference_ids, sums, counts, row_ids, layers):
    """``{layer: [rows, 3, width]}`` computed from the reference sums: pooled means, or each row's donor's means
    (crc32 of the row's id into the reference set, skipping the sample itself)."""
    if kind == "mean":
        mean = sums.sum(0) / counts.sum(0)[None, :, None]
        return {layer: mean[layer][None].float() for layer in layers}
    rows = []
    for sample_id in row_ids:
        donor = zlib.crc32(sample_id.encode()) % len(reference_ids)
        if reference_ids[donor] == sample_id:
            donor = (donor + 1) % len(reference_ids)
        rows.append(sums[donor] / counts[donor][None, :, None])
    stacked = torch.stack(rows)
    return {layer: stacked[:, layer].float() for layer in layers}


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request):
    vlm = tiny_vlm(request.param)
    reference = _reference_set()
    values = ablation_values(vlm, reference, batch_size=3)
    return vlm, reference, values, _reference_values(vlm, reference)


def test_segment_ids_follow_mask_visual_positions_and_prompt_length():
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    got = segment_ids(mask, [[3, 4], [0, 1, 2]], prompt_length=6)
    want = torch.tensor([[PAD, PAD, PROMPT, VISUAL, VISUAL, PROMPT, ANSWER, PAD],
                         [VISUAL, VISUAL, VISUAL, PROMPT, PROMPT, PROMPT, ANSWER, ANSWER]])
    assert torch.equal(got, want)
    assert torch.equal(segment_ids(mask[:, :6], [[3, 4], [0, 1, 2]]), want[:, :6])
    with pytest.raises(ValueError, match="outside the prompt"):
        segment_ids(mask, [[6], [0]], prompt_length=6)


def test_library_segments_equal_the_reference_rule(setup):
    vlm, reference, _, _ = setup
    samples = _eval_samples()
    batch, encoding = _teacher_forced(vlm, samples)
    assert torch.equal(iv.batch_segments(batch, encoding),
                       reference_segments(vlm.hf_model, encoding, batch.prompt_length))
    # any prompt encoding (e.g. VQA): segments from the family's visual layout of each row's image
    images = [noise_image(83, 61, seed=1), noise_image(64, 96, seed=2)]
    prompts = [vlm.adapter.grounding_prompt(vlm.processor, e) for e in ("what colour?", "how many shapes are there?")]
    plain = vlm.adapter.encode(vlm.processor, images, prompts)
    want = reference_segments(vlm.hf_model, plain, plain["input_ids"].shape[1])
    assert torch.equal(iv.encoding_segments(vlm, plain, [im.size for im in images]), want)
    assert (want == VISUAL).any() and (want == PROMPT).any()


def test_ablation_values_equal_the_hook_capture(setup):
    vlm, reference, values, (sums, counts) = setup
    assert values.sample_ids == tuple(s.sample_id for s in reference)
    assert torch.equal(values.counts, counts) and (counts > 0).all()
    torch.testing.assert_close(values.sums.double(), sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values.mean().double(), sums.sum(0) / counts.sum(0)[None, :, None], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_teacher_forced_logits_equal_the_hook_reference(setup, kind):
    """Every segment at once: left padding, visual tokens, prompt text, answer tokens and right-padded answers."""
    vlm, reference, values, (sums, counts) = setup
    samples = _eval_samples()
    batch, encoding = _teacher_forced(vlm, samples)
    heads = _heads(vlm)
    ids = [s.sample_id for s in samples]
    assert values.donor(ids[0]) != values.donor(ids[1])
    ablation = iv.head_ablation(vlm, heads, Ablation(kind, values), segments=iv.batch_segments(batch, encoding),
                                sample_ids=ids)
    got = iv.run_forward(vlm, encoding, [ablation]).logits
    tables = _reference_tables(kind, values.sample_ids, sums, counts, ids, heads.by_layer())
    segments = reference_segments(vlm.hf_model, encoding, batch.prompt_length)
    with torch.no_grad(), replaced_heads(vlm.hf_model, heads.by_layer(), tables, segments):
        want = vlm.hf_model(**encoding).logits
    with torch.no_grad():
        plain = vlm.hf_model(**encoding).logits
    assert (got - plain).abs().max() > 1e-4, "the ablation had no effect: the comparison would not catch a no-op"
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # the comparison is sensitive to segment boundaries: one visual token counted as prompt text changes the logits
    shifted = segments.clone()
    first_visual = (segments[0] == VISUAL).nonzero()[0, 0]
    shifted[0, first_visual] = PROMPT
    with torch.no_grad(), replaced_heads(vlm.hf_model, heads.by_layer(), tables, shifted):
        wrong = vlm.hf_model(**encoding).logits
    assert (got - wrong).abs().max() > 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generation_equals_the_hook_reference(setup, kind):
    """Prefill by segment, then every decode step with the answer segment's values."""
    vlm, reference, values, (sums, counts) = setup
    samples = _eval_samples()
    heads = _heads(vlm)
    ids = [s.sample_id for s in samples]
    outcomes = ground_batch(vlm, samples, heads=heads, ablation=Ablation(kind, values), max_new_tokens=5)
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    tables = _reference_tables(kind, values.sample_ids, sums, counts, ids, heads.by_layer())
    segments = reference_segments(vlm.hf_model, batch.encoding, batch.prompt_length)
    with torch.no_grad(), replaced_heads(vlm.hf_model, heads.by_layer(), tables, segments):
        want = vlm.hf_model.generate(**batch.encoding, max_new_tokens=5, do_sample=False)
    assert [o.answer for o in outcomes] == vlm.decode_answers(want, batch.prompt_length)
    got = iv.run_generate(vlm, batch.encoding, [iv.head_ablation(
        vlm, heads, Ablation(kind, values), segments=iv.batch_segments(batch), sample_ids=ids)], max_new_tokens=5)
    assert torch.equal(got.ids, want)


def test_resample_donors_are_other_samples_and_independent_of_batching():
    ids = tuple(f"s{i}" for i in range(7))
    values = AblationValues(ids, torch.arange(7 * 2 * 3 * 4, dtype=torch.float32).view(7, 2, 3, 4) + 1,
                            torch.ones(7, 3, dtype=torch.long))
    donors = {i: values.donor(i) for i in ids}
    assert all(ids[d] != i for i, d in donors.items())
    assert len(set(donors.values())) > 1
    reordered = AblationValues(ids, values.sums, values.counts)
    assert {i: reordered.donor(i) for i in reversed(ids)} == donors
    tables = Ablation("resample", values).tables([1], ["s3", "other"])
    torch.testing.assert_close(tables[1][0], values.sums[donors["s3"], 1])
    with pytest.raises(ValueError, match="at least two reference samples"):
        AblationValues(("a",), torch.zeros(1, 2, 3, 4), torch.ones(1, 3, dtype=torch.long)).donor("a")


def test_values_round_trip_and_fingerprint(tmp_path, setup):
    _, _, values, _ = setup
    loaded = AblationValues.load(values.save(tmp_path / "values.pt"))
    assert loaded.sample_ids == values.sample_ids and torch.equal(loaded.sums, values.sums)
    assert loaded.fingerprint() == values.fingerprint()
    other = AblationValues(values.sample_ids, values.sums + 1e-3, values.counts)
    assert other.fingerprint() != values.fingerprint()
    assert Ablation("mean", values).manifest() == {"kind": "mean", "values": values.fingerprint()}


def test_clear_errors():
    vlm = tiny_vlm("qwen2_vl")
    heads = HeadSet([Head(0, 0)])
    with pytest.raises(ValueError, match="needs reference values"):
        Ablation("mean")
    with pytest.raises(ValueError, match="must be one of"):
        Ablation("gaussian")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes no reference values"):
        Ablation("zero", AblationValues(("a",), torch.zeros(1, 2, 3, 64), torch.ones(1, 3, dtype=torch.long)))
    values = AblationValues(("a", "b"), torch.zeros(2, 2, 3, 64), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="segment by segment"):
        iv.head_ablation(vlm, heads, Ablation("mean", values))
    batch = vlm.encode_grounding([noise_image(40, 40)], ["x"])
    with pytest.raises(ValueError, match="sample_ids"):
        iv.head_ablation(vlm, heads, Ablation("resample", values), segments=iv.batch_segments(batch))
    wrong_grid = AblationValues(("a",), torch.zeros(1, 3, 3, 64), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="compute them on this model"):
        iv.head_ablation(vlm, heads, Ablation("mean", wrong_grid), segments=iv.batch_segments(batch))
    no_answers = AblationValues(("a",), torch.zeros(1, 2, 3, 64), torch.tensor([[3, 4, 0]]))
    with pytest.raises(ValueError, match="no answer tokens"):
        no_answers.mean()


def test_mean_ablation_is_remote_safe():
    """The ``"local"`` round trip (the request serialised as for NDIF) gives the local ids exactly."""
    vlm = tiny_vlm("qwen2_vl")
    values = ablation_values(vlm.on(remote="local"), _reference_set(), batch_size=3)
    assert torch.equal(values.sums, ablation_values(vlm, _reference_set(), batch_size=3).sums)
    samples = _eval_samples()
    heads = _heads(vlm)
    for kind in KINDS:
        local = ground_batch(vlm, samples, heads=heads, ablation=Ablation(kind, values), max_new_tokens=4)
        remote = ground_batch(vlm.on(remote="local"), samples, heads=heads, ablation=Ablation(kind, values),
                              max_new_tokens=4)
        assert local == remote


def test_a_new_ablation_kind_is_one_class(monkeypatch):
    """Issue 32: kinds are objects. One registered class is a working kind: ``Ablation``, ``ablation_for`` and both
    templates use it through its methods (here: twice the pooled mean), with no name switch anywhere."""
    from vrh_interp.core.execution import ablation_kinds
    from vrh_interp.core.description.heads import HeadGeometry
    from vrh_interp.core.execution.templates.ablation import HeadAblation, RowHeadAblation
    from vrh_interp.experiments.conditions import ablation_for

    class DoubleMeanAblation(ablation_kinds.AblationMethod):
        name = "double-mean"

        def replacement(self, values, sample_id=None):
            return 2 * values.mean()

    monkeypatch.setitem(ablation_kinds.ABLATION_METHODS, "double-mean", DoubleMeanAblation())
    geometry = HeadGeometry(num_layers=2, num_heads=2, num_kv_heads=2, head_dim=4)
    values = AblationValues(("a", "b"), torch.randn(2, 2, 3, 8), torch.ones(2, 3, dtype=torch.long))
    ablation = ablation_for("double-mean", values, geometry)
    assert ablation.replaces_by_segment and ablation.manifest()["kind"] == "double-mean"
    segments = torch.tensor([[VISUAL, PROMPT, ANSWER]])
    heads = HeadSet([Head(1, 0)])
    single = HeadAblation.build(heads, geometry, str, ablation, segments=segments)
    expected = (2 * values.mean()[1]).view(3, 2, 4)[:, [0]]
    assert single.kind == "double-mean" and torch.equal(single.tables[1][0], expected)
    rows = RowHeadAblation.build([heads], [ablation], geometry, str, segments=segments)
    assert torch.equal(rows.tables[1][0], expected) and bool(rows.keep_padding[0])
    with pytest.raises(ValueError, match="must be one of"):
        Ablation("triple-mean", values)


def test_kinds_declare_what_they_need():
    from vrh_interp.core.execution.ablation_kinds import ABLATION_KINDS, ABLATION_METHODS, DEFAULT_ABLATION_KIND
    from vrh_interp.core.execution.backends.base import NnsightBackend
    from vrh_interp.core.execution.backends.transformer_lens import TransformerLensBackend

    assert ABLATION_KINDS == ("zero", "mean", "resample") and DEFAULT_ABLATION_KIND == "zero"  # names records keep
    assert [(m.needs_reference_values, m.per_sample) for m in ABLATION_METHODS.values()] == [
        (False, False), (True, False), (True, True)]
    assert NnsightBackend.ablation_kinds == ABLATION_KINDS and TransformerLensBackend.ablation_kinds == ("zero",)
