"""The one model-spec resolver: ``toy:NAME`` (a shipped toy), ``tiny:FAMILY`` (a random-weight fixture), a local
folder or a hub id. The CLI, the demo, reproduce, the benchmarks and the notebooks all load through it; it sits above
``core`` (which loads folders and hub ids) because the toys are a package of their own."""

from __future__ import annotations

import os
from typing import Any

from vrh_interp.core.families import FamilyAdapter
from vrh_interp.core.model import VLM, cast_model, load_pretrained, wrap
from vrh_interp.core.model_source import check_device, loading_output, parse_dtype

BUILTIN_PREFIXES = ("toy:", "tiny:")


def load(model_id_or_path: str | os.PathLike[str], *, device_map: Any = None, dtype: Any = None,
         revision: str | None = None, trust_remote_code: bool = False, adapter: FamilyAdapter | None = None,
         attn_implementation: str | None = None, remote_id: str | None = None, attention: Any = None,
         progress: bool = True, **from_pretrained_kwargs: Any) -> VLM:
    """Load a model spec and wrap it: a hub id or a local folder, ``toy:NAME`` (a shipped toy model) or
    ``tiny:FAMILY`` (a random-weight fixture, for trying the pipeline, not for results). Hub ids and folders go
    to ``vrh_interp.core.model.load_pretrained`` (its docstring: attention implementation, remote code).
    ``progress=False``: no download or "Loading weights" bars and no transformers info lines."""
    spec = os.fspath(model_id_or_path)
    if not spec.startswith(BUILTIN_PREFIXES):
        return load_pretrained(spec, device_map=device_map, dtype=dtype, revision=revision,
                               trust_remote_code=trust_remote_code, adapter=adapter,
                               attn_implementation=attn_implementation, remote_id=remote_id, attention=attention,
                               progress=progress, **from_pretrained_kwargs)
    check_device(device_map)
    with loading_output(progress):
        vlm = _load_builtin(spec, device_map)
    if dtype is None and adapter is None and attention is None:
        return vlm
    return wrap(vlm.hf_model if dtype is None else cast_model(vlm.hf_model, dtype), vlm.processor, adapter=adapter,
                model_id=vlm.model_id, remote_id=vlm.remote_id, attention=attention)


def _load_builtin(spec: str, device: Any = None) -> VLM:
    """``toy:NAME`` and ``tiny:FAMILY`` specs (no hub, no network)."""
    kind, name = spec.split(":", 1)
    if kind == "tiny":
        from vrh_interp.core.tiny import build_tiny

        tiny = build_tiny(name)
        return wrap(tiny.model, tiny.processor, model_id=spec)
    from vrh_interp import toy

    model, processor = toy.load(name, device=device or "cpu")
    # the id an NDIF server deploys a toy model under (`--remote`; the toys are not on the hub)
    return wrap(model, processor, model_id=f"vrh-interp/toy-{name}", remote_id=f"vrh-interp/toy-{name}")


def load_spec(spec: str | os.PathLike[str], device: str | None = None, dtype: str | None = None) -> VLM:
    """The one resolver for model specs given as text (CLI, demo, reproduce, benchmarks, notebooks):
    ``toy:a``, ``toy:planted``, ``tiny:qwen2_vl``, a local folder or a hub id; ``dtype`` by name
    (``"bfloat16"``), ``device`` as ``from_pretrained``'s ``device_map``."""
    text = os.fspath(spec)
    check_device(device)
    torch_dtype = parse_dtype(dtype)
    return load(text, device_map=device, dtype=torch_dtype)
