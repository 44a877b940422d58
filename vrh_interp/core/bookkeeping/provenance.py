"""Provenance attached to every result file: what produced it, so a head list can be reproduced."""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as _md
from typing import Any

import torch

from vrh_interp.core.description.model import VLM

FINGERPRINT_VALUES = 1024  # evenly spaced values read from each parameter (all of a smaller one)


def library_versions() -> dict[str, str]:
    versions = {}
    for name in ("vrh-interp", "torch", "transformers", "nnsight", "transformer-lens", "numpy", "pandas"):
        try:
            versions[name] = _md.version(name)
        except _md.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def weights_fingerprint(model: torch.nn.Module) -> str | None:
    """SHA-256 over every parameter's name, shape, dtype and up to ``FINGERPRINT_VALUES`` evenly spaced values.

    What tells two sets of weights apart where a name does not: a local folder retrained in place, a toy of
    another version, weights edited in a notebook. Run folders record it (``model_provenance``), so resuming into
    a folder made with other weights is refused instead of mixing their records. Sampled, not every value: cheap
    on a 7B model, and any training step or edit of a whole tensor moves the sampled values. ``None`` when the
    weights are not in memory (a remote NDIF model: its hub id and revision identify it).
    """
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        if parameter.is_meta:
            return None
        flat = parameter.detach().reshape(-1)
        if flat.numel() > FINGERPRINT_VALUES:  # integer positions: the same on every device and for any size
            index = torch.arange(FINGERPRINT_VALUES, dtype=torch.int64) * (flat.numel() - 1) // (FINGERPRINT_VALUES - 1)
            flat = flat[index.to(flat.device)]
        digest.update(f"{name}:{tuple(parameter.shape)}:{parameter.dtype};".encode())
        digest.update(flat.to("cpu", torch.float64).numpy().tobytes())
    return digest.hexdigest()


def model_provenance(vlm: VLM) -> dict[str, Any]:
    g = vlm.geometry
    return {
        "model_id": vlm.model_id,
        "revision": vlm.revision,
        "weights": weights_fingerprint(vlm.hf_model),
        "family": vlm.adapter.name,
        "architecture": type(vlm.hf_model).__name__,
        "geometry": {"layers": g.num_layers, "heads": g.num_heads, "kv_heads": g.num_kv_heads, "head_dim": g.head_dim},
        "dtype": str(next(vlm.hf_model.parameters()).dtype),
        "prompt_template": vlm.adapter.grounding_prompt(vlm.processor, "{expression}"),
        "box_format": vlm.adapter.box_format,
    }


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def remote_provenance(vlm: VLM) -> bool | str:
    """What a result records of where ``vlm`` ran (``vlm.remote``): ``False``, ``"local"`` or ``True``.

    A host given as ``vlm.on(remote="https://...")`` is recorded as ``True``: neither the host nor nnsight's API key
    (``nnsight.CONFIG.API.APIKEY``) is ever written to a result or run folder.
    """
    remote = vlm.remote
    if remote == "local":
        return "local"
    return bool(remote)
