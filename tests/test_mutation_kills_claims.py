"""Tests written to kill surviving mutants of the claims module (``evaluation/claims.py``, docs/testing.md).

Every expected value is worked out by hand in the comments (bootstrap p-values as counts of replicates, Holm's
step-down products, the items-needed formula) or by a plain loop over the same random draws; none is read back
from the code under test.
"""

from __future__ import annotations

import math
from statistics import NormalDist, pstdev

import numpy as np
import pandas as pd
import pytest

from vrh_interp.evaluation.claims import (ALPHA, CLAIMS, MIN_INFORMATIVE, POWER, ClaimSpec, Evidence, claims_text,
                                          decide, holm, item_weights, items_needed, judge, mean_evidence, set_effect,
                                          smallest, statistic_evidence)

SPEC = ClaimSpec("t", "paper", "words", "theta", 0.1, 0.3, unit="samples")


def reps(*groups: tuple[int, float]) -> np.ndarray:
    """Replicates given as (count, value) groups."""
    return np.concatenate([np.full(count, value, dtype=float) for count, value in groups])


# ------------------------------------------------------------------ the declared claims
def test_rule_text_and_the_declared_claims() -> None:
    assert SPEC.rule() == ("holds: theta > 0.1 significant (Holm, alpha 0.05) and >= 0.3; does not hold: bounded "
                           "below 0.3; otherwise inconclusive")
    assert list(CLAIMS) == ["causal", "causal_curve", "sparse", "design_space", "specific", "stable", "shared", "vqa",
                            "positive_control", "transfer_control", "ablation_kinds", "score_damage"]
    assert all(spec.id == key for key, spec in CLAIMS.items())
    assert (ALPHA, MIN_INFORMATIVE, POWER) == (0.05, 20, 0.8)


# ------------------------------------------------------------------ Evidence
def test_categorical_evidence() -> None:
    ev = Evidence.categorical("holds", "3 of 3 scenes")
    assert (ev.verdict, ev.numbers, ev.reason, ev.n, ev.replicates) == ("holds", "3 of 3 scenes", "", 0, None)
    assert math.isnan(ev.estimate)
    assert Evidence.categorical("not measured", "", "why").reason == "why"
    with pytest.raises(ValueError, match="unknown verdict 'yes'"):
        Evidence.categorical("yes", "")


def test_interval_and_one_sided_p_by_counting() -> None:
    ev = Evidence(50.0, np.arange(101, dtype=float), 30)
    assert ev.interval() == pytest.approx((5.0, 95.0))  # 5 % and 95 % of 0..100
    assert ev.interval(0.5) == pytest.approx((25.0, 75.0))
    five = Evidence(2.0, np.array([0.0, 1.0, 2.0, 3.0, 4.0]), 30)
    assert five.p_above(2.0) == pytest.approx(4 / 6)  # (1 + #{<= 2} = 3) / (1 + 5)
    assert five.p_above(2.5) == pytest.approx(4 / 6)
    assert five.p_above(1.5) == pytest.approx(3 / 6)
    assert five.p_below(2.0) == pytest.approx(4 / 6)  # (1 + #{>= 2} = 3) / 6
    assert five.p_below(2.5) == pytest.approx(3 / 6)
    assert five.p_below(-1.0) == pytest.approx(1.0) and five.p_above(-1.0) == pytest.approx(1 / 6)
    for ev in (Evidence(1.0, None, 30), Evidence(1.0, np.array([]), 30), Evidence(float("nan"), np.ones(3), 30),
               Evidence(float("inf"), np.ones(3), 30)):
        assert math.isnan(ev.p_above(0.0)) and math.isnan(ev.p_below(0.0))
    for ev in (Evidence(1.0, None, 30), Evidence(1.0, np.array([]), 30)):
        assert all(math.isnan(x) for x in ev.interval())


