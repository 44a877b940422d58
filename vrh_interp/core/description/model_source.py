"""Where a model spec points, checked before ``from_pretrained`` runs: one clear error instead of a traceback.

``from_pretrained`` retries an unreachable hub for about half a minute and then raises a bare ``OSError``; a
path to a file, an empty spec or a folder without ``config.json`` end in errors that do not say what was
meant. ``resolve_model_source`` decides up front:

* an existing path must be a model folder (``config.json``, as ``save_pretrained`` writes it);
* a spec that looks like a path (absolute, ``./``, ``~``, two or more slashes) and does not exist is a
  missing folder (``FileNotFoundError``);
* anything else is a hub id. It is asked for once, with a short timeout (``HUB_TIMEOUT_S``); when the hub
  does not answer, a copy in the local HF cache is used without further network calls
  (``local_files_only``), and without one the error asks the three questions that settle it: is it a local
  folder, is the hub reachable, should ``HF_HUB_OFFLINE`` be set. With ``HF_HUB_OFFLINE=1`` the hub is not
  asked at all.

``check_device`` refuses a device this machine does not have (``cuda`` without CUDA) or that cannot run a model
(``meta``) before any loading. ``check_local_model`` is the file-system part alone (no hub, no torch): the CLI runs
it before anything heavy loads.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # imported where used: the CLI checks specs and devices before torch loads
    import torch

HUB_TIMEOUT_S = 5.0  # one metadata request; a download that follows uses the hub library's own timeouts
DEVICE_MAP_NAMES = ("auto", "balanced", "balanced_low_0", "sequential")


class ModelLoadError(RuntimeError):
    """A model spec that cannot be loaded; the message says what was tried and what to check."""


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def _cached(repo_id: str, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)


def resolve_model_source(spec: str, revision: str | None = None) -> dict[str, Any]:
    """Check ``spec`` (a local folder or a hub id); the extra ``from_pretrained`` keyword arguments it needs
    (``{"local_files_only": True}`` for a cached copy while the hub is unreachable or offline mode is set)."""
    if check_local_model(spec):
        return {}
    path = Path(spec)
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    not_local = f"model {spec!r} is not a local folder (no {path.resolve()})"
    try:
        validate_repo_id(spec)
    except HFValidationError as error:
        raise ModelLoadError(f"{not_local} and not a valid hub id ({error})") from None
    if _offline():
        if _cached(spec, revision):
            return {"local_files_only": True}
        raise ModelLoadError(f"{not_local}, and HF_HUB_OFFLINE is set but the HF cache has no copy of it: is it a "
                             "local folder (check the path)? Otherwise download it on a machine with hub access "
                             "(hf download ID) into the same HF_HOME, or unset HF_HUB_OFFLINE")
    return _ask_hub(spec, revision, not_local)


def check_local_model(spec: str) -> bool:
    """True when ``spec`` is a local model folder, False when it can only be a hub id; ``ModelLoadError`` (or
    ``FileNotFoundError`` for a missing path) when it is neither. File system only: no hub, no torch."""
    if not spec.strip():
        raise ModelLoadError("the model spec is empty: pass a hub id (org/name), a local model folder, toy:NAME or "
                             "tiny:FAMILY")
    if "\x00" in spec:
        raise ModelLoadError(f"model spec {spec!r} contains a NUL character: pass a hub id or a folder path")
    path = Path(spec)
    try:
        exists = os.stat(spec) is not None
    except (FileNotFoundError, NotADirectoryError):
        exists = False
    except OSError as error:  # a symlink loop (ELOOP), a name too long: Path.exists() says False to these
        raise ModelLoadError(f"model {spec!r}: cannot look it up ({error.strerror}): pass a model folder or a hub "
                             "id") from None
    if exists:
        if not path.is_dir():
            raise ModelLoadError(f"model {spec!r} is a file, not a model folder: pass the folder save_pretrained "
                                 "wrote (config.json, weights, processor files) or a hub id")
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model folder {spec!r} has no config.json: pass the folder save_pretrained wrote "
                                 "(config.json, weights, processor files)")
        return True
    if os.path.islink(spec):
        raise FileNotFoundError(f"model {spec!r} is a symlink to {os.readlink(spec)!r}, which does not exist")
    if os.path.isabs(spec) or spec.startswith((".", "~")) or spec.count("/") > 1:
        raise FileNotFoundError(f"model folder {spec!r} does not exist (pass a hub id or an existing folder)")
    return False


def _ask_hub(repo_id: str, revision: str | None, not_local: str) -> dict[str, Any]:
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(repo_id, revision=revision, timeout=HUB_TIMEOUT_S)
        return {}
    except GatedRepoError:
        return {}  # from_pretrained says how to get access
    except RevisionNotFoundError:
        raise ModelLoadError(f"the hub has {repo_id!r} but not its revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{not_local}, and the hub ({constants.ENDPOINT}) has no model {repo_id!r}: check the "
                             "spelling; for a private model log in first (hf auth login or HF_TOKEN)") from None
    except Exception as error:  # noqa: BLE001 - any failure to get an answer: DNS, refused, timeout, 5xx
        if _cached(repo_id, revision):
            warnings.warn(f"the hub did not answer ({type(error).__name__}); using the cached copy of {repo_id}",
                          stacklevel=3)
            return {"local_files_only": True}
        raise ModelLoadError(
            f"{not_local}, and the hub ({constants.ENDPOINT}) did not answer within {HUB_TIMEOUT_S:g} s "
            f"({type(error).__name__}: {error}). Is it a local folder (check the path)? Is the hub reachable "
            "(network, proxy, HF_ENDPOINT)? Working offline: set HF_HUB_OFFLINE=1 and use a copy in the HF cache "
            "or a local folder") from None


@contextlib.contextmanager
def loading_output(progress: bool, *, bars: bool | None = None) -> Iterator[None]:
    """``progress=False``: no transformers / huggingface_hub progress bar ("Loading weights", downloads) and no
    transformers info or warning lines while loading; ``bars=False`` (default: ``progress``) silences the bars
    alone (a shipped toy's "Loading weights" bar on each load, while the library's own bars keep showing); the
    global settings are restored afterwards."""
    bars = progress if bars is None else bars
    if progress and bars:
        yield
        return
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    enabled, hub_bars, verbosity = hf_logging.is_progress_bar_enabled(), not hub_utils.are_progress_bars_disabled(), \
        hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # transformers' bars and huggingface_hub's
    if not progress:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if enabled:
            hf_logging.enable_progress_bar()
        if hub_bars:
            hub_utils.enable_progress_bars()
        elif enabled:
            hub_utils.disable_progress_bars()


def check_device(device: Any) -> None:
    """Refuse a device string this machine cannot use (``meta``, ``cuda`` without CUDA, ``cuda:3`` with 2 GPUs,
    ...)."""
    if not isinstance(device, str) or device in DEVICE_MAP_NAMES:
        return  # None, a device_map dict, or accelerate's placement strategies
    if device.split(":")[0].strip().lower() == "meta":  # checked before torch loads
        raise ModelLoadError(f"device {device!r} cannot run a model: the meta device holds shapes, no weights, so "
                             "every output would be empty. Use --device cpu, cuda or auto")
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"unknown device {device!r}: use cpu, cuda, cuda:N, mps or auto") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r}, but this machine has no usable CUDA device (torch "
                                 f"{torch.__version__}, CUDA build: {torch.version.cuda or 'none'}): use --device cpu, "
                                 "or install a CUDA build of torch on a machine with a GPU")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {device!r}, but this machine has {torch.cuda.device_count()} CUDA "
                                 f"device(s): use cuda:0 .. cuda:{torch.cuda.device_count() - 1} or auto")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {device!r}, but MPS is not available here: use --device cpu")


def parse_dtype(name: str | None) -> torch.dtype | None:
    """A floating-point torch dtype by name (``"bfloat16"``, ``"float16"``, ``"float32"``, ...), None for None
    or ''; anything else (an unknown name, an integer or boolean type a model cannot run in) is refused."""
    if not name:
        return None
    import torch

    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ModelLoadError(f"unknown dtype {name!r}: use a floating-point torch dtype such as float32, float16 or "
                             "bfloat16")
    return dtype
