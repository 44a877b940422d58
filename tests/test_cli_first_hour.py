"""The first hour at the command line: help that shows defaults and a place to start, a fast `vrh --help`,
`vrh sweep` with its default k grid on the shipped toy, a verdict line, and terminal tables under 100 columns."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pandas as pd
import pytest

from vrh_interp.apps.cli import build_parser, main
from vrh_interp.apps.report import _read_table
from vrh_interp.toy import checkpoint_dir


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices)


def test_help_is_fast_because_nothing_heavy_is_imported():
    code = ("import sys; from vrh_interp.apps.cli import build_parser; build_parser().format_help(); "
            "heavy = [m for m in ('torch', 'transformers', 'pandas', 'nnsight') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_lazy_top_level_exports_resolve():
    """``import vrh_interp`` imports nothing heavy; each name of ``__all__`` is imported on first use."""
    code = ("import sys, vrh_interp; assert 'torch' not in sys.modules; "
            "missing = [n for n in vrh_interp.__all__ if getattr(vrh_interp, n, None) is None]; "
            "assert not missing, missing; "
            "from vrh_interp import sweep, load; assert callable(sweep) and callable(load)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_option_has_help_and_shows_its_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = build_parser().format_help()
    assert "start here" in text and max(len(line) for line in text.splitlines()) <= 100
    for name, sub in _subparsers().items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"vrh {name} {action.option_strings[0]} has no help"
            if action.default not in (None, False):
                assert f"default: {action.default}" in text or "default" in action.help, \
                    f"vrh {name} --help does not show the default of {action.option_strings[0]}"


@pytest.mark.skipif(not (checkpoint_dir("a") / "config.json").exists(), reason="toy A is not shipped here")
def test_sweep_defaults_fit_toy_a(tmp_path, capsys):
    """The default k grid (up to 20) does not fit toy A's 32 heads: the k whose controls cannot be drawn are
    dropped with a note, the verdict lines and a table under 100 columns print; an explicit --ks too large
    fails naming --ks and the largest usable k."""
    common = ["--model", "toy:a", "--batch-size", "32"]
    assert main(["detect", *common, "--data", "synthetic:detect:2", "--out", str(tmp_path / "d"), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)["scores_file"]
    sweep = ["sweep", *common, "--data", "synthetic:eval:2", "--scores", scores, "--random-sets", "1"]
    assert main([*sweep, "--out", str(tmp_path / "s")]) == 0
    printed = capsys.readouterr()
    note = " ".join(printed.err.split())
    assert "default --ks 0,1,3,5,10,20 trimmed to" in note and "pass --ks" in note
    assert "-> DOES NOT HOLD" in printed.out or "-> INCONCLUSIVE" in printed.out or "-> HOLDS" in printed.out
    assert "among 1 sets of each kind, so no smaller than 1/2 = 0.500" in " ".join(printed.out.split())
    assert max(len(line) for line in printed.out.splitlines() if str(tmp_path) not in line) <= 100
    summary = pd.read_csv(tmp_path / "s" / "sweep_summary.csv")
    assert 20 not in set(summary["k"]) and {0, 1, 3} <= set(summary["k"])
    assert main([*sweep, "--ks", "0,20", "--out", str(tmp_path / "s20")]) == 2
    error = capsys.readouterr().err
    assert "--ks" in error and "largest usable k" in error

    assert main(["report", str(tmp_path / "s")]) == 0
    assert "top-1 masked" in capsys.readouterr().out
    table = _read_table(tmp_path / "s" / "sweep_summary.csv")
    assert "nan" not in set(table["seed"]) | set(table["sets"]) and "-" in set(table["seed"])
    assert "## Verdict" in (tmp_path / "s" / "report.md").read_text()
