"""``vrh steer`` on toy:planted at small sizes, and the ``sufficient`` claim's rule on known outcomes.

The CLI run redirects the planted heads (the top-3 of the detection pass) and the decoys and control sets: the
planted heads must move answers to the other object and the decoys must not, the claim holds with a sequential rank
p below the 19-set floor of 0.05, the run folder resumes without generating again, and its files are written. The
calibration: the same command with a random head set of the same size in the top-k's place never holds. The rule
itself on simulated outcome tables of known truth (numpy, no model): the curtailed sequential rank test gives the
full table's p-value, a target exchangeable with the sets holds at most at about the level, a special one holds."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from vrh_interp.apps.cli import main
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.evaluation.inference import sequential_rank_p
from vrh_interp.experiments.positive_control import available, declared
from vrh_interp.experiments.steer import (SteerCondition, SteerResult, steer_conditions, steer_from_run,
                                          steer_rank_test)


@pytest.mark.skipif(not available(), reason="toy:planted is not shipped in this installation")
def test_vrh_steer_on_the_planted_toy_moves_answers_with_the_planted_heads(tmp_path, capsys):
    out = tmp_path / "steer"
    argv = ["steer", "--out", str(out), "--items", "8", "--detect", "8", "--seeds", "0,1", "--alphas", "0,16",
            "--no-live", "--patch-seeds", "1", "--batch-size", "8", "--rank-sets", "59", "--rank-items", "8"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "sufficient: " in text and "dose-response" in text
    result = steer_from_run(out)
    planted, _ = declared()
    assert result.config["named_sets"]["planted"] == planted.to_list()
    dose = result.dose_response().set_index(["kind", "alpha"])
    assert dose.loc[("planted", 16.0), "move_rate"] >= dose.loc[("planted", 0.0), "move_rate"] + 0.25
    assert dose.loc[("decoys", 16.0), "move_rate"] <= dose.loc[("decoys", 0.0), "move_rate"] + 0.125
    assert dose.loc[("random", 16.0), "move_rate"] < dose.loc[("planted", 16.0), "move_rate"]
    patching = result.patching().set_index("kind")
    assert patching.loc["planted", "move_rate"] > patching.loc["decoys", "move_rate"]
    for name in ("records.csv", "dose_response.csv", "claims.csv", "steer.json", "dose_response.png"):
        assert (out / name).exists(), name
    summary = json.loads((out / "steer.json").read_text())
    # 2 dose-response sets per kind, but the sequential rank test drew all 59 of each kind: p = 1/60, below the
    # 0.05 that 19 fixed sets stop at
    assert summary["verdict"] == "holds"
    rank = result.rank().set_index("kind")
    assert list(rank.index) == ["random", "matched"] and (rank["sets"] == 59).all()
    assert np.allclose(rank["p"], 1 / 60) and (rank["as_many_moved"] == 0).all()
    assert np.isclose(result.claims().iloc[0]["p"], max(1 / 60, result.evidence().parts["drop"]))
    shown = repr(result)  # a few lines: the verdict, then each kind's move rate per alpha; never the records
    assert shown.startswith("SteerResult: top-3") and "HOLDS" in shown and len(shown.splitlines()) <= 9
    assert "planted: alpha 0:" in shown and "sample_id" not in shown and "<table>" in result._repr_html_()
    answered = result.records[result.records["form"] == "rank"].groupby("condition").size()
    assert answered.max() == 8 and answered.median() < 8  # the top-k on every item; the sets curtailed
    records = len(result.records)
    assert main(argv + ["--json"]) == 0  # resumes: every record is there, nothing is generated again
    assert json.loads(capsys.readouterr().out)["verdict"] == summary["verdict"]
    assert len(steer_from_run(out).records) == records


def _result(top_moves: int, control_moves: list[int], base_moves: int, n: int = 40) -> SteerResult:
    rows = []

    def add(condition: str, kind: str, seed: object, alpha: float, moves: int) -> None:
        rows.extend({"form": "redirect", "condition": condition, "kind": kind, "seed": seed, "alpha": alpha,
                     "sample_id": f"s{i}", "outcome": "move" if i < moves else "stay"} for i in range(n))

    add("baseline:alpha=0", "baseline", None, 0.0, base_moves)
    add("top:alpha=8", "top", None, 8.0, top_moves)
    for kind in ("random", "matched"):
        for seed, moves in enumerate(control_moves):
            add(f"{kind}:alpha=8:seed={seed}", kind, seed, 8.0, moves)
    config = {"claim_alpha": 8.0, "k": 3, "sample_ids": [f"s{i}" for i in range(n)], "conditions": {}}
    return SteerResult(pd.DataFrame(rows), config)


def test_the_sufficient_claim_holds_only_when_the_top_k_moves_more_than_every_control_set():
    controls = [2 + (i % 3) for i in range(19)]
    assert _result(30, controls, 1).verdict() == "holds"
    assert _result(3, controls, 1).verdict() == "does not hold"  # no more moves than the control sets
    # moving as much as the best control set: not special (rank test), whatever the drop against alpha 0
    assert _result(4, controls, 0).verdict() != "holds"
    assert _result(30, controls[:3], 1).verdict() == "inconclusive"  # 3 sets: the rank test cannot reach 0.05


def test_steer_conditions_share_the_unsteered_run_and_draw_controls_outside_the_top_k():
    from vrh_interp.core.description.heads import HeadGeometry, HeadSet

    geometry = HeadGeometry(4, 16, 8, 8)
    ranking = geometry.all_heads()
    conditions = steer_conditions(ranking, geometry, 3, (0, 2, 8), range(4), named={"decoys": HeadSet.coerce("L3H7")})
    keys = [c.key for c in conditions]
    assert keys[0] == "baseline:alpha=0" and keys.count("baseline:alpha=0") == 1
    assert len(keys) == len(set(keys)) == 1 + 2 * (1 + 1 + 4 + 4)
    top = set(ranking[:3])
    assert all(not (set(c.heads) & top) for c in conditions if c.kind in ("random", "matched"))
    with pytest.raises(ValueError, match="include 0"):
        steer_conditions(ranking, geometry, 3, (2, 8), range(4))
    assert np.isclose(sorted({c.alpha for c in conditions}), [0, 2, 8]).all()


# ------------------------------------------------------------------------------ calibration: a random target set
@pytest.mark.skipif(not available(), reason="toy:planted is not shipped in this installation")
def test_vrh_steer_with_a_random_head_set_in_the_top_ks_place_never_holds(tmp_path, capsys):
    from vrh_interp.evaluation.controls import random_control
    from vrh_interp.experiments.positive_control import load_planted

    planted, decoys = declared()
    geometry = load_planted().geometry
    verdicts = []
    for seed in range(3):
        heads = random_control(geometry, planted.union(decoys), len(planted), seed)
        out = tmp_path / f"random-{seed}"
        assert main(["steer", "--out", str(out), "--heads", ",".join(heads.to_list()), "--items", "8",
                     "--seeds", "0,1", "--alphas", "0,16", "--no-live", "--no-patching", "--batch-size", "8",
                     "--rank-items", "8", "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        result = steer_from_run(out)
        assert result.config["conditions"]["top:alpha=16"] == heads.to_list()
        rank = result.rank()
        assert (rank["p"] > 0.05).all() and (rank["sets"] <= 60).all()  # stopped in the first blocks
        verdicts.append(summary["verdict"])
    assert all(v in ("does not hold", "inconclusive") for v in verdicts), verdicts


# ------------------------------------------------------------------- the rule on simulated tables of known truth
ALPHA = 16.0
TOP = HeadSet.coerce("L0H0,L0H1,L0H2")


def _simulated(run: int, top_q, set_q, *, n: int = 30, rank_n: int = 12, dose: int = 5, base_q: float = 0.05,
               kinds: tuple[str, ...] = ("random", "matched"), total: int = 199, asked: list | None = None,
               drawn: dict | None = None) -> SteerResult:
    """Simulated steer run ``run`` of known truth: every set (the top-k's included) moves each item with its own
    probability (the top-k's ``top_q``, or ``top_q(g)``; a control set's ``set_q(g)``), alpha 0 with ``base_q``;
    the rank test run by the library's ``steer_rank_test`` on the first ``rank_n`` items (``asked`` collects the
    (condition, item) pairs it answered, ``drawn`` every set's outcomes on every item, answered or not: the full
    table). Each set draws from its own generator, so a run's table does not depend on how many sets were asked."""
    ids = [f"s{i}" for i in range(n)]
    where = {i: j for j, i in enumerate(ids)}
    drawn = {} if drawn is None else drawn
    names = ("top", "baseline", *kinds)

    def moved(kind: str, seed: int | None) -> np.ndarray:
        if (kind, seed) not in drawn:
            g = np.random.default_rng([run, names.index(kind), 1000 + (seed if seed is not None else -1000)])
            q = (top_q(g) if callable(top_q) else top_q) if kind == "top" else base_q if kind == "baseline" \
                else set_q(g)
            drawn[(kind, seed)] = g.random(n) < q
        return drawn[(kind, seed)]

    def answer(wanted, conditions):
        if asked is not None:
            asked.extend((c.key, i) for c in conditions for i in wanted)
        return [{"condition": f"rank:{c.key}", "kind": c.kind, "seed": c.seed, "sample_id": i,
                 "outcome": "move" if moved(c.kind, c.seed)[where[i]] else "stay"} for c in conditions for i in wanted]

    def draw(seeds, running):
        return [SteerCondition(kind, seed, TOP, ALPHA) for kind in kinds if kind in running for seed in seeds]

    rank = steer_rank_test(ids[:rank_n], SteerCondition("top", None, TOP, ALPHA), draw, kinds, answer, total=total)
    rows = [{"form": "redirect", "condition": "baseline:alpha=0", "kind": "baseline", "seed": None, "alpha": 0.0,
             "sample_id": i, "outcome": "move" if m else "stay"} for i, m in zip(ids, moved("baseline", None))]
    for kind, seed in [("top", None), *((kind, -1 - s) for kind in kinds for s in range(dose))]:
        key = SteerCondition(kind, seed, TOP, ALPHA).key
        rows += [{"form": "redirect", "condition": key, "kind": kind, "seed": seed, "alpha": ALPHA, "sample_id": i,
                  "outcome": "move" if m else "stay"} for i, m in zip(ids, moved(kind, seed))]
    config = {"claim_alpha": ALPHA, "k": 3, "sample_ids": ids, "conditions": {},
              "rank": {"sets": total, "block": 20, "h": 5, "first_seed": 500, "sample_ids": ids[:rank_n]}}
    records = pd.concat([pd.DataFrame(rows), rank.assign(form="rank", alpha=ALPHA)], ignore_index=True)
    return SteerResult(records, config)


