"""Layer sharing (``core.execution.layer_sharing``): a condition's layers below its first masked layer come from the
unmasked rows while its tokens equal theirs. Checked against the plain-PyTorch reference
(``tests.reference.zeroed_heads``: one plain HF ``generate`` per condition, heads zeroed by hooks, nothing shared) on
real models: the trained toy C (8 layers; its conditions include ones whose answers leave the baseline's on every row,
on one row only, and not at all, so tied, untied and mixed rows all occur) and toy A, and tiny LLaVA. A mutant that
takes one layer too many from the unmasked rows (first masked layer off by one) is caught by the same comparison. Where
the path does not apply it returns None and ``generate_conditions`` takes its usual path.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_vlm
from tests.reference import zeroed_heads
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.execution import layer_sharing as ls
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.execution.templates.ablation import Ablation
from vrh_interp.data import grounding_samples
from vrh_interp.evaluation.grounding import ablation_values, encode_samples
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.specs import load_spec

TOKENS = 12


def _scene_items(scenes: int) -> list:
    """Every referent of the first ``scenes`` evaluation scenes: several expressions per image (a shared prefix)."""
    return [s for index in range(scenes) for s in grounding_samples("eval", index, 1)]


def _scene(sample) -> str:
    return "-".join(sample.sample_id.split("-")[:2])  # eval-<scene>-L<level>-o<object>


def _layer(vlm, layer: int) -> HeadSet:
    return HeadSet([Head(layer, h) for h in range(vlm.geometry.num_heads)])


def _toy_c_conditions(vlm) -> list[HeadSet]:
    """Out of first-layer order on purpose. On toy C, zeroing all of layer 0 changes every answer, all of layer 1
    three answers of 8, layer 7 none (checked in ``test_toy_c_conditions_cover_tied_and_untied_rows``)."""
    return [_layer(vlm, 0), HeadSet(), _layer(vlm, 7), HeadSet([Head(6, 3), Head(2, 5)]), HeadSet([Head(0, 0)]),
            _layer(vlm, 1), HeadSet([Head(6, h) for h in range(16)] + [Head(5, 2)])]


def _reference(vlm, encoding, heads: HeadSet) -> torch.Tensor:
    with torch.no_grad(), zeroed_heads(vlm.hf_model, heads.by_layer()):
        return vlm.hf_model.generate(**encoding, max_new_tokens=TOKENS, do_sample=False)


def _same(vlm, ours: torch.Tensor, reference: torch.Tensor) -> bool:
    width = min(ours.shape[1], reference.shape[1])  # a pass runs until its last row stopped: pads may differ
    pad = vlm.processor.tokenizer.pad_token_id
    return (torch.equal(ours[:, :width], reference[:, :width]) and bool((ours[:, width:] == pad).all())
            and bool((reference[:, width:] == pad).all()))


def _shared(vlm, encoding, conditions: list[HeadSet]) -> list[torch.Tensor] | None:
    prefix = iv.shared_image_prefix(vlm, encoding)
    assert prefix is not None and len(prefix.first) < encoding["input_ids"].shape[0]
    return ls.generate_layer_shared(vlm, encoding, [(h, Ablation()) for h in conditions], prefix,
                                    max_new_tokens=TOKENS)


def _differing(vlm, samples, conditions: list[HeadSet]) -> list[int]:
    """The conditions whose ids differ from the reference's (the path must be taken and share something)."""
    encoding = dict(encode_samples(vlm, samples).encoding)
    ours = _shared(vlm, encoding, conditions)
    assert ours is not None, "the layer-sharing path was not taken"
    stats = ls.LAST_STATS
    assert 0 < stats.computed < stats.total  # something was shared
    assert len(ours) == len(conditions)
    return [c for c, (heads, ids) in enumerate(zip(conditions, ours))
            if not _same(vlm, ids, _reference(vlm, encoding, heads))]


def _check(vlm, samples, conditions: list[HeadSet]) -> None:
    assert _differing(vlm, samples, conditions) == []


@pytest.fixture(scope="module")
def toy_c():
    return load_spec("toy:c")


def test_toy_c_conditions_cover_tied_and_untied_rows(toy_c):
    """The test's premise: its conditions move the answers on all rows, on some, and on none."""
    encoding = dict(encode_samples(toy_c, _scene_items(2)).encoding)
    base = _reference(toy_c, encoding, HeadSet())
    moved = []
    for heads in (_layer(toy_c, 0), _layer(toy_c, 1), _layer(toy_c, 7)):
        out = _reference(toy_c, encoding, heads)
        width = min(out.shape[1], base.shape[1])
        moved.append(int((out[:, :width] != base[:, :width]).any(dim=1).sum()))
    assert moved[0] == len(base) and 0 < moved[1] < len(base) and moved[2] == 0, moved


