"""One head vocabulary across the public API: ``Head``, ``"L1H2"``, ``(layer, head)``, a ``HeadSet``, a list of any
of these and a ``HeadScores`` ranking are read the same by ``sweep``, ``head_ablation``, ``score_of`` and
``scores[...]``; and the API's inputs are checked with one-line errors naming the argument and the fix."""

from __future__ import annotations

import numpy as np
import pytest

import vrh_interp as vrh
from tests.conftest import noise_image, tiny_vlm
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.boxes import Box
from vrh_interp.core.description.heads import Head, HeadSet, HeadSpecError, HeadTypeError
from vrh_interp.data.datasets import GroundingSample
from vrh_interp.data.datasets.errors import DatasetError
from vrh_interp.data.datasets.images import LoadedImage
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.experiments import sweep as sweep_module
from vrh_interp.experiments.ks import KSpecError
from vrh_interp.scoring.design import ScoringDesign
from vrh_interp.scoring.scores import HeadScores

# the tiny qwen2_vl grid: 2 layers x 4 heads; scores whose ranking is L1H2, L0H1, then the rest
SCORES = np.zeros((2, 4))
SCORES[1, 2], SCORES[0, 1] = 0.9, 0.5
TWO = HeadSet([Head(1, 2), Head(0, 1)])
# every form that names the two heads L1H2, L0H1 in that order
FORMS = {
    "HeadSet": TWO,
    "text": "L1H2,L0H1",
    "list of Head": [Head(1, 2), Head(0, 1)],
    "list of str": ["L1H2", "l0h1"],
    "list of tuples": [(1, 2), (0, 1)],
    "mixed list": [Head(1, 2), "L0H1"],
    "tuple of forms": ((1, 2), HeadSet("L0H1")),
    "list of HeadSets": [HeadSet("L1H2"), HeadSet([Head(0, 1)])],
}
ONE = {"Head": Head(1, 2), "str": "L1H2", "tuple": (1, 2), "numpy ints": (np.int64(1), np.int64(2))}


def _scores() -> HeadScores:
    return HeadScores(SCORES.copy(), ScoringDesign())


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_collection_form_reads_as_the_same_head_set(form):
    assert HeadSet.coerce(FORMS[form]) == TWO


@pytest.mark.parametrize("form", sorted(ONE))
def test_every_single_head_form_reads_as_one_head(form):
    assert Head.coerce(ONE[form]) == Head(1, 2)
    assert HeadSet.coerce(ONE[form]) == HeadSet([Head(1, 2)])


def test_a_ranking_reads_as_all_its_heads_best_first():
    assert HeadSet.coerce(_scores())[:2] == TWO and len(HeadSet.coerce(_scores())) == 8


@pytest.mark.parametrize("bad, error, words", [
    (None, HeadTypeError, "heads is None: pass Head(3, 2)"),
    (3, HeadTypeError, "heads=3 (int) names no heads"),
    ([3, 2], HeadTypeError, "(layer, head) tuple of two ints"),
    ([(1, 2, 3)], HeadTypeError, "heads[0]=(1, 2, 3)"),
    ({"L1H2": 1}, HeadTypeError, "(dict) names no heads"),
    ("L1X2", HeadSpecError, "heads: cannot parse 'L1X2'"),
    ([Head(1, 2), (1, 2)], HeadSpecError, "heads: duplicate head L1H2"),
    ([(1, -2)], HeadSpecError, "heads[0]: Head.head must be >= 0"),
])
def test_what_names_no_heads_is_refused_in_one_line(bad, error, words):
    with pytest.raises(error) as info:
        HeadSet.coerce(bad)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)  # HeadTypeError is also a TypeError


@pytest.mark.parametrize("form", sorted(ONE))
def test_score_of_and_indexing_take_every_single_head_form(form):
    scores = _scores()
    assert scores.score_of(ONE[form]) == pytest.approx(0.9)
    assert scores[ONE[form]] == pytest.approx(0.9)
    assert scores[1, 2] == pytest.approx(0.9)  # scores[layer, head]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_indexing_with_several_heads_gives_their_scores_in_order(form):
    got = _scores()[FORMS[form]]
    assert list(got.index) == ["L1H2", "L0H1"] and list(got) == pytest.approx([0.9, 0.5])


def test_score_lookups_refuse_heads_outside_the_grid_and_non_heads():
    scores = _scores()
    with pytest.raises(vrh.HeadOutOfRangeError, match=r"score_of\(head\): L2H0 not in these scores \(2 layers"):
        scores.score_of("L2H0")
    with pytest.raises(vrh.HeadOutOfRangeError, match=r"scores\[heads\]: L0H7"):
        scores[["L0H1", "L0H7"]]
    with pytest.raises(TypeError, match=r"score_of\(head\)=None is not a head"):
        scores.score_of(None)