# ------------------------------------------------------------------ Holm
def test_holm_edge_cases_by_hand() -> None:
    assert holm([float("nan"), 0.2, 0.01]) == [pytest.approx(x, nan_ok=True) for x in (float("nan"), 0.2, 0.02)]
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # 1.2 and 0.7 capped at 1, then the running maximum
    assert holm([0.3]) == [0.3]
    assert holm([0.02, 0.02, 0.5]) == pytest.approx([0.06, 0.06, 0.5])  # ties: 0.06, max(0.06, 0.04), 0.5
    assert holm([]) == []


# ------------------------------------------------------------------ items needed
Z = {0.05: 1.6448536269514722, 0.01: 2.3263478740408408}  # one-sided normal quantiles
Z_POWER = 0.8416212335729143  # the 80 % quantile


def test_items_needed_by_the_formula() -> None:
    spec = ClaimSpec("t", "paper", "w", "s", 0.0, 0.05)
    replicates = np.array([0.1, 0.3])  # spread (population sd) 0.1
    # at least the minimum: distance to null (0.2); 40 * (2.4865 * 0.1 / 0.2)^2 = 61.83 -> 62
    assert items_needed(spec, Evidence(0.2, replicates, 40), 0.05) == math.ceil(
        40 * ((Z[0.05] + Z_POWER) * 0.1 / 0.2) ** 2) == 62
    # below the minimum: distance to the minimum (0.05 - 0.03 = 0.02): 1545.6 -> 1546
    assert items_needed(spec, Evidence(0.03, replicates, 10), 0.05) == math.ceil(
        10 * ((Z[0.05] + Z_POWER) * 0.1 / 0.02) ** 2) == 1546
    # alpha 0.01, estimate exactly at the minimum: distance to null (0.05)
    assert items_needed(spec, Evidence(0.05, replicates, 7), 0.01) == math.ceil(
        7 * ((Z[0.01] + Z_POWER) * 0.1 / 0.05) ** 2) == 282  # 281.01
    # the MIN_INFORMATIVE floor: the formula's 16 (10 items) or 2 (1 item) would not reach 20 informative items
    assert items_needed(spec, Evidence(0.2, replicates, 10), 0.05) == MIN_INFORMATIVE == 20
    assert items_needed(spec, Evidence(0.2, replicates, 1), 0.05) == 20
    # 18 informative of 40 items: the floor is 40 * 20 / 18 = 44.4 -> 45 items, below the formula's 62
    assert items_needed(spec, Evidence(0.2, replicates, 40, informative=18), 0.05) == 62
    # 9 informative of 40: the floor 40 * 20 / 9 = 88.9 -> 89 wins over the formula's 62
    assert items_needed(spec, Evidence(0.2, replicates, 40, informative=9), 0.05) == 89
    assert items_needed(spec, Evidence(0.2, replicates, 40, informative=0), 0.05) is None
    assert items_needed(ClaimSpec("t", "paper", "w", "s", 0.0, 0.0), Evidence(0.0, replicates, 10), 0.05) is None
    for ev in (Evidence(0.2, np.array([0.2, 0.2]), 10),  # no spread
               Evidence(0.2, replicates, 0), Evidence(0.2, replicates, -1), Evidence(0.2, None, 10),
               Evidence(float("nan"), replicates, 10)):
        assert items_needed(spec, ev, 0.05) is None
    at_null = ClaimSpec("t", "paper", "w", "s", 0.0, 0.0)
    assert items_needed(at_null, Evidence(1e-12, replicates, 10), 0.05) is None  # a distance of 1e-12 is none
    close = ClaimSpec("t", "paper", "w", "s", 0.0, 0.5)
    assert items_needed(close, Evidence(0.5 - 1e-13, replicates, 10), 0.05) is None
    assert items_needed(close, Evidence(0.5 - 1e-11, replicates, 10), 0.05) > 10 ** 15


