"""Calibration of the verdict rules on simulated outcome tables whose truth is known.

A rule is calibrated when, fed tables simulated under a null, it says "holds" at most ``ALPHA`` of the time, and
under the alternatives it cares about it says "holds" often. This module simulates the tables and runs the
library's OWN rules on them (``claims.causal_test`` and ``claims.intersection``, as ``experiments.verdicts``
calls them; ``verdicts.sparse_evidence``; ``claims.judge`` for a whole table), so a change to a rule changes what
this measures. ``docs/_generate_calibration.py`` writes ``docs/results/calibration.md`` from it; the tests run
smaller versions.

The generative model of one causal table: n items, each right unmasked with probability ``base``; masking a set
of harm h makes a right item wrong with probability h / base (a negative h makes wrong items right), every
condition and item independently, so outcomes are paired through the unmasked answer. Control sets of a kind
draw their harm from a gamma distribution (mean ``set_harm``, sd ``spread``: skewed, as sets that happen to hit
an important head are). Under the noise-scorer null the top-k's harm is one more draw from it; under the others
it is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from vrh_interp.evaluation.claims import ALPHA, CLAIMS, causal_test, decide, intersection, judge

KINDS = ("random", "matched", "live")


@dataclass(frozen=True)
class Design:
    """How a causal claim is measured: ``sets`` control sets of each kind on all ``items`` (crossed), or with
    ``scene`` > 0 one fresh set of each kind per scene of ``scene`` items, on those items only (clustered,
    ``experiments.designs.scene_design``); ``rank_sets`` more on ``rank_items`` common items for the rank test (0:
    the rank test reads the crossed ``sets``), drawn sequentially in blocks (Besag-Clifford, stop after ``h`` sets
    at least as harmful), with ``curtail`` each set answered item by item only until its comparison with the
    top-k is decided (``designs.curtailed_rank``)."""

    name: str
    items: int
    sets: int
    rank_sets: int = 0
    rank_items: int = 12
    h: int = 5
    scene: int = 0
    curtail: bool = False


@dataclass(frozen=True)
class Scenario:
    """One kind of table: ``truth`` "null" or "alternative"; the top-k's harm is ``top_harm``, or a draw from the
    sets' distribution when None (the noise-scorer null)."""

    name: str
    truth: str
    base: float = 0.9
    set_harm: float = 0.02
    spread: float = 0.02
    top_harm: float | None = None
    note: str = ""


@dataclass
class Rate:
    """Verdict counts over runs, with the answers each run used."""

    runs: int = 0
    holds: int = 0
    fails: int = 0
    answers: list = field(default_factory=list)

    def upper(self, count: int | None = None) -> float:
        """One-sided 95 % upper bound of a rate (Clopper-Pearson)."""
        return clopper_pearson_upper(self.holds if count is None else count, self.runs)

    def lower(self) -> float:
        return clopper_pearson_lower(self.holds, self.runs)


def clopper_pearson_upper(successes: int, runs: int, level: float = 0.95) -> float:
    if runs == 0:
        return float("nan")
    if successes >= runs:
        return 1.0
    low, high = successes / runs, 1.0
    for _ in range(60):  # P(Binomial(runs, p) <= successes) = 1 - level
        mid = (low + high) / 2
        if _binom_cdf(successes, runs, mid) > 1 - level:
            low = mid
        else:
            high = mid
    return high


def clopper_pearson_lower(successes: int, runs: int, level: float = 0.95) -> float:
    if runs == 0 or successes == 0:
        return 0.0
    return 1 - clopper_pearson_upper(runs - successes, runs, level)


def _binom_cdf(k: int, n: int, p: float) -> float:
    from math import lgamma, log, exp

    if p <= 0:
        return 1.0
    if p >= 1:
        return 0.0 if k < n else 1.0
    return float(sum(exp(lgamma(n + 1) - lgamma(i + 1) - lgamma(n - i + 1) + i * log(p) + (n - i) * log(1 - p))
                     for i in range(k + 1)))