@pytest.mark.parametrize("form", sorted(FORMS) + ["HeadScores"])
def test_head_ablation_takes_every_form(form):
    vlm = tiny_vlm("qwen2_vl")
    heads = _scores() if form == "HeadScores" else FORMS[form]
    want = HeadSet.coerce(heads)
    ablation = iv.head_ablation(vlm, heads)
    assert {layer: set(idx) for layer, idx in ablation.heads_by_layer.items()} == {
        layer: set(idx) for layer, idx in want.by_layer().items()}


@pytest.mark.parametrize("form", sorted(ONE))
def test_head_ablation_takes_one_head_in_every_form(form):
    assert dict(iv.head_ablation(tiny_vlm("qwen2_vl"), ONE[form]).heads_by_layer) == {1: (2,)}


def test_head_ablation_names_its_argument():
    with pytest.raises(TypeError, match=r"head_ablation\(heads\) is None"):
        iv.head_ablation(tiny_vlm("qwen2_vl"), None)


@pytest.fixture
def conditions_of(monkeypatch):
    """The conditions ``sweep`` hands to ``run_conditions`` (not run: the forms are what is tested here)."""
    seen = []
    monkeypatch.setattr(sweep_module, "run_conditions", lambda vlm, samples, conditions, **_: seen.append(conditions))
    return seen


@pytest.mark.parametrize("form", sorted(FORMS) + ["HeadScores"])
def test_sweep_takes_every_form_of_ranking(form, conditions_of):
    ranking = _scores() if form == "HeadScores" else FORMS[form]
    vrh.sweep(tiny_vlm("qwen2_vl"), synthetic_samples("eval", 2), ranking, ks=(0, 1, 2), random_seeds=(0,),
              progress=False)
    top = {c.k: c.heads for c in conditions_of[0] if c.kind == "top"}
    assert top == {1: TWO[:1], 2: TWO}


def test_sweep_runs_with_a_list_of_heads():
    """The issue's case end to end: a plain list of ``Head`` once raised ``'list' object has no attribute
    'to_list'``."""
    result = vrh.sweep(tiny_vlm("qwen2_vl"), synthetic_samples("eval", 2), [Head(1, 2), Head(0, 1)], ks=(0, 1),
                       random_seeds=(), matched=False, max_new_tokens=3, progress=False)
    assert {c.key for c in result.conditions} == {"baseline:k=0", "top:k=1"}
    assert next(c.heads for c in result.conditions if c.kind == "top") == HeadSet("L1H2")


def test_sweep_refuses_no_ranking_in_one_line():
    with pytest.raises(TypeError, match=r"sweep\(ranking\) is None: pass Head\(3, 2\)") as info:
        vrh.sweep(tiny_vlm("qwen2_vl"), synthetic_samples("eval", 2), None)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("ks, words", [(3, "ks=3 is one number: ks is a list of k values, e.g. ks=[3]"),
                                       (2.5, "ks=2.5 is one number"),
                                       (None, "ks is None: pass head counts"),
                                       ({"k": 1}, "(dict) is not a list of k values")])
def test_sweep_refuses_ks_that_are_not_a_list(ks, words):
    with pytest.raises(KSpecError) as info:
        vrh.sweep(tiny_vlm("qwen2_vl"), synthetic_samples("eval", 2), TWO, ks=ks)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_encode_grounding_refuses_an_image_and_a_string_for_lists():
    vlm, image = tiny_vlm("qwen2_vl"), noise_image(40, 30)
    with pytest.raises(TypeError, match=r"encode_grounding\(images=...\) takes a list with one PIL image per row, got "
                                        r"Image: for one row write encode_grounding\(\[image\], \[expression\]\)"):
        vlm.encode_grounding(image, "the red circle")
    with pytest.raises(TypeError, match=r"encode_grounding\(expressions=...\) takes a list with one string per row, "
                                        r"got str"):
        vlm.encode_grounding([image], "the red circle")
    with pytest.raises(TypeError, match=r"encode_grounding: images\[1\] is str, not a PIL image"):
        vlm.encode_grounding([image, "photo.png"], ["a", "b"])
    with pytest.raises(TypeError, match=r"encode_grounding: expressions\[0\] is int, not a string"):
        vlm.encode_grounding([image], [7])
    assert vlm.encode_grounding((image,), ("the red circle",)).encoding["input_ids"].shape[0] == 1  # tuples are fine


def _sample(box) -> GroundingSample:
    image = noise_image(20, 20)
    return GroundingSample(sample_id="s0", expression="the thing", box=box, image_size=image.size,
                           image_source=LoadedImage(image, "s0"))


def test_a_grounding_sample_without_a_box_is_refused_when_built():
    with pytest.raises(DatasetError, match="s0: box is None: a grounding sample needs its ground-truth box"):
        _sample(None)
    with pytest.raises(DatasetError, match=r"s0: box \(1, 2\)"):
        _sample((1, 2))
    assert _sample((1, 1, 9, 9)).box == Box(1, 1, 9, 9)  # four xyxy numbers are read as a Box
