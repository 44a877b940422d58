"""Every notebook runs top to bottom (nbclient, python3 kernel), matches its generator, prints no warnings or
progress bars, and produces the same kinds of output as the outputs stored with it (which a code host and the
docs site show), so a stored output cannot silently go stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))
# notebooks whose outputs are not stored yet (`python notebooks/_build.py --execute NAME` stores them), and why
AWAITING_OUTPUTS: dict[str, str] = {}


def _build_module():
    spec = importlib.util.spec_from_file_location("nb_build", HERE / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def output_kinds(cell) -> list[tuple[str, ...]]:
    """What a code cell shows, without the values: (output type, stream name or the rich MIME types)."""
    kinds = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            kinds.append(("stream", output["name"]))
        else:
            kinds.append((output["output_type"], *sorted(m for m in output.get("data", {}) if m != "text/plain")))
    return kinds


def test_notebooks_are_generated_from_build_script():
    module = _build_module()
    assert sorted(module.NOTEBOOKS) == [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        cells = [c.source for c in nbformat.read(path, as_version=4).cells]
        assert cells == [src for _, src in module.NOTEBOOKS[path.name]], (
            f"{path.name} is stale: run notebooks/_build.py")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebooks_ship_with_outputs(path):
    if path.name in AWAITING_OUTPUTS:
        pytest.skip(f"{path.name}: outputs not stored yet ({AWAITING_OUTPUTS[path.name]})")
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    missing = [i for i, c in enumerate(cells) if not c.outputs]
    assert not missing, f"{path.name}: code cells {missing} have no stored output: run " \
                        f"`python notebooks/_build.py --execute {path.name[:2]}`"
    images = [o["data"]["image/png"] for c in cells for o in c.outputs if "image/png" in o.get("data", {})]
    assert all(len(png) < 150_000 for png in images), "a stored figure is over 150 kB: compress it (_build.py does)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    stored = nbformat.read(path, as_version=4)
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") in ("execute_result", "display_data", "stream") for o in outputs)
    noise = [o.text[:200] for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert not noise, f"{path.name} writes warnings or progress bars to its output: {noise}"
    if any("plots." in c.source for c in notebook.cells if c.cell_type == "code"):  # a figure shows as a picture
        assert any("image/png" in o.get("data", {}) for o in outputs), "figures shown as text: add %matplotlib inline"
    for index, (old, new) in enumerate(zip(stored.cells, notebook.cells)):
        if old.cell_type == "code" and old.outputs:
            assert output_kinds(new) == output_kinds(old), (
                f"{path.name} cell {index}: it now shows {output_kinds(new)}, the stored output shows "
                f"{output_kinds(old)}: run `python notebooks/_build.py --execute {path.name[:2]}`")


def test_a_figure_shows_as_one_image_in_a_fresh_kernel_without_magics(tmp_path):
    """No ``%matplotlib inline``: a cell ending in ``heatmap()`` displays a PNG, once, and no ``<Figure ...>`` text."""
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import numpy as np\n"
                                  "from vrh_interp.scoring.design import ScoringDesign\n"
                                  "from vrh_interp.scoring.scores import HeadScores\n"
                                  "scores = HeadScores(np.arange(12.0).reshape(3, 4), ScoringDesign())"),
        nbformat.v4.new_code_cell("scores.heatmap()"),
    ])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = notebook.cells[1].outputs
    assert [o["output_type"] for o in outputs] == ["execute_result"], outputs
    assert "image/png" in outputs[0]["data"]