def _harms(rng: np.random.Generator, mean: float, sd: float, size: int) -> np.ndarray:
    if sd <= 0:
        return np.full(size, mean)
    if mean <= 0:  # a harm around a non-positive mean: normal
        return mean + sd * rng.standard_normal(size)
    shape = (mean / sd) ** 2
    return rng.gamma(shape, sd * sd / mean, size)


def _masked(rng: np.random.Generator, right: np.ndarray, harm: np.ndarray, base: float) -> np.ndarray:
    """(conditions x items) outcomes under the given harms, paired through ``right`` (the unmasked outcomes)."""
    harm = np.asarray(harm, dtype=float)[:, None]
    lose = np.clip(harm / base, 0.0, 1.0)
    gain = np.clip(-harm / (1 - base), 0.0, 1.0) if base < 1 else np.zeros_like(harm)
    u = rng.random((harm.shape[0], right.shape[0]))
    return np.where(right[None, :] == 1, (u >= lose).astype(float), (u < gain).astype(float))


def _clustered(rng: np.random.Generator, right: np.ndarray, scenario: Scenario,
               scene: int) -> tuple[np.ndarray, int]:
    """(scenes x items) outcomes of one fresh set per scene of ``scene`` items, NaN off its scene; answers."""
    n = right.shape[0]
    scenes = -(-n // scene)
    harms = _harms(rng, scenario.set_harm, scenario.spread, scenes)
    table = np.full((scenes, n), np.nan)
    for j in range(scenes):
        part = slice(j * scene, min(n, (j + 1) * scene))
        table[j, part] = _masked(rng, right[part], [harms[j]], scenario.base)[0]
    return table, n


def _curtailed_rank(rng: np.random.Generator, right: np.ndarray, top: np.ndarray, harms: np.ndarray,
                    scenario: Scenario, h: int, curtail: bool) -> tuple[tuple[float, np.ndarray], int]:
    """The rank test's data on the common items ``right`` / ``top`` from sets of the given harms, drawn in the
    demo's blocks (``designs.rank_blocks``) until Besag-Clifford stops; with ``curtail`` each set answered item
    by item until its comparison with the top-k is decided. ``((target, set values), answers)``."""
    from vrh_interp.evaluation.inference import sequential_rank_p
    from vrh_interp.experiments.designs import comparison_open, rank_blocks

    m, wins = right.shape[0], int(top.sum())
    values: list[float] = []
    answers = 2 * m  # the target and the baseline on the rank items
    for start, stop in rank_blocks(len(harms)):
        outcomes = _masked(rng, right, harms[start:stop], scenario.base)
        for row in outcomes:
            if curtail:
                count, used = 0, m
                for j, value in enumerate(row):
                    count += int(value)
                    if not comparison_open(count, wins, m - j - 1):
                        used = j + 1
                        break
                answers += used
                values.append((count + m - used) / m)
            else:
                answers += m
                values.append(float(row.mean()))
        _, drawn = sequential_rank_p(wins / m, values, h=h)
        if drawn < len(values):
            break
    return (wins / m, np.array(values)), answers


def simulate_causal(scenario: Scenario, design: Design, rng: np.random.Generator,
                    minimum: float = CLAIMS["causal"].minimum, special_p: float | None = None) -> tuple[Any, int]:
    """One simulated table through the causal rule: ``(evidence, answers used)``; ``special_p``: the rank test's
    p made elsewhere (the k-curve reads the one at k*)."""
    n = design.items
    right = (rng.random(n) < scenario.base).astype(float)
    top_harm = scenario.top_harm
    if top_harm is None:
        top_harm = float(_harms(rng, scenario.set_harm, scenario.spread, 1)[0])
    top = _masked(rng, right, [top_harm], scenario.base)[0]
    parts, answers = {}, 2 * n
    for kind in KINDS:
        if design.scene:
            sets, used = _clustered(rng, right, scenario, design.scene)
            m = design.rank_items
            rank, ranked = None, 0
            if design.rank_sets:
                rank, ranked = _curtailed_rank(rng, right[:m], top[:m], _harms(
                    rng, scenario.set_harm, scenario.spread, design.rank_sets), scenario, design.h, design.curtail)
            answers += used + ranked
            parts[kind] = causal_test(right, top, sets, minimum=minimum, rank=rank, rank_h=design.h,
                                      special_p=special_p)
            continue
        set_harms = _harms(rng, scenario.set_harm, scenario.spread, max(design.sets, design.rank_sets))
        sets = _masked(rng, right, set_harms[:design.sets], scenario.base)
        answers += design.sets * n
        rank = None
        if design.rank_sets:
            m = design.rank_items  # the first m items: the rank test's common subset
            ranked = np.concatenate([sets[:, :m], _masked(rng, right[:m], set_harms[design.sets:design.rank_sets],
                                                          scenario.base)[:, :m]])
            from vrh_interp.evaluation.inference import sequential_rank_p

            _, used = sequential_rank_p(float(top[:m].mean()), ranked.mean(axis=1), h=design.h)
            answers += max(0, used - design.sets) * m
            rank = (float(top[:m].mean()), ranked.mean(axis=1))
        parts[kind] = causal_test(right, top, sets, minimum=minimum, rank=rank, rank_h=design.h,
                                  special_p=special_p)
    return intersection(parts), answers


def rate(scenario: Scenario, design: Design, runs: int, *, seed: int = 0, alpha: float = ALPHA) -> Rate:
    """The causal rule's verdicts over ``runs`` simulated tables, decided at level ``alpha`` (unadjusted: one
    claim; ``family_rate`` for a table)."""
    rng = np.random.default_rng(seed)
    out = Rate()
    spec = CLAIMS["causal"]
    for _ in range(runs):
        evidence, answers = simulate_causal(scenario, design, rng)
        verdict, _ = decide(spec, evidence, alpha_holds=alpha)
        out.runs += 1
        out.holds += verdict == "holds"
        out.fails += verdict == "does not hold"
        out.answers.append(answers)
    return out


def null_table(rng: np.random.Generator, design: Design, heads: int = 128, samples: int = 200) -> dict[str, Any]:
    """The evidence of a whole paper table under the global null: the causal claims (k*, VQA, transfer, and the
    curve with its specialness from k*) from a noise scorer with set-harm spread 0.06, ``sparse`` from detection
    scores with no structure (i.i.d. exponential per sample and head), the rest not measured (in the family)."""
    from vrh_interp.experiments.verdicts import sparse_evidence

    noise = Scenario("noise", "null", set_harm=0.05, spread=0.06)
    evidence: dict[str, Any] = {}
    for claim in ("causal", "vqa", "shared"):
        evidence[claim], _ = simulate_causal(noise, design, rng)
    curve, _ = simulate_causal(noise, Design("curve", design.items, 4, scene=design.scene), rng,
                               special_p=evidence["causal"].parts.get("special", 1.0))
    curve.p_holds = max(curve.p_holds, evidence["causal"].parts.get("special", 1.0))
    evidence["causal_curve"] = curve
    scores = rng.exponential(size=(samples, heads))
    evidence["sparse"] = sparse_evidence([], per_sample=scores, seed=int(rng.integers(1 << 30)), permutations=199)
    for claim in ("design_space", "specific", "stable"):
        evidence[claim] = None
    return evidence


def family_rate(design: Design, runs: int, *, seed: int = 0) -> Rate:
    """How often ``claims.judge`` says "holds" for ANY claim of a paper table under the global null."""
    rng = np.random.default_rng(seed)
    out = Rate()
    paper = {i: spec for i, spec in CLAIMS.items() if spec.table == "paper"}
    for _ in range(runs):
        table = judge(null_table(rng, design), specs=paper)
        out.runs += 1
        out.holds += bool((table["verdict"] == "holds").any())
    return out


def sparse_rate(runs: int, *, heads: int = 128, samples: int = 200, seed: int = 0,
                scores: Callable[[np.random.Generator], np.ndarray] | None = None) -> Rate:
    """How often the sparse rule holds on detection scores with no structure (default: i.i.d. exponential)."""
    from vrh_interp.experiments.verdicts import sparse_evidence

    rng = np.random.default_rng(seed)
    out = Rate()
    for _ in range(runs):
        data = scores(rng) if scores else rng.exponential(size=(samples, heads))
        evidence = sparse_evidence([], per_sample=data, seed=int(rng.integers(1 << 30)), permutations=199)
        verdict, _ = decide(CLAIMS["sparse"], evidence)
        out.runs += 1
        out.holds += verdict == "holds"
    return out


NULLS = (
    Scenario("noise scorer, set-harm sd 0.02", "null", set_harm=0.05, spread=0.02),
    Scenario("noise scorer, set-harm sd 0.06", "null", set_harm=0.05, spread=0.06),
    Scenario("noise scorer, set-harm sd 0.10", "null", set_harm=0.05, spread=0.10),
    Scenario("top-k does not hurt (baseline = top-k 0.80, controls 0.90)", "null", base=0.8, set_harm=-0.10,
             spread=0.02, top_harm=0.0),
    Scenario("special and hurting, effect exactly at the minimum 0.05", "null", set_harm=0.01, spread=0.01,
             top_harm=0.06),
)
ALTERNATIVES = (
    Scenario("planted (0.95 -> 0.10, random sets 0.01)", "alternative", base=0.95, set_harm=0.01, spread=0.02,
             top_harm=0.85),
    Scenario("paper, Qwen2.5-VL-7B k = 20 (86.1 -> 7.5, random 86.0)", "alternative", base=0.861, set_harm=0.001,
             spread=0.005, top_harm=0.786),
    Scenario("modest 10-point effect (random sets 0.02)", "alternative", set_harm=0.02, spread=0.02, top_harm=0.12),
    Scenario("modest 5-point effect (= the minimum; not meant to hold)", "alternative", set_harm=0.02, spread=0.02,
             top_harm=0.07),
)
# the demo's design before 0.3 (20 sets of each kind on every item), the 0.3 one (the rank step added) and the one
# it uses now (one fresh set per scene; the rank step curtailed)
FIXED = Design("20 sets on every item (0.2 design)", items=135, sets=20)
RANKED = Design("20 sets on every item + up to 199 on 12 items, sequential (0.3 demo)", items=135, sets=20,
                rank_sets=199)
CLUSTERED = Design("one set per scene of 3-4 items + up to 199 on 12 items, sequential, curtailed (0.4 demo)",
                   items=135, sets=0, rank_sets=199, scene=4, curtail=True)


def table(scenarios: tuple[Scenario, ...], designs: tuple[Design, ...], runs: int, *, items: tuple[int, ...] = (),
          seed: int = 0, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per (scenario, design, items): runs, the rate of "holds" with its 95 % bounds, of "does not hold",
    and the mean answers a run used; decided at ``alpha``."""
    rows = []
    for scenario in scenarios:
        for design in designs:
            for n in items or (design.items,):
                sized = Design(design.name, n, design.sets, design.rank_sets, min(design.rank_items, n), design.h,
                               design.scene, design.curtail)
                result = rate(scenario, sized, runs, seed=seed, alpha=alpha)
                rows.append({"scenario": scenario.name, "truth": scenario.truth, "design": design.name, "items": n,
                             "runs": result.runs, "holds": result.holds / result.runs,
                             "holds_upper95": result.upper(), "holds_lower95": result.lower(),
                             "does_not_hold": result.fails / result.runs,
                             "answers": float(np.mean(result.answers))})
    return pd.DataFrame(rows)