def test_toy_c_equals_the_reference(toy_c):
    _check(toy_c, _scene_items(2), _toy_c_conditions(toy_c))


def test_toy_c_without_an_unmasked_condition(toy_c):
    """No baseline among the conditions: an unmasked run is added to share from (not returned)."""
    _check(toy_c, _scene_items(2), [_layer(toy_c, 7), _layer(toy_c, 6), HeadSet([Head(5, 1)])])


def test_a_wrong_layer_offset_is_caught(toy_c, monkeypatch):
    """Mutant: every condition's first masked layer one too high, so its rows skip their real first masked
    layer (they take the unmasked rows' keys, values and hidden state there). The reference comparison fails."""
    original = ls._Runner.__init__

    def shifted(self, vlm, conditions):
        original(self, vlm, conditions)
        self.first = [f + 1 if f < self.n_layers else f for f in self.first]

    monkeypatch.setattr(ls._Runner, "__init__", shifted)
    assert _differing(toy_c, _scene_items(2), [HeadSet(), _layer(toy_c, 4)]) == [1]


def test_uncopied_keys_are_caught(toy_c, monkeypatch):
    """Mutant: rows below their first masked layer do not take the unmasked rows' keys and values. Caught."""
    monkeypatch.setattr(ls._RowCache, "copy_rows", lambda self, layer, first_row, sources: None)
    assert _differing(toy_c, _scene_items(2), _toy_c_conditions(toy_c))


def test_through_generate_conditions(toy_c):
    """The library's entry point takes the path by default and answers as without it."""
    samples = _scene_items(2)
    encoding = dict(encode_samples(toy_c, samples).encoding)
    conditions = [(h, Ablation()) for h in _toy_c_conditions(toy_c)]
    ls.LAST_STATS = ls.SharingStats()
    shared = iv.generate_conditions(toy_c, encoding, conditions, max_new_tokens=TOKENS)
    assert ls.LAST_STATS.total > 0
    ls.ENABLED = False
    try:
        ls.LAST_STATS = ls.SharingStats()
        plain = iv.generate_conditions(toy_c, encoding, conditions, max_new_tokens=TOKENS)
        assert ls.LAST_STATS.total == 0
    finally:
        ls.ENABLED = True
    assert all(_same(toy_c, a, b) for a, b in zip(shared, plain))


def test_toy_a_and_tiny_llava_equal_the_reference():
    vlm = load_spec("toy:a")
    last = vlm.geometry.num_layers - 1
    _check(vlm, _scene_items(2), [HeadSet(), _layer(vlm, last), HeadSet([Head(1, 2), Head(last, 0)]),
                                  HeadSet([Head(0, 1)])])
    tiny = tiny_vlm("llava")
    _check(tiny, _scene_items(2), [HeadSet(), HeadSet([Head(1, 0), Head(1, 3)]), HeadSet([Head(0, 2)])])


def test_where_it_does_not_apply(toy_c):
    samples = _scene_items(2)
    encoding = dict(encode_samples(toy_c, samples).encoding)
    prefix = iv.shared_image_prefix(toy_c, encoding)
    late = _layer(toy_c, 6)
    mean = Ablation("mean", ablation_values(toy_c, synthetic_samples("detect", 2), batch_size=2))
    assert ls.generate_layer_shared(toy_c, encoding, [(HeadSet(), Ablation()), (late, mean)], prefix,
                                    max_new_tokens=2) is None  # mean ablation
    assert ls.generate_layer_shared(toy_c, encoding, [(HeadSet(), Ablation()), (late, Ablation())], prefix,
                                    max_new_tokens=2, repetition_penalty=1.3) is None  # other decoding
    assert ls.generate_layer_shared(toy_c, encoding, [(HeadSet(), Ablation()), (_layer(toy_c, 0), Ablation())],
                                    prefix, max_new_tokens=2) is None  # masks from layer 0: nothing to share
    assert ls.generate_layer_shared(toy_c, encoding, [(HeadSet([Head(3, 0)]), Ablation())], prefix,
                                    max_new_tokens=2) is None  # an added unmasked run would cost more
    for family in ("internvl", "llava_next", "qwen2_vl"):
        assert not ls.supported(tiny_vlm(family))
    assert not ls.supported(load_spec("toy:b"))  # InternVL


