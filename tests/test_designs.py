"""The clustered causal design (one fresh control set per scene) and the curtailed rank test
(``experiments.designs``), against plain references: a hand-written cluster-robust variance, and the full crossed
table of the same sets answered on every item by the same engine without curtailment."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from vrh_interp.core.bookkeeping.runs import RunMismatchError
from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from vrh_interp.evaluation import inference
from vrh_interp.evaluation.claims import causal_test
from vrh_interp.experiments.designs import check_subset, rank_blocks, restrict_design, scene_design, scenes_of
from vrh_interp.experiments.sweep import RECORD_COLUMNS, SweepResult
from vrh_interp.experiments.conditions import Condition, control_conditions
from vrh_interp.experiments.verdicts import rank_data


def test_cluster_effect_is_the_cluster_robust_mean_difference():
    rng = np.random.default_rng(0)
    sizes = [3, 4, 2, 5, 3, 4]
    cluster = np.repeat(np.arange(len(sizes)), sizes)
    n = cluster.size
    target = (rng.random(n) < 0.2).astype(float)
    control = (rng.random(n) < 0.8).astype(float)
    effect = inference.cluster_effect(target, control, cluster)
    d = control - target
    mean = d.mean()
    # reference: sum over clusters of (cluster total - size * mean)^2, one pseudo-cluster of the mean size, times
    # g / (g - 1), over n^2
    g = len(sizes)
    ss = sum((d[cluster == j].sum() - sizes[j] * mean) ** 2 for j in range(g)) + (n / g) ** 2
    var = ss / n ** 2 * g / (g - 1)
    assert effect.estimate == pytest.approx(mean)
    assert effect.se == pytest.approx(math.sqrt(var))
    assert effect.df == pytest.approx(g - 1)
    assert effect.sets == g and effect.set_unit.startswith("scenes")
    # the (scenes x items) table with NaN off each scene is read as the same clustered design
    table = np.full((g, n), np.nan)
    table[cluster, np.arange(n)] = control
    same = inference.set_effect(target, table)
    assert (same.estimate, same.se, same.df) == pytest.approx((effect.estimate, effect.se, effect.df))
    table[0, -1] = 1.0  # an item under two sets: not a partition
    with pytest.raises(ValueError, match="partition"):
        inference.set_effect(target, table)


def test_a_clustered_table_without_rank_sets_cannot_hold():
    n = 40
    base, top = np.ones(n), np.zeros(n)
    table = np.full((10, n), np.nan)
    table[np.repeat(np.arange(10), 4), np.arange(n)] = 1.0
    evidence = causal_test(base, top, table, minimum=0.05)
    assert evidence.parts["special"] == 1.0 and evidence.p_holds == 1.0  # no common items to rank on
    ranked = causal_test(base, top, table, minimum=0.05, rank=(0.0, np.ones(199)))
    assert ranked.p_holds < 0.01


def _items(scenes: list[int]) -> list[SimpleNamespace]:
    out = []
    for j, count in enumerate(scenes):
        image = object()
        out += [SimpleNamespace(sample_id=f"e{j}-{r}", image=image) for r in range(count)]
    return out


def test_scene_design_gives_each_scene_its_own_nested_sets_on_its_items_only():
    geometry = HeadGeometry(4, 8, 4, 16)
    ranking = HeadSet([Head(3, 5), Head(2, 1), Head(1, 0), Head(0, 7), Head(2, 2), Head(1, 4)])
    items = _items([3, 1, 4, 2])
    assert [len(s) for s in scenes_of(items)] == [3, 1, 4, 2]
    live = HeadSet([h for h in geometry.all_heads() if h.head % 2 == 0])
    conditions, items_of = scene_design(ranking, geometry, [0, 1, 2, 4], items, 100, live=live)
    keys = [c.key for c in conditions]
    assert keys[:4] == ["baseline:k=0", "top:k=1", "top:k=2", "top:k=4"]
    assert not any(key in items_of for key in keys[:4])  # the baseline and top-k: every item
    for j, scene in enumerate(scenes_of(items)):
        mine = [c for c in conditions if c.seed == 100 + j]
        assert {(c.kind, c.k) for c in mine} == {(kind, k) for kind in ("random", "matched", "live") for k in (1, 2, 4)}
        assert all(items_of[c.key] == [s.sample_id for s in scene] for c in mine)
        # the same draws as the crossed design's for that seed (detected set = the top max(ks)), nested in k
        crossed = {c.key: c for k in (1, 2, 4) for c in control_conditions(geometry, ranking[:4], k, ranking[:k],
                                                                          [100 + j], live=live)}
        assert all(crossed[c.key].heads == c.heads for c in mine)
        for kind in ("random", "live"):
            sets = {c.k: set(c.heads) for c in mine if c.kind == kind}
            assert sets[1] <= sets[2] <= sets[4]
    # restricted to some items: the sets of scenes without them are left out, the others cut to them
    part, where = restrict_design(conditions, items_of, ["e0-1", "e2-0", "e2-3"], lambda c: c.k == 2)
    assert {c.seed for c in part if c.seed is not None} == {100, 102}
    assert all(c.k in (0, 2) for c in part)
    assert {tuple(v) for v in where.values()} == {("e0-1",), ("e2-0", "e2-3")}
    assert check_subset(items, 4) == items[:3] + items[4:5]  # whole scenes spread over the items, the last cut


def test_rank_blocks_cover_the_sets_in_doubling_blocks():
    assert rank_blocks(199) == [(0, 20), (20, 60), (60, 140), (140, 199)]
    assert rank_blocks(20, 20) == [(0, 20)] and rank_blocks(0) == []


def _frame(rows: list[tuple[str, str, bool]]) -> pd.DataFrame:
    return pd.DataFrame([{"sample_id": s, "condition": key, "kind": key.split(":")[0], "k": 1, "seed": None,
                          "answer": "", "parsed": True, "box": None, "iou": 1.0 if ok else 0.0,
                          "other_object_iou": 0.0} for key, s, ok in rows], columns=RECORD_COLUMNS)


def test_rank_data_counts_a_curtailed_sets_unanswered_items_as_right():
    top = Condition("top", 1, None, HeadSet([Head(0, 0)]))
    sets = [Condition("random", 1, seed, HeadSet([Head(1, seed)])) for seed in range(3)]
    items = ["a", "b", "c", "d"]
    rows = [(top.key, i, ok) for i, ok in zip(items, [True, False, False, False])]  # the target: 1 of 4
    rows += [(sets[0].key, "a", True), (sets[0].key, "b", True)]  # 2 > 1 after two items: less harmful
    rows += [(sets[1].key, i, False) for i in items[:3]]  # 0 + 1 unanswered <= 1: as harmful, decided
    rows += [(sets[2].key, i, ok) for i, ok in zip(items, [False, True, False, False])]  # answered whole: 1
    result = SweepResult(_frame(rows), [top, *sets], 0.5)
    target, values = rank_data(result, 1, "random", "zero", "top", 0.5)
    assert target == 0.25
    assert list(values <= target) == [False, True, True]


@pytest.fixture(scope="module")
def planted():
    from vrh_interp.experiments.positive_control import load_planted
    from vrh_interp.data.sources import synthetic_samples

    return load_planted(None), synthetic_samples("eval", 3)


def test_items_of_answers_only_the_assigned_pairs_as_the_crossed_run_does(planted, tmp_path):
    from vrh_interp.experiments.sweep import run_conditions
    from vrh_interp.experiments.conditions import sweep_conditions

    vlm, items = planted
    ranking = HeadSet([Head(3, 2), Head(3, 11), Head(2, 3)])
    conditions = sweep_conditions(ranking, vlm.geometry, [0, 3], [0, 1])
    crossed = run_conditions(vlm, items, conditions, batch_size=8, progress=False)
    ids = [s.sample_id for s in items]
    items_of = {c.key: ids[:2] if c.seed == 0 else ids[2:] for c in conditions if c.seed is not None}
    part = run_conditions(vlm, items, conditions, batch_size=8, progress=False, items_of=items_of,
                          run_dir=tmp_path / "part")
    got = {(r.condition, r.sample_id): r.answer for r in part.records.itertuples()}
    want = {(r.condition, r.sample_id): r.answer for r in crossed.records.itertuples()
            if r.condition not in items_of or r.sample_id in items_of[r.condition]}
    assert got == want
    # the assignment is part of the run: resuming the folder with another one is refused
    with pytest.raises(RunMismatchError, match="items_of"):
        run_conditions(vlm, items, conditions, batch_size=8, progress=False, run_dir=tmp_path / "part",
                       items_of={key: ids for key in items_of})
    summary = part.summary().set_index("key")
    assert np.isnan(summary.loc["random:k=3:seed=all", "accuracy_q05"])  # clustered: no set distribution
    with pytest.raises(ValueError, match="items_of names"):
        run_conditions(vlm, items, conditions, progress=False, items_of={"random:k=9:seed=0": ids})


def test_vqa_scene_design_answers_each_scenes_questions_under_its_own_sets_as_the_crossed_sweep_does(planted,
                                                                                                    tmp_path):
    """The VQA clustered design: a scene is its questions' image source (every kind of question), each scene's
    sets are the crossed design's draws for its seed, answered on its questions only, with the answers the crossed
    sweep gives on exactly those pairs; the folder's records are complete (``vqa_sweep_from_run``) and the VQA
    claim's table reads as a partition (one set per item and kind)."""
    from vrh_interp.data.datasets.synthetic_vqa import synthetic_vqa
    from vrh_interp.experiments.designs import vqa_scene_design
    from vrh_interp.experiments.verdicts import vqa_evidence
    from vrh_interp.experiments.vqa_sweep import run_vqa_conditions, vqa_conditions, vqa_item, vqa_sweep_from_run

    vlm, _ = planted
    items = list(synthetic_vqa("eval", 3))
    heads = HeadSet([Head(3, 2), Head(3, 11), Head(2, 3)])
    detected = HeadSet([*heads, Head(1, 1)])
    conditions, items_of = vqa_scene_design(heads, vlm.geometry, items, 40, detected=detected)
    scenes: dict[int, list[str]] = {}
    for s in items:
        scenes.setdefault(s.meta["index"], []).append(vqa_item(s))
    assert [c.key for c in conditions[:2]] == ["baseline:k=0", "top:k=3"]
    for j, names in scenes.items():
        mine = [c for c in conditions if c.seed == 40 + j]
        assert {c.kind for c in mine} == {"random", "matched"} and all(items_of[c.key] == sorted(names) or
                                                                        items_of[c.key] == names for c in mine)
        crossed = {c.key: c.heads for c in vqa_conditions(vlm.geometry, heads, [40 + j], detected=detected)}
        assert all(crossed[c.key] == c.heads for c in mine) and not any(set(c.heads) & set(detected) for c in mine)
    full = run_vqa_conditions(vlm, items, conditions, batch_size=8, progress=False)
    part = run_vqa_conditions(vlm, items, conditions, items_of=items_of, batch_size=8, progress=False,
                              run_dir=tmp_path / "vqa")
    got = {(f"{r.benchmark}/{r.sample_id}", r.condition): r.response for r in part.records.itertuples()}
    want = {(f"{r.benchmark}/{r.sample_id}", r.condition): r.response for r in full.records.itertuples()
            if r.condition not in items_of or f"{r.benchmark}/{r.sample_id}" in items_of[r.condition]}
    assert got == want and len(got) < len(full.records)
    assert len(vqa_sweep_from_run(tmp_path / "vqa").records) == len(want)
    evidence = vqa_evidence(part, sorted({s.benchmark for s in items}), 3, kinds=("random", "matched"))
    assert evidence.parts["special"] == 1.0  # no rank sets and no grounding rank test: it cannot hold
    with pytest.raises(ValueError, match="items_of names"):
        run_vqa_conditions(vlm, items, conditions, items_of={"random:k=9:seed=0": ["x/y"]}, progress=False)


