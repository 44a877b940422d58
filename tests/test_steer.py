"""``vrh steer`` on toy:planted at small sizes, and the ``sufficient`` claim's rule on known outcomes.

The CLI run redirects the planted heads (the top-3 of the detection pass) and the decoys and control sets: the
planted heads must move answers to the other object and the decoys must not, the run folder resumes without
generating again, and its files are written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from vrh_interp.apps.cli import main
from vrh_interp.experiments.positive_control import available, declared
from vrh_interp.experiments.steer import SteerResult, steer_conditions, steer_from_run


@pytest.mark.skipif(not available(), reason="toy:planted is not shipped in this installation")
def test_vrh_steer_on_the_planted_toy_moves_answers_with_the_planted_heads(tmp_path, capsys):
    out = tmp_path / "steer"
    argv = ["steer", "--out", str(out), "--items", "8", "--detect", "8", "--seeds", "0,1", "--alphas", "0,16",
            "--no-live", "--patch-seeds", "1", "--batch-size", "8"]
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
    assert summary["verdict"] in ("holds", "inconclusive")  # 2 sets per kind: the rank test cannot reach 0.05
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
    from vrh_interp.core.heads import HeadGeometry, HeadSet

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
