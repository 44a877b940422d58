"""``get_backend``: a backend by name (``BACKENDS``) for a model. Apart from ``base`` (the seam and the nnsight
backend) so that the TransformerLens backend, which implements the seam, is imported only when asked for."""

from __future__ import annotations

import dataclasses
from typing import Any

from vrh_interp.core.backends import BACKENDS
from vrh_interp.core.backends.base import Backend, BackendError, NnsightBackend
from vrh_interp.core.model import VLM


def get_backend(backend: str | Backend, vlm: VLM, *, remote: bool | str = False) -> Backend:
    """The backend called ``backend`` ("nnsight" or "transformer-lens") for ``vlm``, or ``backend`` itself when it
    is one already (it must wrap this ``vlm``). Building a TransformerLens backend copies the model and bridges
    the copy: build it once and pass the instance to several pipelines. ``remote`` (NDIF) needs nnsight."""
    if not isinstance(backend, str):
        if not isinstance(backend, Backend):
            raise BackendError(f"backend must be one of {', '.join(BACKENDS)} or a Backend, got {backend!r}")
        if backend.vlm is not vlm:
            raise BackendError(f"the {backend.name} backend given wraps another model than the one being run: build "
                               "it with get_backend(name, vlm) for this model")
        if remote and backend.name != "nnsight":
            raise BackendError(_REMOTE_NEEDS_NNSIGHT)
        if isinstance(backend, NnsightBackend) and remote and backend.remote != remote:
            return dataclasses.replace(backend, remote=remote)  # the pipeline's remote wins
        return backend
    kind = backend_type(backend)
    if kind is NnsightBackend:
        return NnsightBackend(vlm, remote)
    if remote:
        raise BackendError(_REMOTE_NEEDS_NNSIGHT)
    return kind.from_vlm(vlm)  # type: ignore[union-attr]  # refuses unsupported families (UnsupportedFamilyError)


def backend_type(backend: str | Backend) -> Any:
    """The backend class a name stands for, not built (no model copy): its ``name``, ``ablation_kinds`` and
    ``operations``, what ``base.check_supported`` needs to refuse a request before any work. An instance stands
    for itself."""
    if not isinstance(backend, str):
        return backend
    if backend == "nnsight":
        return NnsightBackend
    if backend != "transformer-lens":
        raise BackendError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    from vrh_interp.core.backends.transformer_lens import TransformerLensBackend

    return TransformerLensBackend


_REMOTE_NEEDS_NNSIGHT = ("remote runs (NDIF) go through nnsight: use backend='nnsight' (--backend nnsight) with "
                         "remote, or run the transformer-lens backend locally")