# ------------------------------------------------------------------ decide
def test_decide_every_branch_with_its_reason() -> None:
    spec = SPEC  # null 0.1, minimum 0.3
    strong = reps((99, 0.5))  # p_above(0.1) = 1/100; p_below(0.3) = 100/100
    assert decide(spec, Evidence.categorical("does not hold", "n", "given")) == ("does not hold", "given")
    assert decide(spec, Evidence(float("nan"), strong, 50)) == ("inconclusive", "no estimate")
    assert decide(spec, Evidence(0.5, None, 50)) == ("inconclusive", "no estimate")
    few = ("inconclusive", "only 19 informative samples (outcomes that differ between the conditions): a decisive "
           "verdict needs 20")
    assert decide(spec, Evidence(0.5, strong, 19)) == few
    assert decide(spec, Evidence(0.5, strong, 50, informative=19)) == few
    assert decide(spec, Evidence(0.5, strong, 19, informative=50)) == few  # the smaller of n and informative
    assert decide(spec, Evidence(0.5, strong, 20)) == ("holds", "significant (p=0.01) and 0.5 >= 0.3")
    assert decide(spec, Evidence(0.5, strong, 50, informative=20))[0] == "holds"
    # explicit (adjusted) p-values: strict < alpha; an estimate exactly at the minimum holds
    assert decide(spec, Evidence(0.3, strong, 50), p_holds=0.049, p_fails=1.0) == (
        "holds", "significant (p=0.049) and 0.3 >= 0.3")
    assert decide(spec, Evidence(0.3, strong, 50), p_holds=0.05, p_fails=1.0)[0] == "inconclusive"
    assert decide(spec, Evidence(0.3, strong, 50), p_holds=0.05, p_fails=1.0, alpha_holds=0.051)[0] == "holds"
    assert decide(spec, Evidence(0.2, strong, 50), p_holds=0.5, p_fails=0.01) == (
        "does not hold", "bounded below 0.3 (p=0.01)")
    assert decide(spec, Evidence(0.2, strong, 50), p_holds=0.5, p_fails=0.05)[0] == "inconclusive"
    assert decide(spec, Evidence(0.2, strong, 50), p_holds=0.01, p_fails=0.2) == (
        "inconclusive", "significant (p=0.01) but 0.2 < 0.3 and not bounded below it (p=0.2)")
    assert decide(spec, Evidence(0.2, strong, 50), p_holds=0.05, p_fails=0.3) == (
        "inconclusive", "neither significant (p=0.05) nor bounded below 0.3 (p=0.3)")
    assert decide(spec, Evidence(0.2, strong, 50), p_holds=0.2, p_fails=0.3) == (
        "inconclusive", "neither significant (p=0.2) nor bounded below 0.3 (p=0.3)")
    # raw bootstrap p-values when none are given: 5 of 99 replicates at or below the null 0.1 -> p = 6/100;
    # 2 at or above the minimum -> p = 3/100
    mixed = reps((5, 0.05), (92, 0.2), (2, 0.4))
    assert decide(spec, Evidence(0.2, mixed, 50)) == ("does not hold", "bounded below 0.3 (p=0.03)")
    assert decide(spec, Evidence(0.2, mixed, 50), alpha_holds=0.07)[0] == "does not hold"
    assert decide(spec, Evidence(0.35, mixed, 50), alpha_holds=0.07)[0] == "holds"  # p_holds 0.06 < 0.07


# ------------------------------------------------------------------ judge
def _paper_evidence() -> dict:
    return {
        # causal (null 0, min 0.05): p_holds 1/100, p_fails 100/100
        "causal": Evidence(0.3, reps((99, 0.3)), 50, "causal numbers"),
        "causal_curve": None,
        # sparse (null 0.1, min 0.3): 4 of 99 at or below 0.1 -> 5/100; 30 at or above 0.3 -> 31/100
        "sparse": Evidence(0.2, reps((4, 0.05), (65, 0.2), (30, 0.35)), 500, "sparse numbers"),
        # specific (null 0, min 0.05): 9 at or below 0 -> 10/100; none at or above 0.05 -> 1/100
        "specific": Evidence(0.02, reps((9, -0.01), (90, 0.02)), 50),
        "stable": Evidence.categorical("holds", "stable numbers", "decided elsewhere"),
        "vqa": None,
    }


