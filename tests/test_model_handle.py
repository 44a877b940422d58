"""Issue 32, item 1: one model handle. The ``VLM`` says where it runs (``Placement``: backend and remote, set once
with ``vlm.on(...)``); no method threads ``remote`` by hand or takes ``backend=``, and no module outside
``vrh_interp/core/execution/backends/`` asks which backend runs. The scans below parse every module of the package;
each has a check that it fires on a small source holding the violation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import noise_image, tiny_vlm
from vrh_interp.core.execution.backends import BACKENDS

PACKAGE = Path(__file__).resolve().parents[1] / "vrh_interp"
BACKENDS_DIR = PACKAGE / "core" / "execution" / "backends"
# ``VLM.on(placement, *, backend, remote)``: where a placement is set
HANDLE = PACKAGE / "core" / "description" / "model.py"
PLACEMENT_PARAMETERS = ("remote", "backend")


def placement_parameters(source: str) -> list[tuple[str, str]]:
    """``(qualified function name, parameter)`` of every function (methods, nested functions and lambdas too) taking
    a parameter named ``remote`` or ``backend``."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{getattr(child, 'name', '<lambda>' if isinstance(child, ast.Lambda) else '')}"
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = child.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]:
                    if arg.arg in PLACEMENT_PARAMETERS:
                        found.append((name, arg.arg))
            visit(child, f"{name}." if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  else prefix)

    visit(ast.parse(source), "")
    return found


def backend_name_comparisons(source: str) -> list[int]:
    """Lines comparing something with a backend's name (``== "nnsight"``, ``!= "transformer-lens"``,
    ``in ("nnsight", ...)``): asking which backend runs."""
    def names_a_backend(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in BACKENDS
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_backend(e) for e in node.elts)
        return False

    return sorted({node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
                   and any(names_a_backend(side) for side in [node.left, *node.comparators])})


def _modules(skip: tuple[Path, ...]) -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not any(p == s or s in p.parents for s in skip)]


def test_no_method_takes_remote_or_backend():
    found = {f"{path.relative_to(PACKAGE.parent)}::{name}": parameter for path in _modules((BACKENDS_DIR, HANDLE))
             for name, parameter in placement_parameters(path.read_text())}
    assert not found, ("functions taking a placement by hand (the handle holds it: vlm.on(backend=..., remote=...); "
                       f"a runner that loads its own model takes placement=): {found}")


def test_no_module_outside_the_backends_asks_which_backend_runs():
    found = {str(path.relative_to(PACKAGE.parent)): lines for path in _modules((BACKENDS_DIR,))
             if (lines := backend_name_comparisons(path.read_text()))}
    assert not found, ("backend-name comparisons outside vrh_interp/core/execution/backends/ (use a declaration of the "
                       f"backend: backend_config, ablation_kinds, operations, runs_remotely): {found}")


def test_the_parameter_scan_fires():
    source = ("def f(vlm, *, remote=False):\n    pass\n\n\nclass C:\n    def m(self, backend):\n        pass\n\n\n"
              "def g(vlm, placement):\n    h = lambda remote: remote\n    return h\n")
    assert placement_parameters(source) == [("f", "remote"), ("C.m", "backend"), ("g.<lambda>", "remote")]
    assert placement_parameters("def f(vlm, remote_id=None):\n    pass\n") == []


def test_the_comparison_scan_fires():
    source = ('if backend != "nnsight":\n    pass\nok = run.name == "transformer-lens"\n'
              'x = name in ("nnsight", "jax")\ny = {"nnsight": 1}\nz = "nnsight"\n')
    assert backend_name_comparisons(source) == [1, 3, 4]


def test_on_places_a_handle_that_shares_the_model():
    from vrh_interp.core.description.model import LOCAL, Placement

    vlm = tiny_vlm("llava")
    assert vlm.placement == LOCAL and vlm.remote is False and vlm.backend_name == "nnsight"
    nn = vlm.nn
    remote = vlm.on(remote="local")
    assert (remote.remote, remote.backend_name) == ("local", "nnsight") and vlm.remote is False
    assert remote.hf_model is vlm.hf_model and remote.processor is vlm.processor and remote.nn is nn
    assert remote.on(remote="local") is remote and vlm.on() is vlm and remote.on(LOCAL).placement == LOCAL
    assert vlm.on(Placement("transformer-lens")).on(remote=True).placement == Placement("transformer-lens", True)
    assert "runs on" in repr(remote) and "runs on" not in repr(vlm)
    with pytest.raises(ValueError, match="unknown backend 'jax'"):
        vlm.on(backend="jax")
    with pytest.raises(TypeError, match="remote must be a bool or a host string"):
        vlm.on(remote=1)


def test_a_placed_handle_shares_one_nnsight_wrapper_built_after_placing():
    from vrh_interp.core.description.model import wrap
    from vrh_interp.core.description.tiny import build_tiny

    tiny = build_tiny("qwen2_vl")
    vlm = wrap(tiny.model, tiny.processor)  # a fresh model: no wrapper yet
    remote = vlm.on(remote="local")
    assert remote.nn is vlm.nn  # wrapping twice would replace the forwards twice


def test_the_interventions_read_where_the_handle_runs(monkeypatch):
    """``run_forward`` passes the handle's ``remote`` to nnsight (no parameter of its own)."""
    import torch

    from vrh_interp.core.execution import interventions as iv

    vlm = tiny_vlm("llava")
    batch = vlm.encode_grounding([noise_image(40, 40)], ["the red circle"])
    seen: list[object] = []
    trace = type(vlm.nn).trace

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("remote"))
        return trace(self, *args, **kwargs)

    monkeypatch.setattr(type(vlm.nn), "trace", spy)
    local = iv.run_forward(vlm, batch.encoding).logits
    serialised = iv.run_forward(vlm.on(remote="local"), batch.encoding).logits
    assert seen == [False, "local"] and torch.equal(local, serialised)


def test_a_method_that_traces_with_nnsight_refuses_a_handle_placed_elsewhere():
    """The handle says where it runs: a method that traces the model itself (interventions, patching, probes,
    overlays) refuses a handle placed on TransformerLens in one line instead of running on nnsight silently. Nothing
    is built (no bridge: TransformerLens need not be installed)."""
    from vrh_interp.core.execution import interventions as iv
    from vrh_interp.data import grounding_samples
    from vrh_interp.viz.overlays import prediction_overlays

    vlm = tiny_vlm("llava")
    lens = vlm.on(backend="transformer-lens")
    assert vlm.runs_nnsight_traces and not lens.runs_nnsight_traces
    batch = lens.encode_grounding([noise_image(40, 40)], ["the red circle"])  # encoding needs no backend
    for run in (lambda: iv.run_forward(lens, batch.encoding),
                lambda: iv.run_generate(lens, batch.encoding, max_new_tokens=2),
                lambda: prediction_overlays(lens, grounding_samples("eval", 0)[0], vlm.geometry.all_heads())):
        with pytest.raises(iv.NotNnsightError, match="placed on the transformer-lens backend.*--backend nnsight"):
            run()
    assert lens._backend is None
