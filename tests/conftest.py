"""Shared fixtures: one tiny random-weight VLM per family, built once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from PIL import Image

from vrh_interp.core.description.model import VLM, wrap
from vrh_interp.core.description.tiny import TINY_FAMILIES, build_tiny

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests build or ship their models: never ask a hub

_BUILT: dict[str, VLM] = {}


def tiny_vlm(family: str) -> VLM:
    """The wrapped tiny fixture of ``family`` (cached: building takes seconds)."""
    if family not in _BUILT:
        tiny = build_tiny(family, seed=0)
        _BUILT[family] = wrap(tiny.model, tiny.processor)
    return _BUILT[family]


def noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for the test, restored after: the toy trainer's runs and the NDIF actor's local
    references (CPU reductions can depend on the thread count; 2 spinning threads on a shared CPU are ~5x
    slower without OMP_WAIT_POLICY=PASSIVE)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(params=TINY_FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


# Test tiers (markers in pyproject.toml), by file: `pytest -m unit` is the fast development loop, `pytest -m "not
# e2e"` everything but whole programs; the README's `python -m pytest -q` runs all of them.
E2E_FILES = {"test_cli.py", "test_cli_first_hour.py", "test_cli_hostile.py", "test_cli_paths.py",
             "test_cli_parsing.py", "test_docs.py", "test_ndif_server.py", "test_notebooks.py",
             "test_report_browser.py", "test_wheel.py", "test_lint.py", "test_run_lock.py"}
INTEGRATION_FILES = {"test_condition_batching.py", "test_cross_masking.py", "test_head_scan.py", "test_planted.py",
                     "test_resume.py", "test_shared_prefix.py", "test_toy_cd.py", "test_toy_models.py",
                     "test_toy_recipe.py", "test_set_statistics.py", "test_shards.py", "test_published.py",
                     "test_patching.py", "test_patching_metric.py", "test_patching_remote.py", "test_probes.py",
                     "test_real_shape_benchmark.py", "test_protocol_speed_benchmark.py",
                     "test_reproduce.py", "test_backends.py", "test_grid.py", "test_display.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = item.path.name
        tier = "e2e" if name in E2E_FILES else "integration" if name in INTEGRATION_FILES else "unit"
        item.add_marker(getattr(pytest.mark, tier))
