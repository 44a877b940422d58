"""Shared image prefixes: rows that show the same image (a scene's referents) run the prompt up to the last image
token once per image and condition, and generate on its cached keys and values
(``interventions.shared_image_prefix``). Checked EXACTLY against the left-padded batch without sharing: greedy
token ids under the unmasked baseline and several zero- and mean-ablated head sets in one pass, on the trained toys of
both families that allow it (LLaVA: toy A, InternVL: toy B) and on tiny models; where sharing does not apply
(no repeated image, a family with M-RoPE, resample ablation) the path is not taken.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.conftest import tiny_vlm
from vrh_interp.core.execution import interventions as iv
from vrh_interp.data import grounding_samples
from vrh_interp.evaluation.grounding import ablation_values, encode_samples, ground_conditions
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.specs import load_spec
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.core.execution.templates.ablation import Ablation

TOKENS = 8


def _scene_items(scenes: int) -> list:
    """Every referent of the first ``scenes`` evaluation scenes: several expressions (of different lengths:
    left padding) per image."""
    return [s for index in range(scenes) for s in grounding_samples("eval", index, 1)]


def _conditions(vlm) -> list[tuple[HeadSet, Ablation]]:
    g = vlm.geometry
    last = g.num_layers - 1
    return [(HeadSet(), Ablation()), (HeadSet([Head(0, 0), Head(last, g.num_heads - 1)]), Ablation()),
            (HeadSet([Head(last // 2, h) for h in range(g.num_heads)]), Ablation()),
            (HeadSet([Head(1, 1)]), Ablation())]


def _check_equal(vlm, samples, conditions) -> None:
    batch = encode_samples(vlm, samples)
    encoding, segments = dict(batch.encoding), iv.batch_segments(batch)
    prefix = iv.shared_image_prefix(vlm, encoding)
    assert prefix is not None and len(prefix.first) < len(samples)
    shared = iv.generate_conditions(vlm, encoding, conditions, max_new_tokens=TOKENS, segments=segments)
    plain = iv.generate_conditions(vlm, encoding, conditions, max_new_tokens=TOKENS, shared_prefix=False,
                                   segments=segments)
    for a, b in zip(shared, plain):
        width = min(a.shape[1], b.shape[1])  # a pass runs until every row stopped: padding after EOS may differ
        assert torch.equal(a[:, :width], b[:, :width])
        assert (a[:, width:] == vlm.processor.tokenizer.pad_token_id).all()
        assert (b[:, width:] == vlm.processor.tokenizer.pad_token_id).all()


@pytest.mark.parametrize("spec", ["toy:a", "toy:b"])
def test_trained_toys_equal_without_sharing(spec):
    vlm = load_spec(spec)
    samples = _scene_items(4)
    _check_equal(vlm, samples, _conditions(vlm))
    mean = Ablation("mean", ablation_values(vlm, synthetic_samples("detect", 4), batch_size=4))
    _check_equal(vlm, samples, [(h, mean) for h, _ in _conditions(vlm)] + _conditions(vlm)[1:2])  # mean and zero
    _check_equal(vlm, samples, _conditions(vlm)[1:2])  # one condition
    # through the sweep's entry point: parsed answers and boxes
    conditions = _conditions(vlm)
    shared = ground_conditions(vlm, samples, conditions, max_new_tokens=24)
    plain = [[o for o in block] for block in ground_conditions(vlm, samples, conditions, max_new_tokens=24,
                                                               shared_prefix=False)]
    assert [[(o.answer, o.iou) for o in block] for block in shared] == \
        [[(o.answer, o.iou) for o in block] for block in plain]


@pytest.mark.parametrize("family", ["llava", "internvl", "llava_next"])
def test_tiny_families_equal_without_sharing(family):
    vlm = tiny_vlm(family)
    base = synthetic_samples("eval", 2)
    samples = [dataclasses.replace(s, sample_id=f"{s.sample_id}-{i}", expression=s.expression + " x" * i)
               for s in base for i in range(3)]
    _check_equal(vlm, samples, _conditions(vlm))


def test_cache_gathered_per_row_and_condition():
    """A prefix cache given to the wrong rows (images swapped) changes the answers: the comparison above can fail."""
    vlm = load_spec("toy:a")
    samples = _scene_items(3)
    encoding = dict(encode_samples(vlm, samples).encoding)
    prefix = iv.shared_image_prefix(vlm, encoding)
    swapped = dataclasses.replace(prefix, image_of=[(i + 1) % len(prefix.first) for i in prefix.image_of])
    good = iv._generate_from_prefix(vlm, encoding, [(HeadSet(), Ablation())], prefix, max_new_tokens=TOKENS)[0]
    bad = iv._generate_from_prefix(vlm, encoding, [(HeadSet(), Ablation())], swapped, max_new_tokens=TOKENS)[0]
    assert not torch.equal(good, bad)


def test_not_taken_where_it_does_not_apply(monkeypatch):
    taken = []
    real = iv._generate_from_prefix
    monkeypatch.setattr(iv, "_generate_from_prefix", lambda *a, **k: taken.append(1) or real(*a, **k))
    vlm = load_spec("toy:a")
    distinct = list(synthetic_samples("eval", 3))  # one referent per scene: no image repeats
    assert iv.shared_image_prefix(vlm, dict(encode_samples(vlm, distinct).encoding)) is None
    qwen = tiny_vlm("qwen2_vl")  # M-RoPE positions: not from the attention mask
    assert not qwen.adapter.image_prefix_cache
    batch = encode_samples(vlm, _scene_items(2))
    encoding = dict(batch.encoding)
    values = ablation_values(vlm, synthetic_samples("detect", 3), batch_size=3)
    iv.generate_conditions(vlm, encoding, [(HeadSet([Head(1, 1)]), Ablation("resample", values))], max_new_tokens=2,
                           segments=iv.batch_segments(batch), sample_ids=[s.sample_id for s in _scene_items(2)])
    assert not taken  # resample: each row its own donor, so rows of one image differ in the prefix
    iv.generate_conditions(vlm, encoding, [(HeadSet([Head(1, 1)]), Ablation())], max_new_tokens=2)
    assert taken
