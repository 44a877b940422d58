"""Random head sets as a distribution: where does the VRH set's patching recovery fall among sets of its size?

A handful of random sets says little (on toy A, 3 draws recovered 0.02-0.21 while some non-detected 3-head
sets recover more than the VRHs). So the VRH set is compared with three populations of same-size sets, all
drawn OUTSIDE the VRHs, as the sweep's controls are (``experiments.sweep``; the unit is the head set,
``evaluation.statistics``):

* ``random``: ``random_control`` sets, one per seed (default 20 seeds);
* ``matched``: ``layer_matched_control`` sets (as many heads per layer as the VRHs), one per seed;
* ``all sets``: EVERY k-subset of the non-VRH heads, where their number allows: patched one by one
  (``"exact"``), or predicted from single-head recoveries by additivity (``"additive"``: recovery is a
  ratio of means, so if patches add up, a set's recovery is the sum of its heads'). The additive route is
  checked, not assumed: every set of the random and matched populations is also patched exactly, and the
  largest |exact - additive| error there widens the tail count into bounds (``tail_low`` .. ``tail_high``).

For the sampled populations the tail probability is the empirical p-value
``(1 + #sets recovering >= the VRHs) / (1 + #sets)`` (``statistics.empirical_p_value``); for all sets it is
the plain fraction (a census, not a sample) and ``rank`` is the VRH set's place among the census plus itself.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import pandas as pd

from vrh_interp.core._display import Card
from vrh_interp.evaluation.statistics import empirical_p_value, random_set_distribution
from vrh_interp.evaluation.controls import DEFAULT_RANDOM_SEEDS, layer_matched_control, random_control
from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.patching.batch import (Baseline, PairBatch, PatchPositions, baseline, per_coordinate, recovery,
                                       recovery_ci)
from vrh_interp.patching.head_patching import HeadPatchingResult, patch_each_head, patch_sets

AllSets = Literal["auto", "exact", "additive", "none"]
MAX_EXACT_SETS = 200  # "auto" patches every set exactly up to this many, else predicts them additively
MAX_ENUMERATED_SETS = 2_000_000  # beyond this the census is skipped (noted in the summary)


def control_sets(geometry: HeadGeometry, vrhs: HeadSet, *, random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS,
                 matched: bool = True) -> dict[str, HeadSet]:
    """``{"random:seed=S": ..., "matched:seed=S": ...}``: the sweep's controls at k = len(vrhs)."""
    sets = {f"random:seed={seed}": random_control(geometry, vrhs, len(vrhs), seed) for seed in random_seeds}
    if matched:
        sets.update({f"matched:seed={seed}": layer_matched_control(geometry, vrhs, vrhs, seed)
                     for seed in random_seeds})
    return sets


@dataclass(repr=False)
class SetComparison(Card):
    """``sets``: one row per set patched exactly; ``summary``: one row per population; ``additivity``: the check.
    Shown as the VRH set's recovery and its place in each population."""

    sets: pd.DataFrame
    summary: pd.DataFrame
    additivity: dict[str, float] = field(default_factory=dict)

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        vrh = self.sets[self.sets["kind"] == "vrh"] if "kind" in self.sets else self.sets.head(0)
        value = f"{vrh['recovery'].iloc[0]:.3g} [{vrh['ci_low'].iloc[0]:.2g}, {vrh['ci_high'].iloc[0]:.2g}]" \
            if len(vrh) else "n/a"
        rows = []
        for row in self.summary.head(6).to_dict(orient="records"):
            if "tail_p" in row and row["tail_p"] == row["tail_p"]:
                rows.append((str(row["population"]), f"mean {row.get('mean', float('nan')):.3g}, max "
                                                     f"{row.get('max', float('nan')):.3g}, VRH rank {row['rank']}, "
                                                     f"tail p {row['tail_p']:.3g} ({row['method']})"))
            else:
                rows.append((str(row["population"]), str(row.get("method", ""))))
        if self.additivity:
            rows.append(("additivity", f"max |exact - additive| {self.additivity['max_abs_error']:.3g} over "
                                       f"{self.additivity['sets_checked']} sets"))
        heads = f" ({vrh['heads'].iloc[0]})" if len(vrh) and "heads" in vrh else ""
        return f"SetComparison: the VRH set{heads} recovers {value} (summary, sets: the tables)", rows

    def _card_table(self) -> str:
        columns = [c for c in ("population", "method", "sets", "mean", "max", "vrh_recovery", "rank", "tail_p")
                   if c in self.summary]
        return self.summary[columns].to_html(index=False, float_format="{:.3g}".format)


