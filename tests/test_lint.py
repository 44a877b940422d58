"""The linter gate: ``ruff check`` with the configuration in pyproject.toml ([tool.ruff]: syntax errors, pyflakes,
lines <= 120 characters) passes on the package, the tests, the benchmarks, the docs generators and the notebooks.

Ruff is part of the ``test`` extra; where it is not installed the test skips and says how to install it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# directories, so ruff also finds the stored notebooks (.ipynb) beside notebooks/_build.py
CHECKED = ("vrh_interp", "toy_training", "tests", "benchmarks", "docs", "notebooks")


def _ruff() -> list[str] | None:
    """Ruff as a module of this interpreter (the ``test`` extra installs it there), else on PATH."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    return [found] if found else None


def test_ruff_check_passes_with_the_project_configuration() -> None:
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed: pip install -e '.[test]' (or pip install 'ruff>=0.6')")
    done = subprocess.run([*ruff, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), *CHECKED],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"ruff check failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
