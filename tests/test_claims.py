"""The claims module's rules: three outcomes that mean what they say, Holm, and the statistics against references.

Each rule is fed a small, undecided outcome table and must say "inconclusive" (never "does not hold"); large clear
tables must decide both ways; the bootstrap statistics are checked against plain-loop re-implementations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from vrh_interp.core.heads import HeadSet
from vrh_interp.evaluation import claims
from vrh_interp.evaluation.claims import CLAIMS, Evidence, decide, holm, item_weights, judge, set_effect
from vrh_interp.experiments import verdicts
from vrh_interp.experiments.sweep import Condition


def test_holm_matches_the_step_down_procedure_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> running max 0.06)
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert np.isnan(holm([float("nan"), 0.2])[0]) and holm([float("nan"), 0.2])[1] == pytest.approx(0.2)


def test_set_effect_equals_a_plain_two_level_bootstrap():
    rng = np.random.default_rng(3)
    top = (rng.random(30) < 0.4).astype(float)
    controls = (rng.random((7, 30)) < 0.7).astype(float)
    weights = item_weights(30, 300, seed=5)
    estimate, replicates = set_effect(top, controls, weights, seed=9)
    assert estimate == pytest.approx(controls.mean() - top.mean())
    # reference: the same draws, one replicate at a time with explicit index lists
    draws = np.random.default_rng(5).integers(0, 30, size=(300, 30))
    set_draws = np.random.default_rng(9).integers(0, 7, size=(300, 7))
    expected = [controls[set_draws[b]][:, draws[b]].mean() - top[draws[b]].mean() for b in range(300)]
    assert replicates == pytest.approx(expected)


def _sweep_records(n: int, top_rate: float, control_rate: float, sets: int = 20, seed: int = 0,
                   kinds=("random", "matched", "live")) -> tuple[pd.DataFrame, list[Condition]]:
    rng = np.random.default_rng(seed)
    conditions = [Condition("baseline", 0, None, HeadSet()), Condition("top", 3, None, HeadSet())]
    conditions += [Condition(kind, 3, s, HeadSet()) for kind in kinds for s in range(sets)]
    rows = []
    for cond in conditions:
        rate = top_rate if cond.kind == "top" else control_rate if cond.kind != "baseline" else 0.9
        for i in range(n):
            hit = rng.random() < rate
            rows.append({"sample_id": f"s{i}", "condition": cond.key, "iou": 1.0 if hit else 0.0,
                         "parsed": True, "box": [0, 0, 1, 1]})
    return pd.DataFrame(rows), conditions


def test_small_undecided_causal_table_is_inconclusive_never_does_not_hold():
    records, conditions = _sweep_records(n=12, top_rate=0.7, control_rate=0.75)
    table = judge({"causal": verdicts.causal_evidence(records, conditions, 3)})
    row = table.iloc[0]
    assert row["verdict"] == "inconclusive", row["reason"]
    assert row["items_needed"] is None or row["items_needed"] > 12


def test_large_clear_tables_decide_both_ways():
    records, conditions = _sweep_records(n=400, top_rate=0.2, control_rate=0.8, seed=1)
    assert judge({"causal": verdicts.causal_evidence(records, conditions, 3)}).iloc[0]["verdict"] == "holds"
    records, conditions = _sweep_records(n=2000, top_rate=0.8, control_rate=0.8, seed=2)
    row = judge({"causal": verdicts.causal_evidence(records, conditions, 3)}).iloc[0]
    assert row["verdict"] == "does not hold", row["reason"]


def test_significant_but_below_the_minimum_is_inconclusive():
    spec = CLAIMS["causal"]
    replicates = np.random.default_rng(0).normal(0.03, 0.01, 2000)  # clearly > 0, not clearly < 0.05 ... or is it
    verdict, reason = decide(spec, Evidence(0.03, replicates, 100))
    # 0.05 lies two sds above 0.03: one-sided p ~ 0.02 < 0.05, so it IS bounded below the minimum
    assert verdict == "does not hold"
    verdict, reason = decide(spec, Evidence(0.04, np.random.default_rng(0).normal(0.04, 0.01, 2000), 100))
    assert verdict == "inconclusive" and "significant" in reason


def test_every_rule_says_inconclusive_on_a_small_undecided_table():
    records, conditions = _sweep_records(n=10, top_rate=0.6, control_rate=0.65, seed=4)
    records.loc[records.index[::7], "parsed"] = False
    evidence = {
        "causal": verdicts.causal_evidence(records, conditions, 3),
        "specific": verdicts.specificity_evidence(records, 3),
        "score_damage": verdicts.score_damage_evidence([1, 2, 3, 4, 5], [0.1, -0.1, 0.2, 0.0, 0.1]),
        "design_space": verdicts.design_evidence(records, {"default": "top:k=3", "other": "random:k=3:seed=0"},
                                                 "default"),
    }
    table = judge(evidence)
    assert set(table["verdict"]) == {"inconclusive"}, table[["id", "verdict", "reason"]].to_string()


def test_ablation_kinds_agreeing_on_a_failure_is_not_support():
    failing = Evidence(0.0, np.zeros(2000) + np.random.default_rng(0).normal(0, 0.005, 2000), 500)
    agree = verdicts.kinds_agree({"zero": failing, "mean": failing, "resample": failing})
    assert agree.verdict == "does not hold"
    holding = Evidence(0.3, np.random.default_rng(1).normal(0.3, 0.02, 2000), 500)
    assert verdicts.kinds_agree({"zero": holding, "mean": holding, "resample": holding}).verdict == "holds"
    small = Evidence(0.03, np.random.default_rng(2).normal(0.03, 0.05, 2000), 20)
    assert verdicts.kinds_agree({"zero": holding, "mean": small}).verdict == "inconclusive"


def test_judge_adjusts_within_each_table_and_marks_missing_claims():
    strong = Evidence(0.3, np.random.default_rng(1).normal(0.3, 0.02, 2000), 500)
    table = judge({"causal": strong, "vqa": None, "score_damage": strong})
    assert list(table["table"]) == ["paper", "paper", "method"]
    assert table.set_index("id").loc["vqa", "verdict"] == "not measured"
    assert (table.set_index("id").loc[["causal", "score_damage"], "verdict"] == "holds").all()
    text = claims.claims_text(table)
    assert "The paper's claims" in text and "Checks of the method" in text


def test_every_declared_claim_states_its_rule():
    for spec in CLAIMS.values():
        assert spec.table in (claims.PAPER, claims.METHOD)
        assert spec.minimum >= spec.null
        assert "holds" in spec.rule()


def test_the_positive_control_claims_are_declared_and_about_the_control_scenes():
    """Generators that drop them from a run about another model (docs/_generate_seed_spread.py) read this set."""
    assert claims.POSITIVE_CONTROL_CLAIMS <= set(CLAIMS)
    assert {id for id, spec in CLAIMS.items() if spec.unit == "control scenes"} == claims.POSITIVE_CONTROL_CLAIMS