def test_the_curtailed_sequential_rank_test_gives_the_full_tables_p_with_fewer_answers():
    saved = []
    for run, (top_q, low, high) in enumerate(((0.7, 0.0, 0.1), (0.4, 0.0, 0.6), (0.6, 0.3, 0.7), (0.05, 0.0, 0.1))):
        asked: list = []
        drawn: dict = {}
        result = _simulated(run, top_q, lambda g, lo=low, hi=high: g.uniform(lo, hi), asked=asked, drawn=drawn)
        assert len(asked) == len(set(asked))  # no answer asked twice (the top-k's included)
        top = drawn[("top", None)][:12]
        rank = result.rank().set_index("kind")
        for kind in ("random", "matched"):
            # the full table: every drawn set of the kind on all 12 rank items, in drawn (seed) order
            seeds = sorted(seed for (name, seed) in drawn if name == kind and seed >= 0)
            values = [1 - drawn[(kind, seed)][:12].mean() for seed in seeds]
            p, used = sequential_rank_p(1 - top.mean(), values, h=5)
            assert np.isclose(rank.loc[kind, "p"], p) and rank.loc[kind, "used"] == used
            assert rank.loc[kind, "sets"] == len(seeds)
        answered = result.records[result.records["form"] == "rank"]
        assert len(answered) == len(asked)
        saved.append(1 - len(asked) / (12 * answered["condition"].nunique()))
    assert max(saved) > 0.3  # curtailment saved answers