def test_curtailed_rank_decides_every_set_as_the_full_table_does_with_fewer_answers(planted, tmp_path):
    from vrh_interp.experiments.designs import curtailed_rank
    from vrh_interp.experiments.sweep import run_conditions

    vlm, items = planted
    geometry = vlm.geometry
    detected = HeadSet([Head(3, 2), Head(3, 11), Head(2, 3)])
    baseline = Condition("baseline", 0, None, HeadSet())
    for target in (Condition("top", 3, None, detected),  # the planted heads: every set less harmful
                   Condition("top", 2, None, HeadSet([Head(3, 2), Head(0, 1)]))):  # a weaker one: ties and wins
        sets = [c for c in control_conditions(geometry, detected, target.k, target.heads, list(range(24)))]
        full = run_conditions(vlm, items, [baseline, target, *sets], batch_size=16, progress=False)
        cut = curtailed_rank(vlm, items, baseline, target, sets, tmp_path / f"rank{target.k}", batch_size=16,
                             max_new_tokens=24)
        for kind in ("random", "matched"):
            want = rank_data(full, target.k, kind, "zero", "top", 0.5)
            got = rank_data(cut, target.k, kind, "zero", "top", 0.5)
            assert got[0] == want[0]
            assert list(got[1] <= got[0]) == list(want[1] <= want[0])
            assert inference.sequential_rank_p(*got) == inference.sequential_rank_p(*want)
        assert len(cut.records) < len(full.records)