def test_judge_a_paper_table_by_hand() -> None:
    table = judge(_paper_evidence()).set_index("id")
    assert list(table.index) == ["causal", "causal_curve", "sparse", "specific", "stable", "vqa"]  # declared order
    assert set(table.columns) == {"table", "claim", "verdict", "estimate", "ci_low", "ci_high", "null", "minimum", "p",
                                  "p_adjusted", "n", "items_needed", "reason", "numbers", "rule"}
    assert table.loc["causal_curve", "verdict"] == "not measured"
    assert set(table["table"]) == {"paper"}
    # Holm, holds: raw [0.01, 0.05, 0.10] -> 0.03, max(0.03, 0.10), max(0.10, 0.10)
    assert table.loc[["causal", "sparse", "specific"], "p"].tolist() == pytest.approx([0.01, 0.05, 0.10])
    assert table.loc[["causal", "sparse", "specific"], "p_adjusted"].tolist() == pytest.approx([0.03, 0.10, 0.10])
    # Holm, fails: raw [1.00, 0.31, 0.01] -> specific 0.03, sparse 0.62, causal 1
    assert table.loc["causal", "verdict"] == "holds"
    assert table.loc["causal", "reason"] == "significant (p=0.03) and 0.3 >= 0.05"
    assert table.loc["specific", "verdict"] == "does not hold"
    assert table.loc["specific", "reason"] == "bounded below 0.05 (p=0.03)"
    assert table.loc["sparse", "verdict"] == "inconclusive"
    sparse = _paper_evidence()["sparse"].replicates
    z = NormalDist().inv_cdf(1 - 0.05 / 3) + NormalDist().inv_cdf(0.8)  # alpha over the 3 tested claims
    needed = math.ceil(500 * (z * pstdev(sparse.tolist()) / 0.1) ** 2)  # distance to the minimum 0.3
    assert table.loc["sparse", "items_needed"] == needed
    assert table.loc["sparse", "reason"] == (f"neither significant (p=0.1) nor bounded below 0.3 (p=0.62); about "
                                             f"{needed:,} detection samples would likely decide it")
    assert needed > 1000  # the thousands separator is part of the text
    assert pd.isna(table.loc["causal", "items_needed"]) and pd.isna(table.loc["specific", "items_needed"])
    assert table.loc["causal", "numbers"] == "causal numbers" and table.loc["sparse", "n"] == 500
    assert (table.loc["sparse", "ci_low"], table.loc["sparse", "ci_high"]) == (0.2, 0.35)  # 5 % / 95 % of 99
    assert table.loc["sparse", "null"] == 0.1 and table.loc["sparse", "minimum"] == 0.3
    assert table.loc["sparse", "estimate"] == 0.2 and table.loc["sparse", "claim"] == CLAIMS["sparse"].claim
    assert table.loc["sparse", "rule"] == CLAIMS["sparse"].rule()
    stable = table.loc["stable"]
    assert (stable["verdict"], stable["reason"], stable["numbers"], stable["n"]) == (
        "holds", "decided elsewhere", "stable numbers", 0)
    assert math.isnan(stable["p"]) and math.isnan(stable["p_adjusted"]) and pd.isna(stable["items_needed"])
    assert set(judge({"vqa": None}).columns) == set(table.columns) | {"id"}  # every column, even with no evidence
    vqa = table.loc["vqa"]
    assert (vqa["verdict"], vqa["reason"], vqa["numbers"], vqa["n"]) == ("not measured", "not measured", "", 0)
    assert all(math.isnan(vqa[c]) for c in ("estimate", "ci_low", "ci_high", "p", "p_adjusted"))
    assert pd.isna(vqa["items_needed"])
    # alpha 0.11: sparse's adjusted 0.10 is significant, but its estimate 0.2 is below the minimum 0.3
    loose = judge(_paper_evidence(), alpha=0.11).set_index("id")
    assert loose.loc["sparse", "verdict"] == "inconclusive" and "significant (p=0.1) but 0.2 < 0.3" in \
        loose.loc["sparse", "reason"]


