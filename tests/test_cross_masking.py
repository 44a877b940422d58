"""Cross-model masking (the paper's Fig. 7) on two tiny fixtures sharing a backbone grid (LLaVA-1.5, LLaVA-NeXT).

The own / transferred / random conditions of ``cross_masking`` must give exactly what ``sweep`` and
``run_conditions`` give when run directly with those head sets: same heads, same answers, same numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from tests.conftest import tiny_vlm
from vrh_interp.viz import plots
from vrh_interp.specs import load_spec
from vrh_interp.experiments.conditions import Condition
from vrh_interp.experiments.sweep import run_conditions, sweep
from vrh_interp.evaluation.controls import random_control
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.scoring.detect import score_heads
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.core.description.head_mapping import IncompatibleHeadGridError
from vrh_interp.experiments.transfer import cross_conditions, cross_masking, masking_drops

KS = (0, 1, 2)
SEEDS = (0, 1)
TOKENS = 4
BATCH = 3


@pytest.fixture(scope="module")
def pair():
    """Tiny LLaVA-1.5 (A) and LLaVA-NeXT (B): different image pipelines (NeXT tiles), the same 2 x 4 head grid.

    (Tiny InternVL shares the grid too, but its random weights answer "\\n" whatever is masked, which would
    make the answer comparisons vacuous.)
    """
    vlm_a, vlm_b = tiny_vlm("llava"), tiny_vlm("llava_next")
    assert vlm_a.geometry == vlm_b.geometry
    detect = synthetic_samples("detect", 3)
    scores_a = score_heads(vlm_a, detect, batch_size=BATCH, max_new_tokens=TOKENS, progress=False)
    scores_b = score_heads(vlm_b, detect, batch_size=BATCH, max_new_tokens=TOKENS, progress=False)
    evals = synthetic_samples("eval", 3)
    result = cross_masking(vlm_a, vlm_b, scores_a, scores_b, evals, ks=KS, random_seeds=SEEDS,
                           batch_size=BATCH, max_new_tokens=TOKENS, progress=False)
    return vlm_a, vlm_b, scores_a, scores_b, evals, result


def _answers(records: pd.DataFrame, key: str) -> list[tuple[str, str, float]]:
    part = records[records["condition"] == key]
    return list(zip(part["sample_id"], part["answer"], part["iou"]))


def test_conditions_are_own_transferred_and_random_outside_both(pair):
    vlm_a, vlm_b, scores_a, scores_b, _, result = pair
    assert scores_a.top(2) != scores_b.top(2), "the two fixtures must rank heads differently for this test to bite"
    for target, own, other in (("A", scores_a, scores_b), ("B", scores_b, scores_a)):
        conditions = {c.key: c.heads for c in result.results[target].conditions}
        detected = own.top(2).union(other.top(2))
        expected = {"baseline:k=0": HeadSet()}
        for k in (1, 2):
            expected[f"own:k={k}"] = own.top(k)
            expected[f"transferred:k={k}"] = other.top(k)  # identity transfer: same indices in the same grid
            for seed in SEEDS:
                expected[f"random:k={k}:seed={seed}"] = random_control(vlm_a.geometry, detected, k, seed)
        assert conditions == expected
        for k in (1, 2):
            for seed in SEEDS:
                assert not set(conditions[f"random:k={k}:seed={seed}"]) & set(detected)
    assert result.sources == {"A": "B", "B": "A"}


def test_transferred_and_own_match_a_direct_sweep(pair):
    vlm_a, vlm_b, scores_a, scores_b, evals, result = pair
    for target, vlm, own, other in (("A", vlm_a, scores_a, scores_b), ("B", vlm_b, scores_b, scores_a)):
        records = result.results[target].records
        direct_transferred = sweep(vlm, evals, other.ranking(), ks=KS, random_seeds=(), batch_size=BATCH,
                                   max_new_tokens=TOKENS, progress=False)
        direct_own = sweep(vlm, evals, own.ranking(), ks=KS, random_seeds=(), batch_size=BATCH,
                           max_new_tokens=TOKENS, progress=False)
        assert _answers(records, "baseline:k=0") == _answers(direct_own.records, "baseline:k=0")
        for k in (1, 2):
            assert _answers(records, f"transferred:k={k}") == _answers(direct_transferred.records, f"top:k={k}")
            assert _answers(records, f"own:k={k}") == _answers(direct_own.records, f"top:k={k}")
        # the masks act: some masked answer differs from the unmasked one in this model
        baseline = [a for _, a, _ in _answers(records, "baseline:k=0")]
        assert any([a for _, a, _ in _answers(records, key)] != baseline
                   for key in ("own:k=1", "own:k=2", "transferred:k=1", "transferred:k=2"))
        summary = result.summary().set_index(["model", "key"]).loc[target]
        direct = direct_transferred.summary().set_index("key")
        columns = ["n", "accuracy", "accuracy_ci_low", "accuracy_ci_high", "mean_iou", "parse_failure_rate",
                   "mislocation_rate", "lost_vs_baseline", "p_value_vs_baseline"]
        for k in (1, 2):
            assert summary.loc[f"transferred:k={k}", columns].tolist() == direct.loc[f"top:k={k}", columns].tolist()
            assert summary.loc[f"transferred:k={k}", "heads_from"] == ("B" if target == "A" else "A")
            assert summary.loc[f"own:k={k}", "heads_from"] == target


def test_random_conditions_match_run_conditions(pair):
    _, vlm_b, scores_a, scores_b, evals, result = pair
    detected = scores_b.top(2).union(scores_a.top(2))
    conditions = [Condition("baseline", 0, None, HeadSet())]
    conditions += [Condition("random", k, seed, random_control(vlm_b.geometry, detected, k, seed))
                   for k in (1, 2) for seed in SEEDS]
    direct = run_conditions(vlm_b, evals, conditions, batch_size=BATCH, max_new_tokens=TOKENS, progress=False)
    for condition in conditions:
        assert _answers(result.results["B"].records, condition.key) == _answers(direct.records, condition.key)
    pooled = result.summary().set_index(["model", "key"]).loc["B"].loc["random:k=2:seed=all"]
    assert pooled["n"] == len(SEEDS) * len(evals)
    assert pooled["accuracy"] == direct.summary().set_index("key").loc["random:k=2:seed=all", "accuracy"]


def test_masking_drops_and_figure_read_the_summary(pair):
    *_, result = pair
    summary = result.summary()
    drops = masking_drops(summary, 2)
    assert drops["direction"].tolist() == ["B's heads masked in A", "A's heads masked in B"]
    for row, model in zip(drops.itertuples(), ("A", "B")):
        rows = summary[summary["model"] == model].set_index("key")["accuracy"]
        assert row.baseline == rows["baseline:k=0"]
        assert row.own_drop == pytest.approx(rows["baseline:k=0"] - rows["own:k=2"])
        assert row.transferred_drop == pytest.approx(rows["baseline:k=0"] - rows["transferred:k=2"])
        assert row.random_drop == pytest.approx(rows["baseline:k=0"] - rows["random:k=2:seed=all"])
        sets = [rows[f"random:k=2:seed={seed}"] for seed in SEEDS]  # set-level p-value against the random sets
        assert row.transferred_p_vs_random == pytest.approx(
            (1 + sum(a <= rows["transferred:k=2"] for a in sets)) / (1 + len(SEEDS)))
        assert row.random_sets == len(SEEDS)
    assert "transferred_verdict" not in drops  # the verdict is the claims rule's (transfer_evidence), one place
    fig = plots.cross_masking_curves(summary)
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["heads masked in A", "heads masked in B"]
    for ax, model in zip(axes, ("A", "B")):
        rows = summary[summary["model"] == model].set_index("key")["accuracy"]
        lines = {line.get_label().split(" ")[0]: line for line in ax.get_lines()}
        assert set(lines) == {"own", "transferred", "random"}
        assert list(lines["transferred"].get_xdata()) == list(KS)
        assert np.allclose(lines["transferred"].get_ydata(),
                           [rows["baseline:k=0"], rows["transferred:k=1"], rows["transferred:k=2"]])
        assert np.allclose(lines["random"].get_ydata(),
                           [rows["baseline:k=0"], rows["random:k=1:seed=all"], rows["random:k=2:seed=all"]])


def test_run_dir_resumes_to_the_same_summary(pair, tmp_path):
    vlm_a, vlm_b, scores_a, scores_b, evals, result = pair
    first = cross_masking(vlm_a, vlm_b, scores_a, scores_b, evals, ks=KS, random_seeds=SEEDS, batch_size=BATCH,
                          max_new_tokens=TOKENS, run_dir=tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masked_in_A", "masked_in_B"]
    again = cross_masking(vlm_a, vlm_b, scores_a, scores_b, evals, ks=KS, random_seeds=SEEDS, batch_size=BATCH,
                          max_new_tokens=TOKENS, run_dir=tmp_path, progress=False)
    pd.testing.assert_frame_equal(first.summary(), result.summary())
    pd.testing.assert_frame_equal(again.summary(), result.summary())


def test_refusals(pair):
    vlm_a, vlm_b, scores_a, scores_b, evals, _ = pair
    with pytest.raises(ValueError, match="disjoint"):
        cross_masking(vlm_a, vlm_b, scores_a, scores_b, synthetic_samples("detect", 2), ks=KS, progress=False)
    with pytest.raises(ValueError, match="different labels"):
        cross_masking(vlm_a, vlm_b, scores_a, scores_b, evals, labels=("A", "A"), progress=False)
    toy_a = load_spec("toy:a")  # 4 x 8 heads: not tiny LLaVA's 2 x 4 grid
    toy_scores = HeadScores(scores=np.arange(32, dtype=float).reshape(4, 8), design=scores_a.design)
    with pytest.raises(IncompatibleHeadGridError, match="relative_depth"):
        cross_masking(vlm_a, toy_a, scores_a, toy_scores, evals, ks=KS, progress=False)
    with pytest.raises(ValueError, match="exceeds"):
        cross_conditions(HeadSet.parse("L0H0"), HeadSet.parse("L0H1,L1H1"), vlm_a.geometry, (0, 2), (0,))


def test_score_map_comparison_plots_each_head(pair):
    _, _, scores_a, scores_b, _, _ = pair
    fig = plots.score_map_comparison(scores_a.scores, scores_b.scores, ("A", "B"), k=2)
    heat_a, heat_b, scatter = [ax for ax in fig.get_axes() if ax.get_label() != "<colorbar>"]
    assert np.array_equal(heat_a.get_images()[0].get_array(), scores_a.scores)
    assert np.array_equal(heat_b.get_images()[0].get_array(), scores_b.scores)
    points = scatter.collections[0]
    assert np.allclose(points.get_offsets(), np.column_stack([scores_a.scores.ravel(), scores_b.scores.ravel()]))
    top_a = {h.layer * 4 + h.head for h in scores_a.top(2)}
    top_b = {h.layer * 4 + h.head for h in scores_b.top(2)}
    expected = ["black" if i in top_a & top_b else "tab:red" if i in top_a else "tab:green" if i in top_b
                else "lightgrey" for i in range(8)]
    assert np.allclose(points.get_facecolors(), [to_rgba(c) for c in expected])
    assert expected.count("tab:red") + expected.count("black") == 2
    with pytest.raises(ValueError, match="different grids"):
        plots.score_map_comparison(scores_a.scores, np.zeros((3, 4)))