def _population_row(name: str, method: str, vrh_value: float, values: np.ndarray, census: bool) -> dict:
    above = int((values >= vrh_value).sum())
    row = {"population": name, "method": method, **random_set_distribution(values), "max": float(values.max()),
           "vrh_recovery": vrh_value, "sets_at_least_vrh": above, "rank": 1 + above}
    row["tail_p"] = above / len(values) if census else empirical_p_value(-vrh_value, -values)
    return row


def compare_with_controls(vlm: VLM, pairs: PairBatch, vrhs: HeadSet, *,
                          random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, matched: bool = True,
                          all_sets: AllSets = "auto", single: HeadPatchingResult | None = None,
                          positions: PatchPositions = "answer", base: Baseline | None = None,
                          sets_per_forward: int = 8,
                          progress: bool = False) -> SetComparison:
    """The VRH set's recovery against random, layer-matched and all same-size sets (module docstring).

    ``single``: every head's exact recovery (``patch_each_head``), reused for the additive census; computed
    when needed and not given.
    """
    g = vlm.geometry
    vrhs = g.validate(vrhs)
    if all_sets not in ("auto", "exact", "additive", "none"):
        raise ValueError(f"all_sets must be 'auto', 'exact', 'additive' or 'none', not {all_sets!r}")
    base = base if base is not None else baseline(vlm, pairs)
    named = {"vrh": vrhs, **control_sets(g, vrhs, random_seeds=random_seeds, matched=matched)}
    outside = [h for h in g.all_heads() if h not in vrhs]
    k = len(vrhs)
    count = math.comb(len(outside), k)
    mode = all_sets
    if mode == "auto":
        mode = "exact" if count <= MAX_EXACT_SETS else "additive"
    if mode != "none" and count > MAX_ENUMERATED_SETS:
        mode = "none"
    census = (np.array(list(itertools.combinations(range(len(outside)), k)), dtype=np.int64).reshape(-1, k)
              if mode != "none" else np.zeros((0, k), dtype=np.int64))
    exact_sets = list(named.values()) + ([HeadSet(outside[i] for i in c) for c in census] if mode == "exact" else [])
    values = patch_sets(vlm, pairs, exact_sets, positions=positions, sets_per_forward=sets_per_forward,
                        progress=progress)
    recoveries = np.array([recovery(v.sum(-1), base) for v in values])
    if mode == "additive" and single is None:
        single = patch_each_head(vlm, pairs, positions=positions, base=base, progress=progress)
    head_recovery = ({Head(int(r.layer), int(r.head_index)): float(r.recovery) for r in single.frame.itertuples()}
                     if single is not None else {})
    rows = []
    for (name, heads), parts, value in zip(named.items(), values, recoveries):
        low, high = recovery_ci(parts.sum(-1), base)
        kind, _, seed = name.partition(":seed=")
        rows.append({"head_set": name, "kind": kind, "seed": int(seed) if seed else None,
                     "heads": " ".join(map(str, heads)), "recovery": value, "ci_low": low, "ci_high": high,
                     "additive": sum(head_recovery[h] for h in heads) if head_recovery else float("nan"),
                     **per_coordinate(parts, base), "n_pairs": pairs.n, "metric": pairs.metric})
    sets = pd.DataFrame(rows)
    vrh_value = float(recoveries[0])
    summary = [_population_row(kind, "exact", vrh_value, sets[sets["kind"] == kind]["recovery"].to_numpy(), False)
               for kind in ("random", "matched") if (sets["kind"] == kind).any()]
    additivity: dict[str, float] = {}
    if head_recovery:
        error = (sets["recovery"] - sets["additive"]).to_numpy()
        additivity = {"sets_checked": len(sets), "max_abs_error": float(np.abs(error).max()),
                      "mean_abs_error": float(np.abs(error).mean()),
                      "pearson": float(np.corrcoef(sets["recovery"], sets["additive"])[0, 1]) if len(sets) > 2
                      else float("nan")}
    if mode == "exact":
        summary.append(_population_row(f"all {count} sets", "exact", vrh_value, recoveries[len(named):], True))
    elif mode == "additive":
        predicted = np.array([head_recovery[h] for h in outside])[census].sum(axis=1)
        row = _population_row(f"all {count} sets", "additive", vrh_value, predicted, True)
        margin = additivity["max_abs_error"]
        row["tail_low"] = float((predicted - margin >= vrh_value).mean())
        row["tail_high"] = float((predicted + margin >= vrh_value).mean())
        summary.append(row)
    else:
        summary.append({"population": f"all {count} sets", "method": "not enumerated",
                        "sets": count, "vrh_recovery": vrh_value})
    return SetComparison(sets, pd.DataFrame(summary), additivity)