def test_judge_adjusts_per_table_and_at_the_threshold() -> None:
    specs = {"a": ClaimSpec("a", "paper", "A", "s", 0.0, 0.0), "m": ClaimSpec("m", "method", "M", "s", 0.0, 0.5),
             "b": ClaimSpec("b", "method", "B", "s", 0.0, 0.2)}
    evidence = {
        # estimate 0 at null = minimum 0: no distance, so no items; the estimate sits at its threshold
        "a": Evidence(0.0, reps((50, -0.1), (49, 0.1)), 50),
        # alone in its table? no: m and b share the method table -> m's p 0.02 is doubled to 0.04
        "m": Evidence(0.5, reps((1, -0.1), (98, 0.5)), 50),
        "b": Evidence(0.4, reps((2, -0.1), (97, 0.4)), 50),  # p 3/100: Holm 0.04 and max(0.04, 0.03)
    }
    table = judge(evidence, specs=specs).set_index("id")
    assert list(table["table"]) == ["paper", "method", "method"]
    assert table.loc["a", "verdict"] == "inconclusive" and pd.isna(table.loc["a", "items_needed"])
    assert table.loc["a", "reason"] == ("neither significant (p=0.51) nor bounded below 0 (p=0.5); the estimate "
                                        "sits at its threshold")  # 51/100 at or below 0, 50/100 at or above
    assert table.loc["m", "p"] == pytest.approx(0.02) and table.loc["m", "p_adjusted"] == pytest.approx(0.04)
    assert table.loc["m", "verdict"] == "holds" and table.loc["b", "verdict"] == "holds"
    assert table.loc["m", "reason"] == "significant (p=0.04) and 0.5 >= 0.5"  # at the minimum: no threshold note
    # no spread, so no items estimate: the threshold note only where the estimate is within 1e-9 of the minimum
    flat = {"x": ClaimSpec("x", "paper", "X", "s", 0.0, 0.5), "y": ClaimSpec("y", "paper", "Y", "s", 0.0, 0.5),
            "w": ClaimSpec("w", "paper", "W", "s", 0.0, 0.0)}
    # one replicate each (a spread of exactly 0; p-values 1/2, Holm-adjusted to 1)
    flat_evidence = {"x": Evidence(0.5, reps((1, 0.5)), 50), "y": Evidence(0.3, reps((1, 0.3)), 50),
                     "w": Evidence(1e-9, reps((1, 1e-9)), 50)}  # w: exactly 1e-9 from its minimum 0
    flat_table = judge(flat_evidence, specs=flat, alpha=0.05).set_index("id")
    assert set(flat_table["verdict"]) == {"inconclusive"} and flat_table["items_needed"].isna().all()
    assert flat_table.loc["x", "reason"].endswith("(p=1); the estimate sits at its threshold")
    assert flat_table.loc["y", "reason"] == "neither significant (p=1) nor bounded below 0.5 (p=1)"
    assert not flat_table.loc["w", "reason"].endswith("threshold")
    only_a = judge({"a": evidence["a"]}, specs=specs)
    assert only_a["p_adjusted"].tolist() == pytest.approx([0.51])  # one claim: not multiplied
    # one undecided claim: items needed at alpha / 1
    one = {"b": Evidence(0.1, reps((10, -0.05), (79, 0.1), (10, 0.25)), 40)}  # p 11/100 both ways
    row = judge(one, specs=specs).iloc[0]
    assert row["verdict"] == "inconclusive"
    spread = pstdev(one["b"].replicates.tolist())
    z = NormalDist().inv_cdf(0.95) + NormalDist().inv_cdf(0.8)
    assert row["items_needed"] == math.ceil(40 * (z * spread / 0.1) ** 2)
    assert judge({}, specs=specs).empty


