"""DPO preference export: answers against plain generate / hook ablation, the JSONL layout, the skip count."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.conftest import noise_image, tiny_vlm
from tests.reference import zeroed_heads
from vrh_interp.data import grounding_samples
from vrh_interp.evaluation.controls import random_control
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.experiments.preferences import (control_path, export_preference_pairs, image_reference,
                                                open_image_reference)

TOKENS = 5
BATCH = 3


def _samples():
    out = []
    for index in range(3):
        out.extend(grounding_samples("eval", index, difficulty=0))
    return out[:6]


def _reference_answers(vlm, samples, heads: HeadSet | None, tokens: int) -> list[str]:
    """Plain ``generate`` (with forward pre-hooks zeroing ``heads``), on the same batches."""
    answers = []
    for start in range(0, len(samples), BATCH):
        chunk = samples[start:start + BATCH]
        batch = vlm.encode_grounding([s.image for s in chunk], [s.expression for s in chunk])
        with torch.no_grad(), zeroed_heads(vlm.hf_model, heads.by_layer() if heads is not None else {}):
            ids = vlm.hf_model.generate(**batch.encoding, max_new_tokens=tokens, do_sample=False)
        answers.extend(vlm.decode_answers(ids, batch.prompt_length))
    return answers


def _read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_pairs_equal_plain_and_hook_ablated_greedy_decodes(tmp_path):
    vlm = tiny_vlm("llava")
    samples = _samples()
    g = vlm.geometry
    # one answer token and one head: masking L0H2 flips 5 of the 6 first tokens of this random-weight fixture,
    # the random single heads flip none, so both written and skipped pairs are exercised
    heads = HeadSet([Head(0, 2)])
    summary = export_preference_pairs(vlm, samples, heads, tmp_path / "pairs.jsonl", control_seeds=(0, 1),
                                      batch_size=BATCH, max_new_tokens=1)
    chosen = _reference_answers(vlm, samples, None, 1)
    assert summary["condition"].tolist() == ["vrh", "random:seed=0", "random:seed=1"]
    for row in summary.itertuples():
        masked = heads if row.condition == "vrh" else random_control(g, heads, len(heads), int(row.seed))
        assert row.heads == str(masked)
        rejected = _reference_answers(vlm, samples, masked, 1)
        differing = [i for i in range(len(samples)) if chosen[i] != rejected[i]]
        records = _read(tmp_path / row.path.split("/")[-1])
        assert (row.n_pairs, row.n_identical) == (len(differing), len(samples) - len(differing))
        assert [r["provenance"]["sample_id"] for r in records] == [samples[i].sample_id for i in differing]
        for i, record in zip(differing, records):
            assert record["chosen"][0]["content"][0]["text"] == chosen[i]
            assert record["rejected"][0]["content"][0]["text"] == rejected[i]
            assert record["provenance"]["heads"] == masked.to_list()
            assert record["provenance"]["seed"] == (None if row.condition == "vrh" else int(row.seed))
    assert summary["n_pairs"].sum() > 0 and summary["n_identical"].sum() > 0, "both branches must be exercised"
    assert 0 < summary.loc[0, "n_pairs"] < len(samples)


def test_jsonl_has_trl_vision_preference_layout(tmp_path):
    vlm = tiny_vlm("llava")
    samples = _samples()
    heads = HeadSet([Head(1, h) for h in range(vlm.geometry.num_heads)])
    path = tmp_path / "out" / "pairs.jsonl"
    summary = export_preference_pairs(vlm, samples, heads, path, control_seeds=(3,), batch_size=BATCH,
                                      max_new_tokens=TOKENS)
    assert control_path(path, 3) == tmp_path / "out" / "pairs.random-seed3.jsonl" and control_path(path, 3).exists()
    records = _read(path)
    assert len(records) == summary.loc[0, "n_pairs"] > 0
    by_id = {s.sample_id: s for s in samples}
    for record in records:
        assert set(record) == {"prompt", "chosen", "rejected", "images", "provenance"}
        (user,) = record["prompt"]
        assert user["role"] == "user" and user["content"][0] == {"type": "image"}
        sample = by_id[record["provenance"]["sample_id"]]
        assert user["content"][1] == {"type": "text", "text": vlm.adapter.grounding_instruction(sample.expression)}
        for key in ("chosen", "rejected"):
            (turn,) = record[key]
            assert turn["role"] == "assistant" and turn["content"][0]["type"] == "text"
        assert record["chosen"] != record["rejected"]
        (reference,) = record["images"]
        assert reference == image_reference(sample) and reference.startswith("scene:eval:")
        assert np.array_equal(np.asarray(open_image_reference(reference)), np.asarray(sample.image))
        provenance = record["provenance"]
        assert provenance["mode"] == "zero" and provenance["condition"] == "vrh" and provenance["family"] == "llava"
        assert provenance["box"] == [float(v) for v in sample.box]
        assert 0.0 <= provenance["chosen_iou"] <= 1.0


def test_samples_without_an_image_reference_are_refused_before_generation(tmp_path):
    vlm = tiny_vlm("llava")

    class Plain:
        sample_id = "x"
        image = noise_image(40, 30)
        expression = "the thing"
        box = (1, 1, 10, 10)

    with pytest.raises(ValueError, match="image_reference="):
        export_preference_pairs(vlm, [Plain()], HeadSet([Head(0, 0)]), tmp_path / "p.jsonl")
    assert not (tmp_path / "p.jsonl").exists()
    summary = export_preference_pairs(vlm, [Plain()], HeadSet([Head(0, 0)]), tmp_path / "p.jsonl",
                                      control_seeds=(), image_reference=lambda s: "/data/x.png", max_new_tokens=2)
    assert summary["condition"].tolist() == ["vrh"] and summary.loc[0, "n_samples"] == 1
