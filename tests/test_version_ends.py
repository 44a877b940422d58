"""pyproject.toml's runtime dependencies are ranges (no pins), and tests/version_ends.py pins each floor."""

from __future__ import annotations

from tests.version_ends import floor_constraints, runtime_requirements


def test_runtime_dependencies_are_ranges_not_pins():
    requirements = runtime_requirements()
    assert {"nnsight", "transformers", "torch", "transformer-lens"} <= {r.split(">")[0].split("<")[0]
                                                                           for r in requirements}
    assert not [r for r in requirements if "==" in r], "a pinned runtime dependency: use a range (or say why)"


def test_the_lowest_end_pins_every_floor_but_torch():
    pins = floor_constraints(["torch>=2.6", "nnsight>=0.8.0,<0.9", "mkdocstrings[python]>=0.27", "pillow"])
    assert pins == ["nnsight==0.8.0", "mkdocstrings==0.27"]
    assert "transformers==" + next(r for r in runtime_requirements() if r.startswith("transformers>=")).split(
        ">=")[1].split(",")[0] in floor_constraints(runtime_requirements())
