"""Server-side half of the local NDIF harness: a CPU model actor and a deploy entry point.

NOT part of the importable library. ``tests.ndif_server`` copies this file, as the top-level
module ``vrh_ndif_cpu_actor``, into a temporary folder that is the only entry on the server processes'
``PYTHONPATH``; Ray workers import it from there (``NDIF_MODEL_IMPORT_PATH=vrh_ndif_cpu_actor.CPUModelActor``).
It runs in the SERVER's Python environment (ndif, ray, nnsight, transformers, torch) and must never import
``vrh_interp``: the point of the end-to-end test is that vrh_interp's trace templates run on a server that
does not have vrh_interp installed.

Why an actor subclass at all: ndif 0.1.2's stock ``ModelActor`` places the model with CUDA calls
(``torch.cuda.set_device``, ``synchronize``, ``empty_cache``, per-process memory limits, placement checks).
This subclass loads the model on CPU and overrides exactly the CUDA-touching methods; request execution
(``run`` / ``execute``: deserialise the traced block, run it, return the saves) is ndif's own, unchanged.

At construction the actor records what its process can import (``probe.json`` in ``$VRH_NDIF_PROBE_DIR``),
so the test can assert that vrh_interp was NOT importable where the templates ran.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
from typing import Any

import ray
from ndif.services.ray.deployments.modeling.base import KILL_REASON_PREEMPTED, BaseModelDeployment

PROBE_DIR_ENV = "VRH_NDIF_PROBE_DIR"


def record_probe() -> dict[str, Any]:
    """What this (server) process can import, written to ``$VRH_NDIF_PROBE_DIR/probe.json`` when set."""
    probe = {
        "pid": os.getpid(),
        "executable": sys.executable,
        "vrh_interp_importable": importlib.util.find_spec("vrh_interp") is not None,
        "sys_path": list(sys.path),
    }
    folder = os.environ.get(PROBE_DIR_ENV)
    if folder:
        tmp = os.path.join(folder, f"probe.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(probe, handle)
        os.replace(tmp, os.path.join(folder, "probe.json"))
    return probe


class CPUModelDeployment(BaseModelDeployment):
    """ndif's model actor with the model on CPU and every CUDA call removed.

    ``CACHEABLE = False``: parking (HOT -> WARM) only moves weights off a GPU, which there is none of here;
    the controller then evicts instead of parking.
    """

    CACHEABLE = False

    def load_from_disk(self) -> Any:
        from nnsight.modeling.huggingface import HuggingFaceModel

        record_probe()
        model = HuggingFaceModel.from_model_key(
            self.model_key, dispatch=True, dtype=self.dtype_name, device="cpu", **self.kwargs,
        )
        model._module.requires_grad_(False)
        return model

    async def to_cache(self) -> None:
        await self.cancel(KILL_REASON_PREEMPTED)
        self.cached = True

    def from_cache(self, gpu_mem_bytes_by_id: dict[int, int]) -> None:
        self.gpu_mem_bytes_by_id = gpu_mem_bytes_by_id
        self.cached = False

    def cleanup(self) -> None:
        self.kill_switch.clear()
        self.kill_reason = None
        self.execution_ident = None
        self.model.interleaver.cancel()
        gc.collect()


# max_restarts=0: in a test a crashing actor must surface as a failed deploy, not restart forever.
CPUModelActor = ray.remote(num_cpus=1, max_restarts=0)(CPUModelDeployment)


def deploy_main(argv: list[str]) -> int:
    """``python -m vrh_ndif_cpu_actor deploy SPEC_JSON``: deploy one model key via ndif's own deploy code.

    The key comes from the client (``TransformersModel.to_model_key()``) and ``size_bytes`` is given, so
    nothing asks the Hub (ndif 0.1.2's hub-based sizing calls nnsight with an argument 0.8.1 rejects).
    Prints one JSON line with ndif's result; exit status 0 only when the replica is READY.
    """
    from ndif.cli.lib.deploy import deploy

    spec = json.loads(argv[0])
    result = deploy([spec], ray_address=os.environ["NDIF_RAY_ADDRESS"],
                    redis_url=os.environ["NDIF_REDIS_URL"], on_message=lambda line: print(line, file=sys.stderr))
    print(json.dumps(result, default=str))
    states = [d.get("status") for d in result.get("deployments", [])]
    return 0 if states and all(s == "READY" for s in states) else 1


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "deploy":
        raise SystemExit(deploy_main(sys.argv[2:]))
    raise SystemExit("usage: python -m vrh_ndif_cpu_actor deploy SPEC_JSON")