def test_a_big_batch_is_cut_into_whole_images_and_answers_as_the_reference(toy_c, monkeypatch):
    """``run_conditions`` with a batch too big for all its conditions in one pass: where layer sharing applies
    the batch is cut into whole images (``_GroundingPasses.split``), so every pass holds many conditions, its
    unmasked rows among them, and its answers equal one plain ``generate`` per condition with hooks. Where the
    backend does not share layers (switched off), the batch is not cut."""
    from vrh_interp.experiments import sweep as sw
    from vrh_interp.experiments.conditions import Condition

    samples = _scene_items(3)
    heads = [HeadSet(), _layer(toy_c, 7), HeadSet([Head(6, 3), Head(2, 5)]), HeadSet([Head(5, 1)]),
             HeadSet([Head(4, 2), Head(4, 0)]), HeadSet([Head(3, 9)])]
    conditions = [Condition("baseline", 0, None, heads[0])] + [Condition("top", len(h), i, h)
                                                             for i, h in enumerate(heads[1:])]
    passes: list[tuple[int, int, int]] = []
    answer = sw._GroundingPasses.answer

    def logged(self, batch, conds):
        passes.append((len(batch), len({_scene(s) for s in batch}), len(conds)))
        return answer(self, batch, conds)

    monkeypatch.setattr(sw._GroundingPasses, "answer", logged)
    largest = max(sum(_scene(s) == _scene(t) for t in samples) for s in samples)
    rows = largest * len(heads)  # room for one scene's referents under every condition, not for two scenes
    result = sw.run_conditions(toy_c, samples, conditions, batch_size=len(samples), max_new_tokens=TOKENS,
                               max_batch_rows=rows, progress=False)
    images = len({_scene(s) for s in samples})
    assert images == 3 and largest < len(samples) / 2
    assert all(p[2] == len(heads) and p[0] * p[2] <= rows for p in passes), passes  # all conditions, every pass
    assert sum(p[1] for p in passes) == images  # whole images: each image's referents in one pass
    encoding = dict(encode_samples(toy_c, samples).encoding)
    length = int(encoding["input_ids"].shape[1])
    for cond in conditions:
        expected = toy_c.decode_answers(_reference(toy_c, encoding, cond.heads), length)
        got = result.records.set_index("condition").loc[cond.key]
        assert list(got["answer"]) == expected, cond.key
    passes.clear()
    monkeypatch.setattr(ls, "ENABLED", False)
    sw.run_conditions(toy_c, samples, conditions, batch_size=len(samples), max_new_tokens=TOKENS,
                      max_batch_rows=rows, progress=False)
    assert all(p[0] == len(samples) for p in passes), passes  # not cut: the batch, few conditions per pass


def test_a_batch_without_a_repeated_image_shares_across_conditions(toy_c):
    """One referent of each of three scenes: no image repeats, so there is no prefix to share between rows, but
    the conditions replicate every image: ``generate_conditions`` takes the layer-sharing path (a prefix of unique
    images) and answers as the reference; without layer sharing it takes the plain path."""
    samples = [_scene_items(3)[i] for i in (0, 5, 8)]
    assert len({_scene(s) for s in samples}) == 3
    encoding = dict(encode_samples(toy_c, samples).encoding)
    assert iv.shared_image_prefix(toy_c, encoding) is None
    heads = [HeadSet(), _layer(toy_c, 7), HeadSet([Head(6, 3), Head(2, 5)]), HeadSet([Head(4, 2)])]
    ls.LAST_STATS = ls.SharingStats()
    ours = iv.generate_conditions(toy_c, encoding, [(h, Ablation()) for h in heads], max_new_tokens=TOKENS)
    assert 0 < ls.LAST_STATS.computed < ls.LAST_STATS.total
    assert all(_same(toy_c, ids, _reference(toy_c, encoding, h)) for h, ids in zip(heads, ours))


def test_vqa_answers_over_distinct_images_equal_the_reference(toy_c):
    """VQA questions of three scenes (no image repeats) under several conditions in one pass
    (``vqa_sweep.answer_conditions``) take the layer-sharing path and answer as one plain ``generate`` per
    condition with hooks."""
    from vrh_interp.data.scenes import vqa_samples
    from vrh_interp.experiments.vqa_sweep import answer_conditions, encode_vqa

    samples = [vqa_samples("eval", index, 1)[0] for index in range(3)]
    encoding = dict(encode_vqa(toy_c, samples))
    assert iv.shared_image_prefix(toy_c, encoding) is None
    heads = [HeadSet(), _layer(toy_c, 5), HeadSet([Head(4, 2), Head(6, 11)])]
    ls.LAST_STATS = ls.SharingStats()
    ours = answer_conditions(toy_c, samples, [(h, Ablation()) for h in heads], max_new_tokens=TOKENS)
    assert ls.LAST_STATS.total > 0
    length = int(encoding["input_ids"].shape[1])
    assert ours == [toy_c.decode_answers(_reference(toy_c, encoding, h), length) for h in heads]
