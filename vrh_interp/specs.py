"""The one model-spec resolver: ``toy:NAME`` (a shipped toy), ``tiny:FAMILY`` (a random-weight fixture), a local
folder or a hub id. The CLI, the demo, reproduce, the benchmarks and the notebooks all load through it; it sits above
``core`` (which loads folders and hub ids) because the toys are a package of their own."""

from __future__ import annotations

import difflib
import os
from typing import Any

from vrh_interp.core.description.families import FamilyAdapter
from vrh_interp.core.description.model import VLM, cast_model, load_pretrained, wrap
from vrh_interp.core.description.model_source import DEVICE_MAP_NAMES, check_device, loading_output, parse_dtype

BUILTIN_PREFIXES = ("toy:", "tiny:")


# the keywords ``load`` itself names (a toy or tiny spec takes these and no other)
LOAD_KEYWORDS = ("device_map", "dtype", "revision", "trust_remote_code", "adapter", "attn_implementation",
                 "remote_id", "attention", "progress")


def load(model_id_or_path: str | os.PathLike[str], *, device_map: Any = None, dtype: Any = None,
         revision: str | None = None, trust_remote_code: bool = False, adapter: FamilyAdapter | None = None,
         attn_implementation: str | None = None, remote_id: str | None = None, attention: Any = None,
         progress: bool = True, **from_pretrained_kwargs: Any) -> VLM:
    """Load a model spec and wrap it: a hub id or a local folder, ``toy:NAME`` (a shipped toy model) or
    ``tiny:FAMILY`` (a random-weight fixture, for trying the pipeline, not for results). Hub ids and folders go
    to ``vrh_interp.core.description.model.load_pretrained`` (its docstring: attention implementation, remote code),
    with any further keyword passed to ``from_pretrained``. Every keyword is honoured for every spec or refused in one
    line: ``attn_implementation="eager"`` loads a toy with eager attention (``self_attn.output[1]`` in a trace is then
    the attention pattern), a misspelt keyword (``attn_implementaton``) is refused, naming the accepted ones.
    ``progress=False``: no download or "Loading weights" bars and no transformers info lines; a ``toy:`` / ``tiny:``
    spec never shows transformers' "Loading weights" bar (it loads in about a second)."""
    spec = os.fspath(model_id_or_path)
    _refuse_misspelt(spec, from_pretrained_kwargs)
    if not spec.startswith(BUILTIN_PREFIXES):
        return load_pretrained(spec, device_map=device_map, dtype=dtype, revision=revision,
                               trust_remote_code=trust_remote_code, adapter=adapter,
                               attn_implementation=attn_implementation, remote_id=remote_id, attention=attention,
                               progress=progress, **from_pretrained_kwargs)
    device = _builtin_device(spec, device_map)
    refused = [*from_pretrained_kwargs, *(["revision"] if revision is not None else []),
               *(["trust_remote_code"] if trust_remote_code else [])]
    if refused:
        raise ValueError(f"load({spec!r}) does not take {', '.join(f'{k}=' for k in refused)}: a built-in spec "
                         f"(toy:, tiny:) has no revisions, runs no remote code and takes only "
                         f"{', '.join(LOAD_KEYWORDS[:2] + LOAD_KEYWORDS[4:])}")
    check_device(device)
    with loading_output(progress, bars=False):  # a toy loads in a second: transformers' "Loading weights" bar is noise
        vlm = _load_builtin(spec, device)
    if attn_implementation is not None:
        try:
            vlm.hf_model.set_attn_implementation(attn_implementation)
        except (ValueError, ImportError) as error:
            raise ValueError(f"load({spec!r}, attn_implementation={attn_implementation!r}): {error}") from None
    if dtype is None and adapter is None and attention is None and remote_id is None:
        return vlm
    return wrap(vlm.hf_model if dtype is None else cast_model(vlm.hf_model, dtype), vlm.processor, adapter=adapter,
                model_id=vlm.model_id, remote_id=remote_id or vlm.remote_id, attention=attention)


def _refuse_misspelt(spec: str, extra: dict[str, Any]) -> None:
    """A keyword within a typo of one ``load`` names (``attn_implementaton``) is refused for every spec."""
    for key in extra:
        close = difflib.get_close_matches(key, LOAD_KEYWORDS, n=1, cutoff=0.8)
        if close:
            raise ValueError(f"load({spec!r}) got the unknown keyword {key}=: did you mean {close[0]}=? load takes "
                             f"{', '.join(LOAD_KEYWORDS)} (and, for hub ids and folders, from_pretrained keywords)")


def _builtin_device(spec: str, device_map: Any) -> Any:
    """The one device a built-in spec loads on: None (cpu), a device string or ``torch.device``; "auto" is cuda
    where there is one, else cpu. A per-module device map has nothing to spread a toy over."""
    if device_map == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if device_map is None or (isinstance(device_map, str) and device_map not in DEVICE_MAP_NAMES):
        return device_map
    if type(device_map).__name__ == "device":  # a torch.device
        return str(device_map)
    raise ValueError(f"load({spec!r}, device_map={device_map!r}): a built-in spec loads on one device: pass "
                     "device_map='cpu', 'cuda', 'cuda:N' or 'auto'")


def _load_builtin(spec: str, device: Any = None) -> VLM:
    """``toy:NAME`` and ``tiny:FAMILY`` specs (no hub, no network)."""
    kind, name = spec.split(":", 1)
    if kind == "tiny":
        from vrh_interp.core.description.tiny import build_tiny

        tiny = build_tiny(name)
        model = tiny.model if device is None else tiny.model.to(device)
        return wrap(model, tiny.processor, model_id=spec)
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