def test_a_target_exchangeable_with_the_control_sets_holds_at_most_at_the_level():
    def mixture(g: np.random.Generator) -> float:  # a fifth of the sets move many answers, the rest almost none
        return g.uniform(0.5, 0.9) if g.random() < 0.2 else g.uniform(0.0, 0.1)

    runs = [_simulated(run, mixture, mixture) for run in range(150)]  # the top-k one more draw of the sets
    evidence = [r.evidence() for r in runs]
    holds = np.mean([r.verdict() == "holds" for r in runs])
    rank_rejects = np.mean([ev.parts["special"] <= 0.05 for ev in evidence])
    # the drop against alpha 0 and the effect beyond the dose-response sets alone pass often: the rank test stops them
    unranked = np.mean([max(ev.parts["drop"], ev.parts["effect"]) <= 0.05 for ev in evidence])
    assert unranked >= 0.08, unranked
    assert holds <= 0.05 + 0.03, holds  # the level, with a Monte Carlo margin (150 runs: sd 0.018 at 0.05)
    assert rank_rejects <= 0.05 + 0.03, rank_rejects  # both kinds' rank tests (the largest p) at the level
    assert min(r.rank()["sets"].min() for r in runs) == 20  # a target no more special stops in the first block


def test_a_target_that_moves_more_than_every_control_set_holds_with_a_p_below_the_fixed_sets_floor():
    for run in range(5):
        result = _simulated(run, 0.7, lambda g: g.uniform(0.0, 0.1))
        rank = result.rank()
        assert result.verdict() == "holds"
        assert (rank["sets"] == 199).all() and np.allclose(rank["p"], 1 / 200)
        assert result.claims().iloc[0]["p"] < 1 / 20
    # half the sets as strong as the target: the rank test stops early and the claim cannot hold
    weak = _simulated(5, 0.7, lambda g: 0.7 if g.random() < 0.5 else 0.05)
    assert weak.verdict() != "holds" and (weak.rank()["sets"] <= 60).all()


def test_a_rank_test_stopped_inside_a_block_is_read_on_its_complete_blocks_only():
    result = _simulated(0, 0.7, lambda g: g.uniform(0.0, 0.1))
    assert result.rank()["sets"].tolist() == [199, 199]
    records = result.records
    # killed while block 3 (sets 60-139) was at its second item: its sets hold one or two answers, none decided
    late = (records["form"] == "rank") & (records["seed"].astype(float) >= 560)
    first_items = records["sample_id"].isin(["s0", "s1"])
    cut = SteerResult(records[~late | (first_items & (records["seed"].astype(float) < 640))].reset_index(drop=True),
                      result.config)
    rank = cut.rank()
    assert rank["sets"].tolist() == [60, 60] and np.allclose(rank["p"], 1 / 61)  # blocks 1 and 2, not 139 sets
    assert len(cut.rank_records()) < len(cut.records[cut.records["form"] == "rank"])
