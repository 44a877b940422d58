"""Every notebook runs top to bottom (nbclient, python3 kernel), matches its generator, needs no magics, prints no
warnings or progress bars, and produces the same kinds of output as the outputs stored with it (which a code host and
the docs site show), so a stored output cannot silently go stale. And what a user sees in a fresh kernel with no
magics: figures as pictures, every result object in a few lines of text and as HTML, the claims table whole.
Skips (saying why) where nbformat, nbclient or ipykernel is not installed (the ``test`` extra)."""

from __future__ import annotations

import html
import importlib.util
import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat (pip install -e '.[test]')")
NotebookClient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient (pip install -e '.[test]')"
                                     ).NotebookClient
pytest.importorskip("ipykernel", reason="the notebook tests need a python3 kernel: pip install -e '.[test]'")

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
        assert any("image/png" in o.get("data", {}) for o in outputs), "figures shown as text, not as pictures"
    for index, (old, new) in enumerate(zip(stored.cells, notebook.cells)):
        if old.cell_type == "code" and old.outputs:
            assert output_kinds(new) == output_kinds(old), (
                f"{path.name} cell {index}: it now shows {output_kinds(new)}, the stored output shows "
                f"{output_kinds(old)}: run `python notebooks/_build.py --execute {path.name[:2]}`")


def test_notebooks_need_no_magics():
    """No ``%matplotlib inline`` (or any other magic or shell escape): a notebook runs as plain Python."""
    for path in NOTEBOOKS:
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "code":
                magics = [line for line in cell.source.splitlines() if line.lstrip().startswith(("%", "!"))]
                assert not magics, f"{path.name} cell {index} needs a magic: {magics}"


# What a user holds, built small on the positive control (the sizes of tests/test_display.py), then each object shown
# by a cell that ends in it, in a fresh kernel with no magics.
SETUP = """import json
import vrh_interp as vrh
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.patching.batch import baseline, prepare_pairs
from vrh_interp.patching.head_patching import patch_each_head
from vrh_interp.patching.pairs import make_pairs

vlm = vrh.load("toy:planted", progress=False)
scores = vrh.score_heads(vlm, synthetic_samples("detect", 4), batch_size=4, progress=False)
result = vrh.sweep(vlm, synthetic_samples("eval", 4), scores, ks=(0, 1, 2), random_seeds=range(2), batch_size=12,
                   progress=False)
pairs = make_pairs("referent_moved", 2)
batch = prepare_pairs(vlm, pairs, targets="ground_truth")
base = baseline(vlm, batch)
patched = patch_each_head(vlm, batch, base=base, heads=scores.top(4), progress=False)"""
SHOWN = {"VLM": "vlm", "family adapter": "vlm.adapter", "HeadScores": "scores", "SweepResult": "result",
         "claims table": "result.claims()", "Head": "vrh.Head(3, 2)", "HeadSet": "scores.top(5)",
         "all heads": "vlm.geometry.all_heads()", "PatchingPairs": "pairs", "PatchingPair": "pairs[0]",
         "PairBatch": "batch", "Baseline": "base", "HeadPatchingResult": "patched"}
FIGURES = {"HeadScores.heatmap()": "scores.heatmap()", "SweepResult.plot()": "result.plot()",
           "HeadPatchingResult.heatmap()": "patched.heatmap()"}
CLAIM_ROWS = 'print(json.dumps(result.claims().frame[["claim", "reason", "numbers"]].astype(str).to_dict("records")))'
MAX_TEXT_LINES = 15


@pytest.fixture(scope="module")
def fresh_kernel(tmp_path_factory) -> dict[str, list]:
    """The outputs of each cell, by name, of a notebook run in a fresh python3 kernel with no magics."""
    named = {"setup": SETUP, **SHOWN, **FIGURES, "claim rows": CLAIM_ROWS}
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in named.values()])
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path_factory.mktemp("fresh-kernel"))}}).execute()
    return {name: cell.outputs for name, cell in zip(named, notebook.cells)}


def _shown(outputs: list, name: str) -> dict:
    """The one rich output a cell ending in an object displays (and nothing else: no second copy, no text)."""
    assert [o["output_type"] for o in outputs] == ["execute_result"], f"{name}: {outputs}"
    return outputs[0]["data"]


@pytest.mark.parametrize("name", FIGURES)
def test_a_figure_shows_as_one_image_in_a_fresh_kernel_without_magics(fresh_kernel, name):
    """No ``%matplotlib inline``: a cell ending in a plot displays a PNG, once."""
    data = _shown(fresh_kernel[name], name)
    assert "image/png" in data, f"{name} shows as text, not a picture: {data.get('text/plain')!r}"


@pytest.mark.parametrize("name", SHOWN)
def test_every_object_a_user_holds_shows_in_a_few_lines_and_as_html(fresh_kernel, name):
    data = _shown(fresh_kernel[name], name)
    text = data["text/plain"]
    assert len(text.splitlines()) <= MAX_TEXT_LINES, f"{name}: {len(text.splitlines())} lines of text:\n{text}"
    assert " object at 0x" not in text, f"{name} shows Python's default repr: {text}"
    assert data.get("text/html", "").strip(), f"{name} has no HTML display (_repr_html_)"


def test_the_claims_table_shows_whole(fresh_kernel):
    """Every claim, every word of its reason and numbers, one row each: nothing cut off or elided."""
    shown = _shown(fresh_kernel["claims table"], "result.claims()")["text/html"]
    rows = json.loads("".join(o["text"] for o in fresh_kernel["claim rows"] if o["output_type"] == "stream"))
    assert len(rows) == 2  # the causal claim at k = 1 and k = 2
    assert shown.count("<tr>") == 1 + len(rows), "one header row and one row per claim"
    for row in rows:
        for column, words in row.items():
            assert html.escape(words) in shown, f"the claims table cuts its {column} off: {words!r}"
    assert "\u2026" not in shown and "..." not in shown
