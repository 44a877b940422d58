"""Every notebook runs top to bottom (nbclient, python3 kernel), and matches its generator."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_notebooks_are_generated_from_build_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nb_build", NOTEBOOKS[0].parent / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert sorted(module.NOTEBOOKS) == [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        cells = [c.source for c in nbformat.read(path, as_version=4).cells]
        assert cells == [src for _, src in module.NOTEBOOKS[path.name]], f"{path.name} is stale: run notebooks/_build.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") in ("execute_result", "display_data", "stream") for o in outputs)
    if any("plots." in c.source for c in notebook.cells if c.cell_type == "code"):  # a figure shows as a picture
        assert any("image/png" in o.get("data", {}) for o in outputs), "figures shown as text: add %matplotlib inline"
