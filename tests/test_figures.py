"""Every plotting call follows one convention: it returns a figure that a notebook shows as a picture without
``%matplotlib inline`` (a PNG rich repr), that pyplot does not know (so nothing shows it twice), and it draws into
the caller's ``ax=`` (returning that figure) when given one."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from vrh_interp.scoring.design import ScoringDesign
from vrh_interp.scoring.scores import HeadScores
from vrh_interp.viz import plots

PNG = b"\x89PNG\r\n\x1a\n"


def _summary() -> pd.DataFrame:
    """A k-sweep summary of the shape ``SweepResult.summary()`` returns, by hand."""
    rows = [{"condition": "baseline", "k": 0, "seed": "", "accuracy": 0.9}]
    for k, acc in ((1, 0.6), (2, 0.4)):
        rows.append({"condition": "top", "k": k, "seed": "", "accuracy": acc})
        rows.append({"condition": "random", "k": k, "seed": "all", "accuracy": 0.85, "accuracy_q05": 0.8,
                     "accuracy_q95": 0.9, "sets": 3})
    frame = pd.DataFrame(rows)
    frame["accuracy_ci_low"], frame["accuracy_ci_high"] = frame["accuracy"] - 0.05, frame["accuracy"] + 0.05
    frame["mislocation_rate"], frame["parse_failure_rate"] = 0.1, 0.05
    return frame


def _cross() -> pd.DataFrame:
    rows = []
    for model in ("A", "B"):
        rows.append({"model": model, "condition": "baseline", "k": 0, "seed": "", "accuracy": 0.9})
        for kind in ("own", "transferred", "random"):
            rows.append({"model": model, "condition": kind, "k": 2, "seed": "all" if kind == "random" else "",
                         "accuracy": 0.5, "heads_from": "B" if model == "A" else "A", "accuracy_q05": 0.4,
                         "accuracy_q95": 0.6})
    frame = pd.DataFrame(rows)
    frame["accuracy_ci_low"], frame["accuracy_ci_high"] = frame["accuracy"] - 0.05, frame["accuracy"] + 0.05
    return frame


IMAGE = Image.new("RGB", (20, 16), "white")
GRID = np.arange(6.0).reshape(2, 3)
OVERLAY = SimpleNamespace(image=IMAGE, truth=SimpleNamespace(as_tuple=lambda: (1, 1, 8, 8)), predicted=None,
                          overlays=[SimpleNamespace(name=n, grid=GRID, block=SimpleNamespace(region=(0, 0, 20, 16)))
                                    for n in ("all heads", "VRHs")])
PATCH_FRAME = pd.DataFrame([{"head": h, "region": r, "recovery": 0.3, "ci_low": 0.2, "ci_high": 0.4}
                            for h in ("L1H0", "L1H2") for r in ("head_output", "clean_referent")])
RECOVERY = pd.DataFrame({"head": ["L0H0", "L0H1", "L1H0"], "recovery": [0.1, 0.5, -0.2]})

DOSE = pd.DataFrame([{"kind": kind, "alpha": alpha, "sets": sets, "move_rate": move, "break_rate": 0.1}
                     for kind, sets, slope in (("top", 1, 0.08), ("random", 5, 0.0)) for alpha in (0.0, 4.0, 8.0)
                     for move in (0.05 + slope * alpha,)])

# (name, call with ax=..., number of panels)
PLOTS = {
    "score_heatmap": (lambda ax: plots.score_heatmap(GRID, ax=ax), 1),
    "score_distribution": (lambda ax: plots.score_distribution(GRID, ax=ax), 1),
    "k_sweep_curve": (lambda ax: plots.k_sweep_curve(_summary(), ax=ax), 1),
    "failure_bars": (lambda ax: plots.failure_bars(_summary(), ax=ax), 1),
    "design_space_bars": (lambda ax: plots.design_space_bars(pd.DataFrame({"variant": ["a", "b"], "drop": [0.1, 0.3]}),
                                                             ax=ax), 1),
    "attention_overlay": (lambda ax: plots.attention_overlay(IMAGE, GRID, (0, 0, 20, 16), {"gt": (1, 1, 8, 8)},
                                                             ax=ax), 1),
    "score_damage_scatter": (lambda ax: plots.score_damage_scatter(
        pd.DataFrame({"head": ["L0H0", "L0H1", "L1H0"], "score": [0.3, 0.2, 0.1], "drop": [0.2, 0.0, 0.1],
                      "n": [8, 8, 8]}), ax=ax), 1),
    "overlay_panels": (lambda ax: plots.overlay_panels(OVERLAY, "overlays", ax=ax), 2),
    "score_map_comparison": (lambda ax: plots.score_map_comparison(GRID, GRID[::-1], k=2, ax=ax), 3),
    "cross_masking_curves": (lambda ax: plots.cross_masking_curves(_cross(), ax=ax), 2),
    "pair_panels": (lambda ax: plots.pair_panels((IMAGE, IMAGE), {"clean referent": (1, 1, 8, 8)}, ax=ax), 2),
    "patching_heatmap": (lambda ax: plots.patching_heatmap(GRID - 2.5, ax=ax), 1),
    "attribution_scatter": (lambda ax: plots.attribution_scatter(RECOVERY, RECOVERY.assign(recovery=[0.2, 0.4, 0.0]),
                                                                 ax=ax), 1),
    "position_patching_map": (lambda ax: plots.position_patching_map(PATCH_FRAME, ax=ax), 1),
    "position_patching_map with image": (lambda ax: plots.position_patching_map(
        PATCH_FRAME, image=IMAGE, boxes={"clean_referent": (1, 1, 8, 8)}, ax=ax), 2),
    "grid_drop_heatmap": (lambda ax: plots.grid_drop_heatmap(pd.DataFrame([[0.1, 0.4]], index=["m"],
                                                                          columns=["b1", "b2"]), ax=ax), 1),
    "plot_dose_response": (lambda ax: plots.plot_dose_response(DOSE, k=3, claim_alpha=8.0, ax=ax), 2),
}


def test_every_public_plot_function_is_covered():
    public = {name for name, value in vars(plots).items()
              if callable(value) and not name.startswith("_") and getattr(value, "__module__", "") == plots.__name__
              and not isinstance(value, type)}
    assert public == {name.split(" ")[0] for name in PLOTS}


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_a_returned_figure_has_a_png_repr_and_pyplot_does_not_hold_it(name):
    call, _ = PLOTS[name]
    before = plt.get_fignums()
    figure = call(None)
    assert isinstance(figure, plots.Figure)
    assert figure._repr_png_().startswith(PNG)
    assert plt.get_fignums() == before  # not managed by pyplot: no second display by the inline backend or show()


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_ax_is_honoured(name):
    call, panels = PLOTS[name]
    mine = plots.Figure(figsize=(6, 3))
    axes = list(mine.subplots(1, panels, squeeze=False)[0])
    assert call(axes[0] if panels == 1 else axes) is mine
    assert all(ax.has_data() or ax.images or ax.texts for ax in axes), "a panel was left empty"
    if panels > 1:
        with pytest.raises(ValueError, match=f"ax= takes {panels} matplotlib Axes"):
            call(axes[0])


def test_ipython_shows_a_figure_as_png_without_magics():
    """What a notebook cell ending in the figure displays (IPython's formatter, no %matplotlib inline)."""
    formatters = pytest.importorskip("IPython.core.formatters")
    scores = HeadScores(np.arange(12.0).reshape(3, 4), ScoringDesign())
    data, _ = formatters.DisplayFormatter().format(scores.heatmap())
    assert data["image/png"].startswith(PNG)


def test_result_methods_take_ax():
    scores = HeadScores(np.arange(12.0).reshape(3, 4), ScoringDesign())
    mine = plots.Figure()
    ax = mine.add_subplot()
    assert scores.heatmap(ax=ax) is mine
    np.testing.assert_array_equal(ax.images[0].get_array(), scores.scores)

    from vrh_interp.patching.head_patching import HeadPatchingResult

    frame = pd.DataFrame({"head": ["L0H1", "L1H0"], "layer": [0, 1], "head_index": [1, 0], "recovery": [0.5, -0.1]})
    result = HeadPatchingResult(frame=frame, per_pair={}, baseline=None)
    figure = result.heatmap()
    assert figure._repr_png_().startswith(PNG)
    assert figure.axes[0].images[0].get_array().shape == (2, 2)
    other = plots.Figure()
    assert result.heatmap(3, 4, ax=other.add_subplot()) is other
