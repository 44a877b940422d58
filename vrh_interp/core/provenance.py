"""Provenance attached to every result file: what produced it, so a head list can be reproduced."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
from typing import Any

from vrh_interp.core.model import VLM


def library_versions() -> dict[str, str]:
    versions = {}
    for name in ("vrh-interp", "torch", "transformers", "nnsight", "transformer-lens", "numpy", "pandas"):
        try:
            versions[name] = _md.version(name)
        except _md.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def model_provenance(vlm: VLM) -> dict[str, Any]:
    g = vlm.geometry
    return {
        "model_id": vlm.model_id,
        "revision": vlm.revision,
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
