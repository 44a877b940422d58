"""How the model travels through the package: follow the model object through ``run_reproduce`` (the protocol behind
``vrh reproduce``) and through the patching study (``detect_and_study``, behind ``vrh patch``), and count the modules
its calls enter.

Every function of ``vrh_interp`` whose arguments (``self`` included) hold the model handle is logged with its module
the FIRST time it is called: the ``VLM``, its ``hf_model``, its nnsight wrapper, or any object whose ``vlm`` is it
(a backend, a condition runner). So the path is the code the handle travels through, each function once (a
template's per-layer, per-step calls do not repeat it). Consecutive functions of one module are one visit.
Reported per flow:

* ``modules``: distinct modules the handle visits;
* ``visits``: entries into a module (the path moved from another module into it);
* ``returns``: visits to a module the path had already left (``visits - modules``): the bouncing;
* ``top``: the modules visited most often, with their visit counts;
* ``calls``: every call with the handle, repeats included (per layer, per step), for scale.

Sizes are the tests' (tiny random models: the flow, not the numbers, is measured). Run it against any tree with
``PYTHONPATH=TREE``; docs/architecture.md quotes it before and after a change:

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/model_flow.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable


def _follow(run: Callable[[Callable[[Any], None]], None]) -> dict[str, Any]:
    """Run ``run(track)``, where ``run`` calls ``track(vlm)`` as soon as it holds the model, under a profiler that
    logs the module of every ``vrh_interp`` call whose arguments hold the handle."""
    import vrh_interp

    root = str(Path(vrh_interp.__file__).parent) + "/"
    handles: set[int] = set()
    target: list[Any] = []
    visits: list[str] = []
    seen: set[Any] = set()
    calls = [0]

    def holds(value: Any) -> bool:
        if id(value) in handles:
            return True
        inner = getattr(value, "__dict__", None)
        return bool(inner) and id(inner.get("vlm")) in handles

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(root) or not handles:
            return
        if target and target[0]._nnsight_model is not None:
            handles.add(id(target[0]._nnsight_model))
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(holds(frame.f_locals.get(name)) for name in names):
            calls[0] += 1
            if code in seen:
                return
            seen.add(code)
            module = filename[len(root):]
            if not visits or visits[-1] != module:
                visits.append(module)

    def track(vlm: Any) -> None:
        target.append(vlm)
        handles.update({id(vlm), id(vlm.hf_model)})

    sys.setprofile(profile)
    try:
        run(track)
    finally:
        sys.setprofile(None)
    counts = Counter(visits)
    return {"modules": len(counts), "visits": len(visits), "returns": len(visits) - len(counts),
            "top": dict(counts.most_common(6)), "calls": calls[0]}


def reproduce_flow(folder: Path) -> dict[str, Any]:
    """``run_reproduce`` on the tiny random Qwen2-VL at tests/datasets/test_reproduce.py's sizes."""
    from tests.datasets import fixtures
    from vrh_interp import specs
    from vrh_interp.experiments.reproduce import run_reproduce

    fixtures.write_lmms_refcoco(folder / "refcoco", fixtures.lmms_rows(14))
    fixtures.write_cvbench(folder / "cv", [{"idx": i, "choices": ["2", "3"], "answer": "(B)"} for i in range(2)])
    fixtures.write_countbench(folder / "count", [2, 5])
    vqa = [f"cvbench:{folder / 'cv'}", f"countbench:{folder / 'count'}"]

    def run(track: Callable[[Any], None]) -> None:
        real = specs.load_spec

        def loaded(*args: Any, **kwargs: Any) -> Any:
            vlm = real(*args, **kwargs)
            track(vlm)
            return vlm

        specs.load_spec = loaded
        try:
            run_reproduce("tiny:qwen2_vl", f"lmms-refcoco:{folder / 'refcoco'}", vqa, folder / "run", detect_count=6,
                          batch_size=8, max_new_tokens=12, progress=False)
        finally:
            specs.load_spec = real

    return _follow(run)


def patching_flow(folder: Path) -> dict[str, Any]:
    """``detect_and_study`` on the tiny LLaVA at tests/test_cli.py's sizes, detection included."""
    from vrh_interp.experiments.patching_study import detect_and_study
    from vrh_interp.specs import load_spec

    vlm = load_spec("tiny:llava")

    def run(track: Callable[[Any], None]) -> None:
        track(vlm)
        detect_and_study(vlm, folder / "patch", detect_scenes=4, top=2, pairs_per_kind=2, probe_scenes=12,
                         random_seeds=[0], targets="ground_truth", progress=False)

    return _follow(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        flows = {"reproduce": reproduce_flow(Path(tmp) / "r"), "patching study": patching_flow(Path(tmp) / "p")}
    if args.json:
        print(json.dumps(flows))
        return
    for name, flow in flows.items():
        print(f"{name}: {flow['modules']} modules, {flow['visits']} visits, {flow['returns']} returns to a module "
              f"already left ({flow['calls']} calls with the model); most visited: "
              f"{', '.join(f'{m} x{n}' for m, n in flow['top'].items())}")


if __name__ == "__main__":
    main()
