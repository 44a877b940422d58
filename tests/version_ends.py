"""Both ends of the dependency ranges: install the lowest and the newest allowed versions, run the tests on each.

``python -m tests.version_ends`` builds one virtual environment per end (``--venv-prefix``, default
``/tmp/vrh-version-ends``, so ``...-lowest`` and ``...-newest``), installs this checkout with the ``tl`` and ``test``
extras, and runs ``pytest -m <tiers>`` (default ``unit``; ``--tiers "unit or integration"`` for both tiers) from the
checkout. The ends:

* ``lowest``: every runtime dependency of pyproject.toml (``[project] dependencies`` and the ``tl`` extra) pinned to
  its floor (``>=X`` becomes ``==X``) through a constraints file; the test tools are not pinned.
* ``newest``: the same install with ``--upgrade --upgrade-strategy eager``: the newest releases the ranges allow.

Both ends keep the torch installed first (a constraint), whatever the ranges allow.

torch is installed first, from ``--torch`` (default ``torch==2.13.0``, the CPU wheel this project's machines hold
locally: an unpinned torch pulls a multi-GB CUDA build), on both ends, so torch's own floor is not exercised.
It takes 5-10 minutes per end on 2 cores (the installs, then the unit tier), so .ci/run does not run it by default;
docs/install.md ("Tested versions") records the last result. Exit status 1 if any end fails to install or to pass.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTED = ("torch", "transformers", "nnsight", "transformer-lens", "accelerate", "numpy", "pandas", "pyarrow",
            "matplotlib", "tokenizers", "safetensors", "pillow")


def runtime_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The runtime requirements: ``[project] dependencies`` and the ``tl`` extra (TransformerLens)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["tl"])


def floor_constraints(requirements: list[str]) -> list[str]:
    """``name==floor`` for every requirement with a ``>=`` floor, torch excepted (installed on its own)."""
    pins = []
    for requirement in requirements:
        match = re.match(r"^\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(.*)$", requirement)
        name, spec = match.group(1), match.group(2)
        floor = re.search(r">=\s*([0-9][^,;\s]*)", spec)
        if floor and name.lower() != "torch":
            pins.append(f"{name}=={floor.group(1)}")
    return pins


def _run(command: list[str], log: Path, **kwargs) -> int:
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **kwargs).returncode


def run_end(end: str, venv: Path, torch_requirement: str, tiers: str, pytest_args: list[str]) -> dict:
    log = venv.with_name(venv.name + ".log")
    log.write_text("")
    started = time.monotonic()
    result = {"end": end, "venv": str(venv), "log": str(log)}
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # torch stays the one installed first (an upgrade would pull a CUDA build); the lowest end pins every floor
    constraints = venv / "constraints.txt"
    floors = floor_constraints(runtime_requirements()) if end == "lowest" else []
    constraints.write_text("\n".join([torch_requirement, *floors]) + "\n")
    install = [python, "-m", "pip", "install", "--progress-bar", "off", "-e", f"{ROOT}[tl,test]",
               "-c", str(constraints)]
    if end == "newest":
        install += ["--upgrade", "--upgrade-strategy", "eager"]
    if _run([python, "-m", "pip", "install", "-q", torch_requirement], log) or _run(install, log):
        return result | {"status": "install failed", "seconds": round(time.monotonic() - started)}
    result["install_s"] = round(time.monotonic() - started)
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "freeze"], capture_output=True, text=True).stdout
    versions = dict(line.split("==", 1) for line in listed.splitlines() if "==" in line)
    lowered = {name.lower().replace("_", "-"): version for name, version in versions.items()}
    result["versions"] = {name: lowered.get(name, "-") for name in REPORTED}
    tests = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", tiers, *pytest_args]
    code = _run(tests, log, cwd=ROOT, env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                                          "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home())})
    summary = [line for line in log.read_text().splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    result.update(status="passed" if code == 0 else f"pytest exit {code}", tests=summary[-1] if summary else "",
                  seconds=round(time.monotonic() - started))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ends", default="lowest,newest", help="comma-separated: lowest, newest")
    parser.add_argument("--venv-prefix", default="/tmp/vrh-version-ends", help="venvs at PREFIX-lowest, -newest")
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement installed first")
    parser.add_argument("--tiers", default="unit", help="pytest -m expression (default: unit)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (e.g. tests/test_remote_timeouts.py)")
    args = parser.parse_args(argv)
    failed = False
    for end in args.ends.split(","):
        if end not in ("lowest", "newest"):
            parser.error(f"unknown end {end!r}: use lowest and/or newest")
        result = run_end(end, Path(f"{args.venv_prefix}-{end}"), args.torch, args.tiers, args.pytest_args)
        failed |= result["status"] != "passed"
        versions = ", ".join(f"{k} {v}" for k, v in result.get("versions", {}).items())
        print(f"{end}: {result['status']} in {result['seconds']} s ({result.get('tests', '')}); {versions}; "
              f"log {result['log']}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