# ------------------------------------------------------------------ the statistics
def test_item_weights_are_multinomial_counts_over_n() -> None:
    got = item_weights(4, 3, seed=7)
    draws = np.random.default_rng(7).integers(0, 4, size=(3, 4))
    want = np.array([[list(row).count(i) / 4 for i in range(4)] for row in draws])
    assert got.shape == (3, 4) and np.array_equal(got, want)
    assert item_weights(5).shape == (2000, 5)
    assert np.array_equal(item_weights(5, 10), item_weights(5, 10, seed=0))


def test_set_effect_refuses_mismatched_controls() -> None:
    weights = item_weights(3, 5)
    for controls in (np.ones(3), np.ones((2, 4)), np.ones((0, 3)), np.ones((1, 3, 1))):
        with pytest.raises(ValueError, match="controls must be \\(sets x 3\\), got"):
            set_effect([1, 0, 1], controls, weights)
    estimate, replicates = set_effect([1, 0, 1], [[1, 1, 1], [0, 1, 1]], weights)
    assert estimate == pytest.approx(5 / 6 - 2 / 3) and replicates.shape == (5,)
    # one control set: every replicate's sets are that set; the items are the weights' draws
    _, one = set_effect([1, 0, 0], [[1, 1, 0]], weights, seed=3)
    draws = np.random.default_rng(0).integers(0, 3, size=(5, 3))
    want = [np.mean([[1, 1, 0][i] for i in row]) - np.mean([[1, 0, 0][i] for i in row]) for row in draws]
    assert one == pytest.approx(want)
    _, two = set_effect([1, 0, 0], [[1, 1, 0], [0, 1, 1]], weights, seed=3)
    set_draws = np.random.default_rng(3).integers(0, 2, size=(5, 2))
    controls = [[1, 1, 0], [0, 1, 1]]
    want = [np.mean([[controls[s][i] for i in row] for s in sets]) - np.mean([[1, 0, 0][i] for i in row])
            for row, sets in zip(draws, set_draws)]
    assert two == pytest.approx(want)
    _, default_seed = set_effect([1, 0, 1], [[1, 1, 1], [0, 1, 1]], weights)
    _, seed_zero = set_effect([1, 0, 1], [[1, 1, 1], [0, 1, 1]], weights, seed=0)
    assert np.array_equal(default_seed, seed_zero)


def test_mean_evidence_by_loops() -> None:
    values = [0.0, 0.0, 0.0, 1.0, -1.0, 0.0]
    ev = mean_evidence(values, numbers="n", resamples=4, seed=2, informative_changes=True)
    assert (ev.estimate, ev.n, ev.numbers, ev.informative) == (0.0, 6, "n", 2)  # 2 values differ from the median
    draws = np.random.default_rng(2).integers(0, 6, size=(4, 6))
    assert ev.replicates == pytest.approx([np.mean([values[i] for i in row]) for row in draws])
    plain = mean_evidence([1.0, 2.0, 4.0])
    assert plain.informative is None and plain.estimate == pytest.approx(7 / 3) and len(plain.replicates) == 2000
    assert plain.numbers == "" and np.array_equal(plain.replicates, mean_evidence([1.0, 2.0, 4.0], seed=0).replicates)
    empty = mean_evidence([], numbers="none")
    assert math.isnan(empty.estimate) and empty.replicates is None and empty.n == 0 and empty.numbers == "none"


def test_statistic_evidence_by_loops() -> None:
    data = np.array([3.0, 1.0, 4.0, 1.0, 5.0])

    def stat(idx: np.ndarray) -> float:
        picked = data[idx]
        return float("nan") if picked.max() == 5.0 else float(picked.mean())

    ev = statistic_evidence(lambda idx: float(data[idx].mean()), 5, numbers="s", resamples=6, seed=4)
    rng = np.random.default_rng(4)
    want = [data[rng.integers(0, 5, size=5)].mean() for _ in range(6)]
    assert (ev.estimate, ev.n, ev.numbers) == (pytest.approx(2.8), 5, "s")
    assert ev.replicates == pytest.approx(want)
    dropped = statistic_evidence(stat, 5, resamples=40, seed=1)
    rng = np.random.default_rng(1)
    kept = [v for v in (stat(rng.integers(0, 5, size=5)) for _ in range(40)) if np.isfinite(v)]
    assert math.isnan(dropped.estimate) and dropped.replicates == pytest.approx(kept) and 0 < len(kept) < 40
    assert len(statistic_evidence(lambda idx: 1.0, 3).replicates) == 500
    assert statistic_evidence(lambda idx: float(np.sum(idx)), 5, resamples=2).estimate == 10.0  # 0 + 1 + ... + 4
    default = statistic_evidence(lambda idx: float(data[idx].mean()), 5, resamples=3)
    rng = np.random.default_rng(0)
    assert default.replicates == pytest.approx([data[rng.integers(0, 5, size=5)].mean() for _ in range(3)])
    assert default.numbers == ""


