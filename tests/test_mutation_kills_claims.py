"""Tests written to kill surviving mutants of the claims module's helpers (``evaluation/claims.py``, docs/testing.md;
the rules themselves: tests/test_claims.py).

Every expected value is worked out by hand in the comments (bootstrap p-values as counts of replicates, Holm's
step-down products, the items-needed formula) or by a plain loop over the same random draws; none is read back
from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from vrh_interp.evaluation.claims import (ClaimSpec, Evidence, claims_text, holm, item_weights, mean_evidence,
                                          statistic_evidence)

SPEC = ClaimSpec("t", "paper", "words", "theta", 0.1, 0.3, unit="samples")


def reps(*groups: tuple[int, float]) -> np.ndarray:
    """Replicates given as (count, value) groups."""
    return np.concatenate([np.full(count, value, dtype=float) for count, value in groups])


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
    # NaN (not tested) stays NaN but counts in the family as p = 1: m = 3, so 0.01 x 3 and 0.2 x 2
    assert holm([float("nan"), 0.2, 0.01]) == [pytest.approx(x, nan_ok=True) for x in (float("nan"), 0.4, 0.03)]
    # a fixed family larger than the values given: two declared claims not in the table count too
    assert holm([0.01, 0.02], family=4) == pytest.approx([0.04, 0.06])
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # 1.2 and 0.7 capped at 1, then the running maximum
    assert holm([0.3]) == [0.3]
    assert holm([0.02, 0.02, 0.5]) == pytest.approx([0.06, 0.06, 0.5])  # ties: 0.06, max(0.06, 0.04), 0.5
    assert holm([]) == []


# ------------------------------------------------------------------ the statistics
def test_item_weights_are_multinomial_counts_over_n() -> None:
    got = item_weights(4, 3, seed=7)
    draws = np.random.default_rng(7).integers(0, 4, size=(3, 4))
    want = np.array([[list(row).count(i) / 4 for i in range(4)] for row in draws])
    assert got.shape == (3, 4) and np.array_equal(got, want)
    assert item_weights(5).shape == (2000, 5)
    assert np.array_equal(item_weights(5, 10), item_weights(5, 10, seed=0))


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
