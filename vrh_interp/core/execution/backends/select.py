"""``backend_for``: the backend a model handle's placement names (``vlm.on(backend=..., remote=...)``), built once
per handle and kept on it. Apart from ``base`` (the seam and the nnsight backend) so that the TransformerLens
backend, which implements the seam, is imported only when a handle asks for it.

``core.description.model`` cannot build a backend itself (the backends import it), so the handle declares where it runs
(``VLM.placement``) and this module turns the declaration into the runtime: ``backend_for(vlm)`` is what every
pipeline calls, ``backend_type(vlm)`` the class a check reads before any work (no model copy)."""

from __future__ import annotations

from typing import Any

from vrh_interp.core.execution.backends import BACKENDS
from vrh_interp.core.execution.backends.base import Backend, BackendError, NnsightBackend
from vrh_interp.core.description.model import VLM


def backend_for(vlm: VLM) -> Backend:
    """The backend ``vlm`` runs on (``vlm.backend_name``: "nnsight" or "transformer-lens"), built on first use and
    kept on the handle: a TransformerLens backend copies the model and bridges the copy once per handle, so keep the
    handle ``vlm.on(backend="transformer-lens")`` returned and pass it to every pipeline. A remote handle needs a
    backend that runs remotely (nnsight); an unsupported family is refused (``UnsupportedFamilyError``)."""
    if vlm._backend is None:
        kind = backend_type(vlm)
        if vlm.remote and not kind.runs_remotely:
            raise BackendError(REMOTE_NEEDS_NNSIGHT)
        vlm._backend = NnsightBackend(vlm) if kind is NnsightBackend else kind.from_vlm(vlm)
    return vlm._backend


def backend_type(where: str | VLM) -> Any:
    """The backend class a handle (or a backend name) stands for, not built (no model copy): its ``name``,
    ``ablation_kinds``, ``operations`` and ``runs_remotely``, what ``base.check_supported`` needs to refuse a request
    before any work."""
    name = where if isinstance(where, str) else where.backend_name
    if name == "nnsight":
        return NnsightBackend
    if name != "transformer-lens":
        raise BackendError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")
    from vrh_interp.core.execution.backends.transformer_lens import TransformerLensBackend

    return TransformerLensBackend


REMOTE_NEEDS_NNSIGHT = ("remote runs (NDIF) go through nnsight: place the model with vlm.on(backend='nnsight', "
                        "remote=...) (--backend nnsight), or run the transformer-lens backend locally")