def test_smallest_takes_the_minimum_replicate_by_replicate() -> None:
    parts = {"uniform": (0.3, np.array([0.1, 0.5, 0.2])), "matched": (0.2, np.array([0.4, 0.3, 0.6]))}
    ev = smallest(parts, 40, "nums", informative=25)
    assert ev.estimate == 0.2 and ev.replicates.tolist() == [0.1, 0.3, 0.2]
    assert (ev.n, ev.numbers, ev.informative, ev.extra) == (40, "nums", 25, {"parts": {"uniform": 0.3,
                                                                                      "matched": 0.2}})
    assert smallest(parts, 40).informative is None and smallest(parts, 40).numbers == ""
    empty = smallest({}, 7, "x")
    assert math.isnan(empty.estimate) and empty.replicates is None and (empty.n, empty.numbers) == (7, "x")


# ------------------------------------------------------------------ the text
def test_claims_text_layout() -> None:
    table = pd.DataFrame([
        {"table": "method", "verdict": "holds", "claim": "method claim", "reason": "why", "numbers": ""},
        {"table": "paper", "verdict": "does not hold", "claim": "a paper claim about intersection-union tests here",
         "reason": "because", "numbers": "n=3"},
    ])
    want = ("The paper's claims:\n"
            "  DOES NOT HOLD  a paper claim about intersection-union\n"
            "                 tests here\n"
            "                 because; n=3\n"
            "Checks of the method:\n"
            "          HOLDS  method claim\n"
            "                 why")
    assert claims_text(table, width=56) == want
    assert claims_text(table[table["table"] == "method"]) == ("Checks of the method:\n          HOLDS  method claim\n"
                                                               "                 why")
    # a hyphenated word is not split at its hyphen, in the claim or in the reason
    assert claims_text(table, width=52).splitlines()[1:3] == ["  DOES NOT HOLD  a paper claim about",
                                                              "                 intersection-union tests here"]
    hyphens = pd.DataFrame([{"table": "paper", "verdict": "holds", "claim": "c", "reason": "aaaa well-known",
                             "numbers": ""}])
    assert claims_text(hyphens, width=30).splitlines()[2:] == [" " * 17 + "aaaa", " " * 17 + "well-known"]
    # a table without a "table" column is listed under both headings
    plain = table.drop(columns="table")
    assert claims_text(plain).count("method claim") == 2 and "Checks of the method:" in claims_text(plain)
    # the default width is 100: a 101-character line is wrapped
    fits = pd.DataFrame([{"table": "paper", "verdict": "holds", "claim": "c", "reason": "a" * 40 + " " + "b" * 42,
                          "numbers": ""}])
    assert len(claims_text(fits).splitlines()) == 3 and claims_text(fits).splitlines()[2].endswith("b" * 42)
    fits.loc[0, "reason"] += "b"
    assert claims_text(fits).splitlines()[3] == " " * 17 + "b" * 43
    long = pd.DataFrame([{"table": "paper", "verdict": "holds", "claim": "c" * 10, "reason": "r " * 60,
                          "numbers": None}])
    assert claims_text(long).splitlines()[2:] == [" " * 17 + "r " * 41 + "r", " " * 17 + "r " * 17 + "r"]
