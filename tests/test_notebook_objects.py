"""Issue 55 item 4: every object a user holds shows itself in a few lines (``repr``, at most 15) and as HTML
(``_repr_html_``): pairs, pair batches, baselines, patching / attribution / control-set results, probe objects,
family adapters; template results read by head name (``values["L3H2"]``); the key/value patch built from the
``vlm`` handle equals the 13-argument ``build``. (``SweepResult.claims()``: tests/test_display.py.)"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import nnsight
import numpy as np
import pytest
import torch

from tests.conftest import tiny_vlm
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.families import FamilyAdapter
from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from vrh_interp.core.execution.templates import LayerValues, TemplateValues, apply_in_order
from vrh_interp.core.execution.templates.head_outputs import RowPairHeadPatch
from vrh_interp.core.execution.templates.position_patch import HeadKeyValuePatch
from vrh_interp.core.execution.templates.readout import attention_call_label
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.patching.attribution import attribution_patching
from vrh_interp.patching.batch import baseline, prepare_pairs
from vrh_interp.patching.controls import compare_with_controls
from vrh_interp.patching.head_patching import patch_each_head
from vrh_interp.patching.pairs import PatchingPair, PatchingPairs, make_pairs
from vrh_interp.patching.positions import key_value_patch, region_positions
from vrh_interp.patching.probes import HeadFeatures, ProbeScore, Split, probe_targets

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 15


def check_display(obj, *must_say: str) -> str:
    """``repr`` within ``MAX_LINES`` lines and saying ``must_say``; ``_repr_html_`` an HTML fragment."""
    text = repr(obj)
    assert len(text.splitlines()) <= MAX_LINES, text
    assert "array(" not in text and "tensor(" not in text and "PIL" not in text, text
    for words in must_say:
        assert words in text, (words, text)
    page = obj._repr_html_()
    assert isinstance(page, str) and page.startswith("<div>") and page.endswith("</div>"), page[:200]
    assert "<table></table>" not in page  # no empty table
    return text


@pytest.fixture(scope="module")
def vlm():
    return tiny_vlm("llava")


@pytest.fixture(scope="module")
def pairs(vlm):
    # random weights often answer both inputs alike: the referents' boxes are the two answers
    return prepare_pairs(vlm, make_pairs("referent_moved", 3), targets="ground_truth")


@pytest.fixture(scope="module")
def base(vlm, pairs):
    return baseline(vlm, pairs)


def test_pairs_show_their_expressions_not_their_images():
    made = make_pairs("referent_moved", 12)
    assert isinstance(made, PatchingPairs) and isinstance(made, list) and len(made) == 12
    assert isinstance(made[:3], PatchingPairs) and made[:3] == list(made)[:3]
    assert isinstance(made[0], PatchingPair)
    text = check_display(made, "12 clean/corrupted pairs", "referent_moved 12")
    assert len(text) < 400  # ~5,000 characters before
    pair = made[0]
    check_display(pair, pair.pair_id, pair.clean.expression, "distractors")
    assert made._repr_html_().count("<tr>") == 2 + 1 + 10 and "... 2 more" in made._repr_html_()  # card, head, rows


def test_a_pair_batch_and_its_baseline_show_a_few_lines(pairs, base):
    text = check_display(pairs, f"PairBatch: {pairs.n} pairs kept", "metric", pairs.clean_answers[0][:10])
    assert len(text) < 800
    gap = float((base.clean - base.corrupted).mean())
    check_display(base, f"Baseline: {pairs.n} pairs", f"{gap:.3g}", "x1")


def test_patching_results_show_the_heads_that_recover_most(vlm, pairs, base):
    every = patch_each_head(vlm, pairs, base=base, heads="L0H0,L1H1,L1H2", progress=False)
    best = every.frame.sort_values("recovery", ascending=False).iloc[0]
    check_display(every, "HeadPatchingResult: 3 heads", f"{best['head']} {best['recovery']:.3g}")
    assert every._repr_html_().count("</tr>") == 3 + 1 + 3  # the card, then the table's header and 3 heads
    estimate = attribution_patching(vlm, pairs, base=base)
    check_display(estimate, f"AttributionResult (estimates): {vlm.geometry.total_heads} heads", "gradient method")
    controls = compare_with_controls(vlm, pairs, HeadSet("L0H0,L1H1"), random_seeds=range(2), matched=False,
                                     all_sets="none", base=base)
    vrh = controls.sets[controls.sets["kind"] == "vrh"].iloc[0]
    check_display(controls, f"recovers {vrh['recovery']:.3g}", "random")


def test_probe_objects_show_their_shapes_not_their_values():
    geometry = HeadGeometry(2, 4, 2, 8)
    features = HeadFeatures(("a", "b", "c"), torch.zeros(3, 2, 4, 8), (0, 1), geometry, "prompt_end")
    check_display(features, "3 samples", "[3 x 2 x 4 x 8]")
    check_display(probe_targets(synthetic_samples("detect", 4)), "4 samples", "colour")
    check_display(Split(np.arange(40), np.arange(40, 60)), "40 train, 20 test")
    check_display(ProbeScore("x", "r2", 0.5, 0.4, 0.6, 0.0, 40, 20, 1.0), "ProbeScore x: r2 0.5 [0.4, 0.6]")


def test_adapters_show_the_family_and_the_head_grid_not_the_config(vlm):
    adapter = vlm.adapter
    text = check_display(adapter, adapter.display_name, vlm.geometry.describe(), adapter.output_projection_attr)
    assert "vocab_size" not in text and "PretrainedConfig" not in text and len(text) < 600

    def every_subclass(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from every_subclass(sub)

    from vrh_interp.core.description.families.described import DescribedAdapter
    from vrh_interp.core.description.families.gemma3 import Gemma3Adapter

    subclasses = list(every_subclass(FamilyAdapter))
    assert {Gemma3Adapter, DescribedAdapter} <= set(subclasses)  # @dataclass subclasses would write their own repr
    for cls in subclasses:
        assert cls.__repr__ is FamilyAdapter.__repr__, cls


def test_the_loaded_qwen_adapter_shows_a_card():
    vlm = tiny_vlm("qwen2_vl")
    check_display(vlm.adapter, "Qwen2VLAdapter: Qwen2-VL", "2 layers x 4 heads")


def test_template_values_are_read_by_head_name_and_by_position(vlm):
    samples = synthetic_samples("detect", 2)
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    model = vlm.nn
    readout = iv.attention_readout(vlm, [-1])
    capture = iv.head_output_capture(vlm, [1])
    with torch.no_grad(), model.trace(**batch.encoding):
        values = nnsight.save(apply_in_order(model, [readout, iv.head_ablation(vlm, "L0H1"), capture]))
    assert isinstance(values, TemplateValues) and isinstance(values[0], LayerValues)
    assert values[1] == {} and sorted(values[0]) == [0, 1]  # positional access as before
    torch.testing.assert_close(values[0]["L1H2"], values[0][1][:, 2])
    torch.testing.assert_close(values[0][Head(1, 2)], values[0][(1, 2)])
    torch.testing.assert_close(values[2]["L1H3"], values[2][1][:, :, 3])
    torch.testing.assert_close(values["L0H3"], values[0][0][:, 3])  # only the readout read layer 0
    with pytest.raises(KeyError, match=r"templates \[0, 2\]"):
        values["L1H2"]  # both the readout and the capture read it
    with pytest.raises(KeyError, match="not per head"):
        values[1]["L0H1"]
    chosen = iv.run_forward(vlm, batch.encoding, [iv.attention_readout(vlm, [-1], heads="L1H2,L0H0")]).values
    assert chosen[0].heads() == ["L0H0", "L1H2"]
    torch.testing.assert_close(chosen["L1H2"], chosen[0][1][:, 0])  # the one head read at layer 1
    with pytest.raises(KeyError, match="no template read it"):
        chosen["L1H0"]
    with pytest.raises(KeyError, match="reads heads"):
        chosen[0]["L1H0"]


def test_the_key_value_patch_from_the_handle_is_the_13_argument_build(vlm, pairs):
    batch, encoding = pairs.encode(vlm)
    source, target = region_positions(pairs, batch, encoding)["clean_referent"]
    head = Head(1, 2)
    adapter = vlm.adapter
    by_hand = HeadKeyValuePatch.build(
        head, vlm.geometry, attention_path=adapter.attention_path(1),
        projection_path=f"{adapter.attention_path(1)}.{adapter.output_projection_attr}",
        call_label=attention_call_label(adapter.attention_module(vlm.nn, 1).source.names),
        num_key_value_heads=vlm.hf_model.config.get_text_config().num_key_value_heads,
        source_rows=pairs.clean_rows(), target_rows=pairs.corrupted_rows(), key_positions=target,
        source_key_positions=source, rows=pairs.positions("answer"), states="values")
    handle = HeadKeyValuePatch.for_model(vlm, "L1H2", source_rows=pairs.clean_rows(),
                                         target_rows=pairs.corrupted_rows(), key_positions=target,
                                         source_key_positions=source, rows=pairs.positions("answer"), states="values")
    from_pairs = key_value_patch(vlm, pairs, (1, 2), "clean_referent", states="values")
    for built in (handle, from_pairs):
        for field in dataclasses.fields(HeadKeyValuePatch):
            mine, expected = getattr(built, field.name), getattr(by_hand, field.name)
            if isinstance(expected, torch.Tensor):
                assert torch.equal(mine, expected), field.name
            else:
                assert mine == expected, field.name
    rows = RowPairHeadPatch.for_model(vlm, [("L1H2", pairs.clean_rows(), pairs.corrupted_rows())],
                                      positions=pairs.positions("answer"))
    assert rows == RowPairHeadPatch.build([(head, pairs.clean_rows(), pairs.corrupted_rows())], vlm.geometry,
                                          iv.projection_path(vlm), positions=pairs.positions("answer"))


def test_the_notebooks_extra_installs_ipywidgets():
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "ipywidgets" in {Requirement(r).name for r in extras["notebooks"]}  # tqdm.auto's notebook widget
