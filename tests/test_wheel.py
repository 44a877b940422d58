"""The wheel ships the library, not its dev tooling: the NDIF server harness and its CPU actor (redis, Ray, a
server venv) live under tests/, the toy trainer under toy_training/; neither is packaged, the shipped toy
checkpoints and ``vrh_interp.toy.load`` are, and no shipped module imports the test suite, the trainer or the
server stack."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy of the sources (the trainer included): setuptools packs its build/lib folder, where a
    # module removed from the tree can linger from an earlier build of the checkout
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in ("vrh_interp", "toy_training"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    if built.returncode != 0 and "No module named" in built.stderr:
        pytest.skip(f"cannot build a wheel offline here: {built.stderr.strip().splitlines()[-1]}")
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("vrh_interp-*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_wheel_has_no_test_harness(wheel_names: list[str]) -> None:
    assert not [n for n in wheel_names if n.startswith("tests/") or "ndif_server" in n or "ndif_cpu_actor" in n]
    assert "vrh_interp/apps/cli.py" in wheel_names
    assert any(n.startswith("vrh_interp/toy/checkpoints/c/") for n in wheel_names)  # shipped models stay
    # the paper's lists, read by vrh_interp.core.description.published
    assert "vrh_interp/core/description/published_heads.json" in wheel_names
    assert "vrh_interp/core/description/published_qrhead.json" in wheel_names  # QRHead's text-LLM lists (MIT) ...
    # ... ship with their licence notice
    assert "vrh_interp/core/description/published_qrhead_LICENSE.txt" in wheel_names


def test_wheel_has_no_toy_trainer(wheel_names: list[str]) -> None:
    assert not [n for n in wheel_names if n.startswith("toy_training/")]
    assert not [n for n in wheel_names if n.startswith("vrh_interp/toy/") and
                n.rsplit("/", 1)[-1] in ("train.py", "recipe.py", "regime.py", "text_tasks.py", "tokenizer.py")]
    assert {"vrh_interp/toy/__init__.py", "vrh_interp/toy/configs.py", "vrh_interp/toy/planted.py"} <= set(wheel_names)


def test_shipped_modules_do_not_import_the_tests_the_trainer_or_the_server_stack(wheel_names: list[str]) -> None:
    forbidden = {"tests", "toy_training", "ray", "redis", "ndif", "pytest", "hypothesis"}
    offenders = []
    for name in wheel_names:
        if name.endswith(".py"):
            tree = ast.parse((ROOT / name).read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
                offenders += [f"{name}: {m}" for m in modules if m.split(".")[0] in forbidden  # ray: the [ray] extra
                              and not (m == "ray" and name == "vrh_interp/experiments/grid_execution.py")]
    assert not offenders, offenders
