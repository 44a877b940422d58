"""Notebook-sized displays: ``repr`` / ``_repr_html_`` of the loaded model, head scores and sweep results stay a few
lines and say what matters; ``heatmap()`` / ``plot()`` return figures; ``load(..., progress=False)`` prints no bar."""

from __future__ import annotations

from html import escape

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

import vrh_interp
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.evaluation.claims import claims_text


@pytest.fixture(scope="module")
def planted():
    return vrh_interp.load("toy:planted", progress=False)


@pytest.fixture(scope="module")
def scores(planted):
    return vrh_interp.score_heads(planted, synthetic_samples("detect", 6), "vrh", batch_size=6, progress=False)


def test_the_loaded_model_shows_a_card_not_its_module_tree(planted):
    text = repr(planted)
    assert len(text.splitlines()) <= 10 and "Linear(" not in text
    assert text.startswith("VLM vrh-interp/toy-planted")
    g = planted.geometry
    assert f"{g.num_layers} layers x {g.num_heads} heads" in text and planted.adapter.display_name in text
    assert "float32 on cpu" in text
    html = planted._repr_html_()
    assert "<table>" in html and "vrh-interp/toy-planted" in html and "Linear(" not in html


def test_head_scores_show_the_design_and_the_top_heads(scores):
    text = repr(scores)
    assert len(text.splitlines()) <= 10 and len(text) < 800
    assert f"{scores.num_layers} layers x {scores.num_heads} heads" in text and scores.design.label in text
    top = scores.top(5)
    assert ", ".join(f"{h} {scores.score_of(h):.3g}" for h in top) in text
    assert "6 scored" in text and "vrh-interp/toy-planted" in text
    html = scores._repr_html_()
    assert html.count("<tr>") <= 2 + 4 + 11 and str(top[0]) in html


def test_heatmap_is_a_figure_of_the_scores(scores):
    figure = scores.heatmap()
    assert isinstance(figure, Figure)
    np.testing.assert_array_equal(figure.axes[0].images[0].get_array(), scores.scores)


@pytest.fixture(scope="module")
def result(planted, scores):
    return vrh_interp.sweep(planted, synthetic_samples("eval", 6), scores, ks=(0, 1, 2), random_seeds=range(2),
                            batch_size=12, progress=False)


def test_sweep_results_show_accuracy_per_k_and_kind(result):
    text = repr(result)
    assert len(text.splitlines()) <= 10 and "6 samples" in text
    records = result.records
    for kind, k in (("top", 2), ("random", 2)):
        part = records[(records["kind"] == kind) & (records["k"] == k)]
        assert f"{kind} {(part['iou'] >= result.iou_threshold).mean():.2f}" in text  # pooled over the sets
    assert "random" in text and "(2 sets)" in text
    html = result._repr_html_()
    assert "<table" in html and "<table></table>" not in html and "random 2 sets" in html
    assert html.count("</tr>") == 1 + 1 + 3  # the controls row, one header row, k = 0, 1, 2
    assert isinstance(result.plot(), Figure)


def test_sweep_claims_display_whole(result):
    from vrh_interp.evaluation.table import ClaimsTable
    from vrh_interp.experiments.verdicts import sweep_claims

    expected = sweep_claims(result)
    table = result.claims()
    assert isinstance(table, ClaimsTable) and len(expected) == len(table) == 2  # k = 1, 2
    pd.testing.assert_frame_equal(table.frame, expected)
    text = repr(table)
    assert len(text.splitlines()) <= 15 and len(text.splitlines()) == 1 + len(expected)
    html = table._repr_html_()
    assert html.count("<tr>") == 1 + len(expected)
    for row in expected.to_dict(orient="records"):
        assert row["id"] in text and str(row["verdict"]).upper() in text
        for words in (row["claim"], row["reason"], row["numbers"], str(row["verdict"])):
            assert escape(str(words)) in html, words  # every word, not cut off
        assert f"{row['estimate']:.3g} [{row['ci_low']:.3g}, {row['ci_high']:.3g}]" in html
    assert str(table) == claims_text(expected)  # print(table): the terminal text


def test_progress_false_prints_no_loading_bar_and_restores_the_settings(capfd):
    from transformers.utils import logging as hf_logging

    from vrh_interp import toy

    before = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    toy.load("planted")
    assert "Loading weights" in capfd.readouterr().err  # the bar this guards against is real (transformers' own)
    vrh_interp.load("toy:planted", progress=False)
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()) == before


def test_a_toy_load_shows_no_loading_weights_bar_but_the_library_bars_stay(capfd):
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    vlm = vrh_interp.load("tiny:qwen2_vl")  # progress=True: the default
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()) == before
    vrh_interp.load("toy:planted")
    assert "Loading weights" not in capfd.readouterr().err
    vrh_interp.score_heads(vlm, synthetic_samples("detect", 2), "vrh", batch_size=2)  # progress=True
    assert "detect: scoring samples" in capfd.readouterr().err  # the library's own bar still shows
