"""Set-level statistics of the causal sweeps: random-set distributions, empirical p-values, two-level bootstrap,
layer-matched controls, k as a fraction, failure decomposition, summaries recomputed from a run folder.

Outcome tables are built by hand (no model) where the statistics are the point; the run-folder test uses the
tiny random-weight Qwen2-VL.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tests.conftest import tiny_vlm
from vrh_interp.core.description.boxes import Box
from vrh_interp.experiments.ks import demo_ks
from vrh_interp.experiments import sweep as sweep_module
from vrh_interp.evaluation.statistics import (bootstrap_ci, empirical_p_value, random_set_distribution,
                                              set_level_verdict, two_level_bootstrap_ci)
from vrh_interp.experiments.designs import check_subset
from vrh_interp.experiments.sweep import (RECORD_COLUMNS, SweepResult, other_object_iou, run_conditions, sweep,
                                          sweep_from_run)
from vrh_interp.experiments.conditions import Condition, sweep_conditions
from vrh_interp.experiments.ks import parse_ks
from vrh_interp.experiments.condition_stats import summary_verdict
from vrh_interp.evaluation.controls import layer_matched_control
from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from vrh_interp.data.sources import synthetic_samples


# ----------------------------------------------------------------------------------------- pure statistics
def test_empirical_p_value_counts_sets_at_least_as_harmful():
    controls = [0.5, 0.3, 0.7, 0.3, 0.9]
    assert empirical_p_value(0.3, controls) == (1 + 2) / (1 + 5)  # ties count against the top-k
    assert empirical_p_value(0.1, controls) == 1 / 6
    assert empirical_p_value(0.95, controls) == 1.0
    assert empirical_p_value(0.2, [0.4] * 19) == 0.05  # 19 sets: the smallest p that reaches 0.05
    assert np.isnan(empirical_p_value(0.2, []))


def test_random_set_distribution_matches_hand_values():
    accuracies = [i / 20 for i in range(21)]  # 0, 0.05, ..., 1: linear quantiles fall on the grid
    dist = random_set_distribution(accuracies)
    assert dist["sets"] == 21 and dist["mean"] == pytest.approx(0.5)
    mean = sum(accuracies) / 21
    assert dist["sd"] == pytest.approx((sum((a - mean) ** 2 for a in accuracies) / 20) ** 0.5)
    assert [dist[q] for q in ("q05", "q25", "q50", "q75", "q95")] == pytest.approx([0.05, 0.25, 0.5, 0.75, 0.95])
    assert np.isnan(random_set_distribution([0.4])["sd"])


def test_two_level_bootstrap_equals_an_explicit_loop_over_the_same_draws():
    data = np.array([[1, 0, 1, 1, 0], [0, 0, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=float)
    low, high = two_level_bootstrap_ci(data, resamples=300, seed=7)
    rng = np.random.default_rng(7)
    means = []
    for _ in range(300):
        chosen = rng.integers(0, 3, size=3)  # level 1: sets, with replacement
        picks = rng.integers(0, 5, size=(3, 5))  # level 2: samples within each drawn set
        total = 0.0
        for i in range(3):
            for j in range(5):
                total += data[chosen[i]][picks[i][j]]
        means.append(total / 15)
    assert (low, high) == (np.quantile(means, 0.025), np.quantile(means, 0.975))


def test_two_level_bootstrap_analytic_cases():
    # every set the same constant: no spread at either level
    assert two_level_bootstrap_ci(np.full((4, 6), 1.0)) == (1.0, 1.0)
    # one set all correct, one all wrong: within-set resampling changes nothing, and the mean of two drawn sets
    # is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the 95% interval is [0, 1]
    assert two_level_bootstrap_ci(np.array([[1.0] * 5, [0.0] * 5])) == (0.0, 1.0)
    # ... whereas the pooled-sample bootstrap of the same 10 answers is far narrower
    low, high = bootstrap_ci([1.0] * 5 + [0.0] * 5)
    assert 0.1 <= low and high <= 0.9
    with pytest.raises(ValueError, match="sets x samples"):
        two_level_bootstrap_ci([1.0, 0.0])


def test_set_level_verdict_rules():
    sets = [0.6] * 20
    assert set_level_verdict(0.3, 0.001, {"random": sets, "matched": sets})[0] == "holds"
    assert set_level_verdict(0.3, 0.2, {"random": sets})[0] == "does not hold"  # no significant drop
    assert set_level_verdict(0.7, 0.001, {"random": sets})[0] == "does not hold"  # less harmful than random
    mixed = [0.2] * 5 + [0.8] * 15
    verdict, reason = set_level_verdict(0.3, 0.001, {"random": sets, "matched": mixed})
    assert verdict == "inconclusive" and "matched p=0.286" in reason  # (1 + 5) / 21
    assert set_level_verdict(0.3, 0.001, {"random": [0.6] * 10})[0] == "inconclusive"  # 10 sets: p >= 1/11
    assert set_level_verdict(0.3, 0.001, {"random": sets, "matched": []})[0] == "does not hold"


# ------------------------------------------------------------------------------- hand-built outcome tables
def _records(kind: str, k: int, seed: int | None, correct: list[bool]) -> list[dict]:
    key = Condition(kind, k, seed, HeadSet()).key
    return [{"sample_id": f"s{i}", "condition": key, "kind": kind, "k": k, "seed": seed, "answer": "",
             "parsed": True, "box": (0.0, 0.0, 1.0, 1.0), "iou": 1.0 if c else 0.0, "other_object_iou": 0.0}
            for i, c in enumerate(correct)]


def _correct(n: int, hits: int, shift: int = 0) -> list[bool]:
    """``hits`` of ``n`` samples correct, starting at ``shift`` (so sets miss different samples)."""
    return [(i - shift) % n < hits for i in range(n)]


def _table(n: int, top_hits: int, random_hits: list[int], matched_hits: list[int], k: int = 2) -> SweepResult:
    records = _records("baseline", 0, None, [True] * n) + _records("top", k, None, _correct(n, top_hits))
    conditions = [Condition("baseline", 0, None, HeadSet()), Condition("top", k, None, HeadSet())]
    for kind, hits in (("random", random_hits), ("matched", matched_hits)):
        for seed, h in enumerate(hits):
            records += _records(kind, k, seed, _correct(n, h, shift=seed))
            conditions.append(Condition(kind, k, seed, HeadSet()))
    frame = pd.DataFrame(records, columns=RECORD_COLUMNS)
    return SweepResult(frame, conditions, iou_threshold=0.5, total_heads=32)


def _pooled_rule_separates(result: SweepResult, k: int) -> bool:
    """The retired rule: percentile-bootstrap CIs over pooled samples, top-k's high end below random's low end."""
    df = result.records
    top = (df[df["kind"] == "top"]["iou"] >= 0.5).astype(float).tolist()
    pooled = (df[(df["kind"] == "random") & (df["k"] == k)]["iou"] >= 0.5).astype(float).tolist()
    return bootstrap_ci(top)[1] < bootstrap_ci(pooled)[0]


def test_pooled_rule_separates_where_the_set_level_rule_does_not():
    # 100 samples; top-2 at 0.40; half of the 20 random sets at 0.30, half at 0.95 (pooled mean 0.625 on 2,000
    # answers, a narrow interval); the layer-matched sets all at 0.90
    result = _table(100, 40, [30] * 10 + [95] * 10, [90] * 20)
    assert _pooled_rule_separates(result, 2)
    summary = result.summary()
    top = summary.set_index("key").loc["top:k=2"]
    assert top["p_vs_random"] == pytest.approx((1 + 10) / 21)  # 10 random sets are more harmful
    assert top["p_vs_matched"] == pytest.approx(1 / 21)
    judged = summary_verdict(summary, 2)
    assert judged["verdict"] == "inconclusive" and "random p=0.524" in judged["reason"]
    random = judged["controls"]["random"]
    assert random["sets"] == 20 and random["accuracy"] == pytest.approx(0.625)
    assert random["accuracy_sd"] == pytest.approx(np.std([0.3] * 10 + [0.95] * 10, ddof=1))
    assert (random["accuracy_q05"], random["accuracy_q95"]) == (pytest.approx(0.3), pytest.approx(0.95))
    # the set-level interval for the random mean is much wider than the pooled-sample one
    pooled = bootstrap_ci((result.records[result.records["kind"] == "random"]["iou"] >= 0.5).astype(float))
    assert random["accuracy_ci_high"] - random["accuracy_ci_low"] > 3 * (pooled[1] - pooled[0])


def test_set_level_rule_holds_where_the_pooled_rule_does_not():
    # 10 samples; top-2 at 0.30 (7 lost vs an all-correct baseline: McNemar p = 2 / 2**7); every one of 20
    # random sets at 0.40 and 20 matched sets at 0.50: no set is as harmful, but 10 samples give the top-k a
    # wide interval that overlaps the pooled random one
    result = _table(10, 3, [4] * 20, [5] * 20)
    assert not _pooled_rule_separates(result, 2)
    summary = result.summary()
    top = summary.set_index("key").loc["top:k=2"]
    assert top["p_value_vs_baseline"] == pytest.approx(2 / 2 ** 7)
    assert top["p_vs_random"] == top["p_vs_matched"] == pytest.approx(1 / 21)
    assert summary_verdict(summary, 2)["verdict"] == "holds"
    # the summary's set-level interval is the two-level bootstrap of the (sets x samples) table
    matrix = np.array([_correct(10, 4, shift=seed) for seed in range(20)], dtype=float)
    row = summary.set_index("key").loc["random:k=2:seed=all"]
    assert (row["accuracy_ci_low"], row["accuracy_ci_high"]) == two_level_bootstrap_ci(matrix)
    assert row["k_fraction"] == 2 / 32 and np.isnan(row["p_value_vs_baseline"]) and row["n"] == 200


# -------------------------------------------------------------------------------------------- controls
def test_layer_matched_sets_match_per_layer_counts_and_avoid_detected_heads():
    g = HeadGeometry(4, 8, 2, 16)
    ranking = HeadSet(g.all_heads()[i] for i in np.random.default_rng(3).permutation(32))
    detected = ranking[:6]
    for seed in range(5):
        previous: set[Head] = set()
        for k in (1, 2, 4, 6):
            matched = layer_matched_control(g, detected, ranking[:k], seed)
            assert {layer: len(heads) for layer, heads in matched.by_layer().items()} == \
                {layer: len(heads) for layer, heads in ranking[:k].by_layer().items()}
            assert not set(matched) & set(detected)
            assert previous <= set(matched)  # nested in k for one seed (the top-k sets are nested)
            previous = set(matched)
        assert matched == layer_matched_control(g, detected, ranking[:6], seed)  # seeded
    draws = {tuple(layer_matched_control(g, detected, ranking[:6], seed)) for seed in range(5)}
    assert len(draws) > 1


def test_sweep_conditions_hold_both_controls_and_name_the_largest_usable_k():
    g = HeadGeometry(2, 4, 2, 16)
    ranking = HeadSet([Head(0, 0), Head(0, 1), Head(0, 2), Head(1, 0), Head(1, 1), Head(1, 2), Head(0, 3), Head(1, 3)])
    conditions = sweep_conditions(ranking, g, [0, 1, 2], [0, 1])
    assert [c.key for c in conditions] == [
        "baseline:k=0", "top:k=1", "random:k=1:seed=0", "random:k=1:seed=1", "matched:k=1:seed=0",
        "matched:k=1:seed=1", "top:k=2", "random:k=2:seed=0", "random:k=2:seed=1", "matched:k=2:seed=0",
        "matched:k=2:seed=1"]
    matched = [c for c in conditions if c.kind == "matched"]
    assert all(h.layer == 0 and h not in ranking[:2] for c in matched for h in c.heads)
    # top-3 all in layer 0: only one layer-0 head lies outside it
    with pytest.raises(ValueError, match=r"only 1 of that layer's heads.*largest usable k on this model \(8 heads\) "
                                         r"is 2 \(25.0%\).*matched=False"):
        sweep_conditions(ranking, g, [0, 3], [0])
    with pytest.raises(ValueError, match=r"only 3 heads lie outside.*largest usable k .* is 4"):
        sweep_conditions(ranking, g, [0, 5], [0], matched=False)


def test_condition_keys_round_trip_with_ablation():
    heads = HeadSet([Head(0, 1)])
    for cond in (Condition("baseline", 0, None, HeadSet()), Condition("matched", 3, 7, heads),
                 Condition("top", 3, None, heads, "mean"), Condition("random", 2, 1, heads, "resample")):
        assert Condition.from_key(cond.key, cond.heads) == cond
    assert Condition("top", 3, None, heads, "mean").key == "top:k=3:ablation=mean"
    with pytest.raises(ValueError, match="not a condition key"):
        Condition.from_key("random:k=1:colour=red", heads)


def test_fraction_ks_map_to_counts():
    assert parse_ks("0,1%,2.5%,5", 32) == [0, 1, 5]  # 0.32 and 0.8 heads: at least 1 head
    assert parse_ks("1.25%,0.25%,0%", 200) == [0, 1, 3]  # 2.5 rounds half up to 3, 0.5 to 1
    assert parse_ks(["2%", 20, "20"], 1000) == [20]  # duplicates kept once
    assert parse_ks("10%,50%,100%", 784) == [78, 392, 784]
    for bad, message in (("150%", "between 0% and 100%"), ("2.5", "whole number"), ("x%", "percentage"),
                         ("-1", "whole number")):
        with pytest.raises(ValueError, match=message):
            parse_ks(bad, 32)


def test_demo_ks_cover_the_papers_share_of_heads():
    assert demo_ks(32) == ([0, 1, 2, 3], 1)  # no count inside 1.7-2.6% of 32 heads: at least 1 head
    assert demo_ks(8) == ([0, 1], 1)
    ks, k_star = demo_ks(784)
    assert k_star == 17 and 0.017 <= k_star / 784 <= 0.026
    assert ks == [0, 4, 8, 13, 17, 20, 39, 78]
    ks, k_star = demo_ks(1152)
    assert k_star == 25 and 0.017 <= k_star / 1152 <= 0.026 and min(k for k in ks if k) == 6


# ------------------------------------------------------------------------------------ failure decomposition
def test_other_object_iou_from_the_samples_object_boxes():
    boxes = [Box(0, 0, 10, 10), Box(20, 20, 30, 30), Box(40, 0, 50, 10)]
    sample = SimpleNamespace(sample_id="s", box=boxes[0], meta={"object_boxes": boxes, "target_index": 0})
    assert other_object_iou(sample, (20, 20, 30, 30)) == 1.0
    assert other_object_iou(sample, (20, 20, 25, 30)) == pytest.approx(0.5)
    assert other_object_iou(sample, (0, 0, 10, 10)) == 0.0  # the referent itself is not "another object"
    assert other_object_iou(sample, None) is None  # no box parsed
    assert other_object_iou(SimpleNamespace(sample_id="s", box=boxes[0], meta={}), (0, 0, 5, 5)) is None
    no_index = SimpleNamespace(sample_id="s", box=boxes[0], meta={"object_boxes": boxes})
    assert other_object_iou(no_index, (0, 0, 10, 10)) == 0.0  # the referent found by its box
    scene = synthetic_samples("eval", 1)[0]
    other = next(b for i, b in enumerate(scene.meta["object_boxes"]) if i != scene.meta["target_index"])
    assert other_object_iou(scene, tuple(other)) == 1.0


def test_failure_decomposition_on_a_hand_built_condition():
    base = _records("baseline", 0, None, [True] * 4)
    top = _records("top", 1, None, [True, False, False, False])
    top[1].update(iou=0.1, other_object_iou=0.8)  # boxed another object
    top[2].update(iou=0.2, other_object_iou=0.1)  # boxed nothing known
    top[3].update(parsed=False, box=None, iou=0.0, other_object_iou=None)  # parse failure
    conditions = [Condition("baseline", 0, None, HeadSet()), Condition("top", 1, None, HeadSet())]
    frame = pd.DataFrame(base + top, columns=RECORD_COLUMNS)
    row = SweepResult(frame, conditions, 0.5).summary().set_index("key").loc["top:k=1"]
    assert (row["accuracy"], row["other_object_rate"], row["no_object_rate"], row["parse_failure_rate"]) == \
        (0.25, 0.25, 0.25, 0.25)
    assert row["mislocation_rate"] == 0.5 and np.isnan(row["k_fraction"])  # head count unknown here
    # records written before the field existed: the split falls back to parse failure / mislocation
    old = [{k: v for k, v in r.items() if k != "other_object_iou"} for r in base + top]
    row = SweepResult(pd.DataFrame(old, columns=RECORD_COLUMNS), conditions, 0.5).summary().iloc[1]
    assert row["mislocation_rate"] == 0.5 and np.isnan(row["other_object_rate"]) and np.isnan(row["no_object_rate"])
    # reproduce's failure split counts the same records with the same helper, control sets pooled per k
    from vrh_interp.experiments.reproduce import failure_split

    conditions.append(Condition("random", 1, 0, HeadSet([Head(0, 1)])))
    frame = pd.DataFrame(base + top + _records("random", 1, 0, [True, True, False, True]), columns=RECORD_COLUMNS)
    split = failure_split(SweepResult(frame, conditions, 0.5)).set_index("key")
    assert split.loc["top:k=1", ["n", "correct", "parse_failure", "mislocation", "other_object", "no_object"]] \
        .tolist() == [4, 1, 1, 2, 1, 1]
    assert split.loc["random:k=1:seed=all", ["n", "correct", "mislocation"]].tolist() == [4, 3, 1]
    assert split.loc["top:k=1", "other_object_rate"] == 0.25


def test_the_baseline_stays_zero_kind_under_every_ablation():
    g = HeadGeometry(2, 4, 4, 8)
    ranking = HeadSet([Head(1, 0), Head(0, 2), Head(1, 3)])
    for kind in ("mean", "resample"):
        conditions = sweep_conditions(ranking, g, [0, 1], [0, 1], ablation=kind)
        assert conditions[0].key == "baseline:k=0" and conditions[0].ablation == "zero"
        assert {c.ablation for c in conditions[1:]} == {kind}
        assert all(c.key.endswith(f":ablation={kind}") for c in conditions[1:])


# --------------------------------------------------------------------------------- records and run folders
def test_summary_is_recomputed_from_records_and_manifest(tmp_path):
    vlm = tiny_vlm("qwen2_vl")
    samples = synthetic_samples("eval", 3)
    result = sweep(vlm, samples, vlm.geometry.all_heads(), ks="0,12.5%,2", random_seeds=(0, 1, 2),
                   batch_size=3, max_new_tokens=3, run_dir=tmp_path, progress=False)
    summary = result.summary()
    pd.testing.assert_frame_equal(sweep_from_run(tmp_path).summary(), summary)
    assert set(summary["k"]) == {0, 1, 2} and set(summary["k_fraction"]) == {0.0, 1 / 8, 2 / 8}
    # by hand from the files: one record per (sample, condition), heads from the manifest
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "sweep_records.jsonl").read_text().splitlines()]
    assert len(records) == 3 * (1 + 2 * (1 + 3 + 3))
    for key, heads in manifest["conditions"].items():
        row = summary.set_index("key").loc[key]
        mine = [r for r in records if r["condition"] == key]
        assert row["accuracy"] == sum(r["iou"] >= 0.5 for r in mine) / 3
        cond = next(c for c in result.conditions if c.key == key)
        assert cond.heads.to_list() == heads
    for k in (1, 2):
        top = sum(r["iou"] >= 0.5 for r in records if r["condition"] == f"top:k={k}") / 3
        for kind in ("random", "matched"):
            sets = [sum(r["iou"] >= 0.5 for r in records if r["condition"] == f"{kind}:k={k}:seed={s}") / 3
                    for s in range(3)]
            expected = (1 + sum(a <= top for a in sets)) / 4
            assert summary.set_index("key").loc[f"top:k={k}", f"p_vs_{kind}"] == pytest.approx(expected)


def test_conditions_masking_the_same_heads_are_answered_once(monkeypatch):
    vlm = tiny_vlm("qwen2_vl")
    samples = synthetic_samples("eval", 2)
    heads = HeadSet([Head(1, 2)])
    conditions = [Condition("baseline", 0, None, HeadSet()), Condition("top", 1, None, heads),
                  Condition("random", 1, 0, heads), Condition("random", 1, 1, HeadSet([Head(0, 3)]))]
    calls = []
    real = sweep_module.ground_conditions

    def counted(vlm, chunk, masks, **kwargs):
        calls.extend(h for h, _ in masks)
        return real(vlm, chunk, masks, **kwargs)

    monkeypatch.setattr(sweep_module, "ground_conditions", counted)
    for rows in (None, 1):  # conditions batched in one generation, and one condition per generation
        calls.clear()
        result = run_conditions(vlm, samples, conditions, max_new_tokens=3, progress=False, max_batch_rows=rows)
        assert calls == [HeadSet(), heads, HeadSet([Head(0, 3)])]  # random:k=1:seed=0 copies top:k=1
    records = result.records.set_index(["condition", "sample_id"])
    for sample in samples:
        copied = records.loc[("random:k=1:seed=0", sample.sample_id)]
        computed = records.loc[("top:k=1", sample.sample_id)]
        assert copied[["answer", "iou", "other_object_iou"]].equals(computed[["answer", "iou", "other_object_iou"]])


def test_design_space_variants_are_compared_with_the_random_sets_at_their_k():
    from vrh_interp.experiments.design_space import DesignSpacePlan, design_space_table

    # two variants sharing one top-1 set, one with its own; 20 random sets of 1 head, 4 of them as harmful as
    # variant0 (accuracy 0.2), none as harmful as variant1 (0.0); 5 samples, all correct unmasked
    conditions = [Condition("baseline", 0, None, HeadSet()), Condition("variant0", 1, None, HeadSet([Head(0, 0)])),
                  Condition("variant1", 1, None, HeadSet([Head(1, 1)]))]
    conditions += [Condition("random", 1, seed, HeadSet()) for seed in range(20)]
    hits = {"baseline:k=0": 5, "variant0:k=1": 1, "variant1:k=1": 0}
    for c in conditions[3:]:
        hits[c.key] = 1 if c.seed < 4 else 4
    records = [r for c in conditions for r in _records(c.kind, c.k, c.seed, _correct(5, hits[c.key]))]
    result = SweepResult(pd.DataFrame(records, columns=RECORD_COLUMNS), conditions, 0.5)
    plan = DesignSpacePlan(1, conditions, {"a": HeadSet([Head(0, 0)]), "b": HeadSet([Head(0, 0)]),
                                           "c": HeadSet([Head(1, 1)])},
                           {"a": "variant0:k=1", "b": "variant0:k=1", "c": "variant1:k=1"}, [])
    table = design_space_table(plan, result).set_index("variant")
    assert table.loc["a", "p_vs_random"] == table.loc["b", "p_vs_random"] == pytest.approx(5 / 21)
    assert table.loc["c", "p_vs_random"] == pytest.approx(1 / 21)
    assert table.loc["c", "random_mean_accuracy"] == pytest.approx((4 * 0.2 + 16 * 0.8) / 20)
    assert table.loc["c", "random_sets"] == 20 and list(table.index)[0] == "c"  # ranked by drop


def test_demo_restrict_keeps_exactly_the_records_asked_for():
    from vrh_interp.experiments.sweep import restrict

    items = list(range(502))
    subset = check_subset(items, 50)
    assert (len(set(subset)) == 50 and subset[0] == 0 and subset[-1] >= 490
            and check_subset(items[:10], 50) == items[:10])
    # restricting a result to some samples and conditions keeps exactly their records, baseline included
    conditions = [Condition("baseline", 0, None, HeadSet()), Condition("top", 1, None, HeadSet()),
                  Condition("top", 2, None, HeadSet())]
    frame = pd.DataFrame(_records("baseline", 0, None, [True] * 4) + _records("top", 1, None, [True, False] * 2)
                         + _records("top", 2, None, [False] * 4), columns=RECORD_COLUMNS)
    part = restrict(SweepResult(frame, conditions, 0.5), ["s1", "s3"], lambda c: c.k == 1)
    assert [c.key for c in part.conditions] == ["baseline:k=0", "top:k=1"]
    assert part.summary().set_index("key")["accuracy"].to_dict() == {"baseline:k=0": 1.0, "top:k=1": 0.0}


def test_sweep_conditions_refuse_a_k_longer_than_the_ranking():
    """ranking[:k] of a 2-head ranking at k=3 would mask 2 heads under the label top:k=3: refused, naming the k."""
    geometry = HeadGeometry(4, 8, 8, 16)
    ranking = HeadSet([Head(2, 0), Head(3, 1)])
    with pytest.raises(ValueError, match=r"k values \[3\] exceed the ranking's 2 heads"):
        sweep_conditions(ranking, geometry, [0, 3], [0])
    conditions = sweep_conditions(ranking, geometry, [0, 2], [0])
    assert [len(c.heads) for c in conditions if c.kind == "top"] == [2]
