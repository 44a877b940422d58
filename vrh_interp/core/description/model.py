"""The ``VLM`` handle: a HF vision-language model, its processor, its family adapter, and its nnsight wrapper.

One code path for everything: ``load`` reads a hub id or a local folder exactly as ``from_pretrained``
does (``device_map``, ``dtype``, ``revision``; ``trust_remote_code`` stays off unless the caller turns
it on) and ``wrap`` takes a model the user already has; both end in the same ``VLM``. The tiny test
fixtures, the shipped toy models and 7B checkpoints all go through ``wrap``.

The nnsight ``TransformersModel`` is built lazily, because wrapping replaces every submodule's forward in
place (a few percent slower even outside a trace). Plain-PyTorch paths (the references in tests) use
``hf_model`` directly.

Remote runs (NDIF) name the model by a key nnsight mints from the hub id the wrapped model was loaded
from; a model loaded from a local folder has no such id, and minting one asks the hub. ``remote_id``
(on ``wrap`` / ``load`` / ``VLM``) gives the id the server deployed the model under, used verbatim, with no
hub call (see docs/recipes/remote.md).

One model handle (issue 32): a ``VLM`` also says WHERE it runs, its ``Placement`` (a backend name, "nnsight" or
"transformer-lens", and ``remote``: False, True for NDIF at nnsight's configured host, a host URL, or "local" to
serialise as for NDIF and run here). ``vlm.on(backend=..., remote=...)`` gives a handle that shares the loaded
model and runs elsewhere; every method reads the placement from the handle, none takes ``remote=`` or
``backend=``. The operations under conditions (generate, attention readout, capture, patch) are the handle's
backend, ``vrh_interp.core.execution.backends.select.backend_for(vlm)``: built once per handle from its placement and
kept on it (``_backend``; a TransformerLens bridge copies the model, so it is built once). The backend is not built here
because the backends are built ON this class (``core.execution.backends.base`` imports ``core.description.model``):
``core.description.model`` declares the placement, ``core.execution.backends`` turns it into a runtime, and nothing
here imports a backend, so the import graph stays a downward one without a registry filled at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from vrh_interp.core._display import card_html, card_text
from vrh_interp.core.execution.backends import BACKENDS, NNSIGHT_TRACES
from vrh_interp.core.description.families import FamilyAdapter, adapter_for_config
from vrh_interp.core.description.families.base import BoxFrame, VisualLayout
from vrh_interp.core.description.heads import HeadGeometry
from vrh_interp.core.description.model_source import ModelLoadError, check_device, loading_output, resolve_model_source


@dataclass
class GroundingBatch:
    """A processor encoding of (image, expression) pairs plus each row's visual layout and box frame."""

    encoding: Any  # BatchFeature / dict of tensors, left-padded
    layouts: list[VisualLayout]
    frames: list[BoxFrame]
    prompts: list[str]

    @property
    def batch_size(self) -> int:
        return len(self.prompts)

    @property
    def prompt_length(self) -> int:
        return int(self.encoding["input_ids"].shape[1])

    def with_answer_tokens(self, answer_ids: Sequence[Sequence[int]], pad_token_id: int, *,
                           answer_token_type_id: int = 0) -> dict[str, Any]:
        """The encoding with each row's answer tokens appended after the shared prompt end (teacher forcing).

        Prompts are left-padded, so every prompt ends at ``prompt_length - 1``; answers are RIGHT-padded
        (masked) to the longest, so answer token j of every row sits at ``prompt_length + j``. Per-token
        tensors are extended: ``mm_token_type_ids`` with 0 (text), ``token_type_ids`` with the family's
        ``answer_token_type_id`` (PaliGemma's 0 would put the answer in the bidirectional prefix, so the
        prompt end would see the answer). Use ``VLM.teacher_forced`` to get the family's value right.
        """
        if len(answer_ids) != self.batch_size:
            raise ValueError(f"{len(answer_ids)} answers for a batch of {self.batch_size}")
        enc = dict(self.encoding)
        ids = enc["input_ids"]
        b, width = ids.shape[0], max((len(a) for a in answer_ids), default=0)
        extra = torch.full((b, width), pad_token_id, dtype=ids.dtype, device=ids.device)
        extra_mask = torch.zeros(b, width, dtype=enc["attention_mask"].dtype, device=ids.device)
        for i, row in enumerate(answer_ids):
            extra[i, : len(row)] = torch.as_tensor(list(row), dtype=ids.dtype)
            extra_mask[i, : len(row)] = 1
        known = {"input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids"}
        unknown = [k for k, v in enc.items() if k not in known and isinstance(v, torch.Tensor)
                   and tuple(v.shape[:2]) == tuple(ids.shape)]
        if unknown:
            raise ValueError(f"cannot teacher-force an encoding with per-token tensors {unknown}: their value for "
                             "appended answer tokens is family-specific; extend with_answer_tokens for this family")
        enc["input_ids"] = torch.cat([ids, extra], dim=1)
        enc["attention_mask"] = torch.cat([enc["attention_mask"], extra_mask], dim=1)
        for name, fill in (("mm_token_type_ids", 0), ("token_type_ids", answer_token_type_id)):
            if name in enc and enc[name].shape == ids.shape:
                enc[name] = torch.cat([enc[name],
                                       torch.full((b, width), fill, dtype=enc[name].dtype, device=ids.device)],
                                      dim=1)
        return enc


@dataclass(frozen=True)
class Placement:
    """Where a ``VLM`` runs: ``backend`` (one of ``vrh_interp.core.execution.backends.BACKENDS``) and ``remote``
    (False: here; True: NDIF at nnsight's configured host; a host URL; "local": serialised as for NDIF, run here).
    Remote runs go through nnsight (the backend refuses otherwise, when it is built)."""

    backend: str = "nnsight"
    remote: bool | str = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if not isinstance(self.remote, (bool, str)):
            raise TypeError(f"remote must be a bool or a host string, got {self.remote!r}")


LOCAL = Placement()


@dataclass
class VLM:
    """A vision-language model ready for head-level work, and where it runs (``placement``; module doc)."""

    hf_model: Any
    processor: Any
    adapter: FamilyAdapter
    model_id: str | None = None
    revision: str | None = None
    remote_id: str | None = None  # the hub id an NDIF server serves this model under (None: nnsight's default)
    placement: Placement = LOCAL
    _nnsight_model: Any = field(default=None, repr=False)
    # built by core.execution.backends.select.backend_for
    _backend: Any = field(default=None, repr=False, compare=False)
    _shared: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # what handles from ``on`` share

    def on(self, placement: Placement | None = None, *, backend: str | None = None,
           remote: bool | str | None = None) -> "VLM":
        """This model placed elsewhere: a new handle sharing ``hf_model``, ``processor`` and the nnsight wrapper,
        running on ``backend`` and ``remote`` (each unchanged when not given), or at ``placement``. Its backend
        is built on first use (a TransformerLens bridge once per handle: keep the handle and pass it around)."""
        where = placement or self.placement
        where = Placement(where.backend if backend is None else backend, where.remote if remote is None else remote)
        if where == self.placement:
            return self
        return dataclasses.replace(self, placement=where, _backend=None)  # ``_shared``: the same dict, not a copy

    @property
    def remote(self) -> bool | str:
        """Where nnsight runs this model's traces (``Placement.remote``): every method reads it from here."""
        return self.placement.remote

    @property
    def backend_name(self) -> str:
        return self.placement.backend

    @property
    def runs_nnsight_traces(self) -> bool:
        """Whether the handle's backend runs nnsight traces (``core.execution.backends.NNSIGHT_TRACES``): what the
        methods that trace the model themselves (``core.execution.interventions``, patching, probes, overlays) need."""
        return self.backend_name in NNSIGHT_TRACES

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        g = self.geometry
        parameter = next(self.hf_model.parameters())
        count = sum(p.numel() for p in self.hf_model.parameters())
        size = f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"
        rows = [("family", f"{self.adapter.display_name} ({type(self.hf_model).__name__})"),
                ("heads", g.describe()),
                ("weights", f"{size} parameters, {str(parameter.dtype).removeprefix('torch.')} on {parameter.device}")]
        if self.revision:
            rows.append(("revision", self.revision))
        if self.remote_id and self.remote_id != self.model_id:
            rows.append(("remote id", self.remote_id))
        if self.placement != LOCAL:
            rows.append(("runs on", self.backend_name + (f", remote={self.remote!r}" if self.remote else "")))
        return f"VLM {self.model_id or '(no id)'}", rows

    def __repr__(self) -> str:
        """A few lines (model, family, head grid, weights), not the module tree: that is ``vlm.hf_model``."""
        return card_text(*self._card())

    def _repr_html_(self) -> str:
        return card_html(*self._card())

    @property
    def geometry(self) -> HeadGeometry:
        return self.adapter.geometry()

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def nn(self) -> Any:
        """The nnsight ``TransformersModel`` wrapping ``hf_model`` (built on first use)."""
        if self._nnsight_model is None and "nn" in self._shared:  # built by a handle this one shares the model with
            self._nnsight_model = self._shared["nn"]
        if self._nnsight_model is None:
            import nnsight

            if self.remote_id is None:
                self._nnsight_model = nnsight.TransformersModel(
                    self.hf_model, task="image-text-to-text", processor=self.processor
                )
            else:
                self._nnsight_model = _remote_keyed_class()(
                    self.hf_model, task="image-text-to-text", processor=self.processor,
                    remote_id=self.remote_id, revision=self.revision,
                )
            self._shared["nn"] = self._nnsight_model  # wrapping twice would replace the forwards twice
        return self._nnsight_model

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @property
    def image_token_id(self) -> int:
        return self.adapter.image_token_id(self.processor)

    def encode_grounding(self, images: Sequence[Image.Image], expressions: Sequence[str]) -> GroundingBatch:
        """Encode a left-padded batch of grounding prompts, one image each, with layouts and box frames: ``images``
        (PIL) and ``expressions`` (str) are lists, one of each per row (``[image], [expression]`` for one)."""
        _check_grounding_rows(images, expressions)
        if len(images) != len(expressions):
            raise ValueError(f"{len(images)} images but {len(expressions)} expressions")
        if not images:
            raise ValueError("encode_grounding needs at least one (image, expression) pair")
        prompts = [self.adapter.grounding_prompt(self.processor, e) for e in expressions]
        encoding = self.adapter.encode(self.processor, [img.convert("RGB") for img in images], prompts)
        encoding = encoding.to(self.device)
        sizes = [img.size for img in images]
        layouts = [self.adapter.visual_layout(encoding, size, self.processor, i) for i, size in enumerate(sizes)]
        frames = [self.adapter.box_frame(encoding, size, i, processor=self.processor) for i, size in enumerate(sizes)]
        return GroundingBatch(encoding=encoding, layouts=layouts, frames=frames, prompts=prompts)

    def teacher_forced(self, batch: GroundingBatch, answer_ids: Sequence[Sequence[int]]) -> dict[str, Any]:
        """``batch``'s encoding with ``answer_ids`` appended after the prompts (see ``with_answer_tokens``)."""
        pad = self.tokenizer.pad_token_id
        return batch.with_answer_tokens(answer_ids, pad if pad is not None else self.tokenizer.eos_token_id,
                                        answer_token_type_id=self.adapter.answer_token_type_id)

    def answer_lengths(self, generated: torch.Tensor, prompt_length: int) -> list[int]:
        """Answer tokens per row: the new tokens before the first EOS (tokenizer's or generation config's) / pad."""
        stop = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        configured = getattr(self.hf_model.generation_config, "eos_token_id", None)
        if configured is not None:
            stop.update(configured if isinstance(configured, list) else [configured])
        lengths = []
        for row in generated[:, prompt_length:].tolist():
            n = 0
            while n < len(row) and row[n] not in stop:
                n += 1
            lengths.append(n)
        return lengths

    def decode_answers(self, generated: torch.Tensor, prompt_length: int) -> list[str]:
        """Decode each row's answer tokens (special tokens kept: several box formats use them)."""
        new_tokens = generated[:, prompt_length:].tolist()
        return [self.tokenizer.decode(row[:n], skip_special_tokens=False)
                for row, n in zip(new_tokens, self.answer_lengths(generated, prompt_length))]


def _check_grounding_rows(images: Any, expressions: Any) -> None:
    """Refuse ``encode_grounding`` arguments that are not lists of PIL images and of strings, in one line."""
    for name, value, kind, what in (("images", images, Image.Image, "PIL image"),
                                    ("expressions", expressions, str, "string")):
        if isinstance(value, (str, bytes, Image.Image)) or not isinstance(value, Sequence):
            raise TypeError(f"encode_grounding({name}=...) takes a list with one {what} per row, got "
                            f"{type(value).__name__}: for one row write encode_grounding([image], [expression])")
        bad = next((i for i, item in enumerate(value) if not isinstance(item, kind)), None)
        if bad is not None:
            raise TypeError(f"encode_grounding: {name}[{bad}] is {type(value[bad]).__name__}, not a {what}")


@functools.cache
def _remote_keyed_class() -> type:
    """``nnsight.TransformersModel`` whose remote key names ``remote_id`` instead of asking the hub.

    The key is nnsight 0.8.1's own format (``{"repo_id", "revision", ["trust_remote_code"], "task"}`` after
    ``nnsight.modeling.transformers.TransformersModel:``; a test pins it against nnsight's minting) and
    names nnsight's class, not this subclass, so the server needs nothing from vrh_interp to resolve it.
    """
    import nnsight
    from transformers.pipelines import TASK_ALIASES

    class RemoteKeyedTransformersModel(nnsight.TransformersModel):
        def __init__(self, *args: Any, remote_id: str, **kwargs: Any) -> None:
            self.remote_id = remote_id
            super().__init__(*args, **kwargs)

        def _remoteable_class(self) -> type:
            return nnsight.TransformersModel

        def _remoteable_model_key(self) -> str:
            data: dict[str, Any] = {"repo_id": self.remote_id, "revision": self.revision}
            if self.kwargs.get("trust_remote_code"):
                data["trust_remote_code"] = True
            data["task"] = TASK_ALIASES.get(self.task, self.task)
            return json.dumps(data)

    return RemoteKeyedTransformersModel


def _rotary_buffers(model: Any) -> dict[str, torch.Tensor]:
    """The rotary frequency buffers (``...inv_freq``), by name."""
    return {name: buf for name, buf in model.named_buffers() if name.endswith("inv_freq")}


def cast_model(model: Any, dtype: Any) -> Any:
    """``model.to(dtype)``, but leaving the rotary frequency buffers (``...inv_freq``) in float32, as
    ``from_pretrained(dtype=...)`` / ``from_config(dtype=...)`` build them. ``.to`` casts every floating buffer, and a
    bf16 ``inv_freq`` (relative error 2^-9) puts an error of about position x 2^-9 radians into the rotary angles:
    attention far from the query changes (PaliGemma2's bf16 head ranking at 1,000 positions: Spearman 0.97 with a
    bf16 ``inv_freq``; docs/benchmarks.md). Returns ``model``, cast in place."""
    kept = {name: buf for name, buf in _rotary_buffers(model).items() if buf.dtype == torch.float32}
    model.to(dtype)
    for name, buf in kept.items():
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner)._buffers[attr] = buf
    return model


def wrap(model: Any, processor: Any, *, adapter: FamilyAdapter | None = None, model_id: str | None = None,
         revision: str | None = None, remote_id: str | None = None, attention: Any = None) -> VLM:
    """Wrap a HF ``*ForConditionalGeneration`` already in memory (any device / dtype).

    ``remote_id``: the hub id an NDIF server deployed this model under, for remote runs (``vlm.on(remote=True)``) of
    a model loaded from a local folder or on a machine without hub access (used verbatim; spell it as deployed).
    ``attention``: an ``AttentionDescription`` (``vrh_interp.core.description.families.described``) for attention the
    adapters do not know (remote code); it is checked against the model, ``adapter`` (default: the built-in one) then
    supplies only the visual side (docs/recipes/remote-code-models.md).
    """
    half = {name: buf.dtype for name, buf in _rotary_buffers(model).items()
            if buf.dtype in (torch.bfloat16, torch.float16)}
    if half:
        name, dtype = next(iter(half.items()))
        warnings.warn(f"{len(half)} rotary frequency buffer(s) of this model are in "
                      f"{str(dtype).removeprefix('torch.')} ({name}, ...): model.to(dtype) casts them, "
                      "from_pretrained(dtype=...) keeps them float32. "
                      "The rotary angles are then off by about position x 2^-9 radians, which changes attention far "
                      "from each query (head scores included). Load with from_pretrained(dtype=...) or cast with "
                      "vrh_interp.core.description.model.cast_model(model, dtype)", stacklevel=2)
    if attention is not None:
        from vrh_interp.core.description.families.described import described_adapter

        adapter = described_adapter(model, attention, adapter)
    if adapter is None:
        adapter = adapter_for_config(model.config)
    model.eval()
    return VLM(hf_model=model, processor=processor, adapter=adapter,
               model_id=model_id or getattr(model.config, "_name_or_path", None) or None, revision=revision,
               remote_id=remote_id)


def _no_image_processor(spec: str, source: str) -> str:
    """Why a model folder has no usable processor: its ``processor_config.json`` names a class transformers lacks
    (a vrh-interp toy's ``InternVLImageOnlyProcessor``), or it has no image processor at all."""
    try:
        named = json.loads((Path(source) / "processor_config.json").read_text(encoding="utf-8")).get("processor_class")
    except (OSError, ValueError, AttributeError):
        named = None
    return (f"{spec!r} has no image processor transformers can build"
            + (f" (its processor class {named!r} is not a transformers class)" if isinstance(named, str) else "")
            + ": a vision-language model needs one. For a vrh-interp toy checkpoint folder use "
              "vrh_interp.toy.load(NAME, folder=...) and core.description.model.wrap, or the shipped one as toy:NAME")


def load_pretrained(model_id_or_path: str | os.PathLike[str], *, device_map: Any = None, dtype: Any = None,
         revision: str | None = None, trust_remote_code: bool = False, adapter: FamilyAdapter | None = None,
         attn_implementation: str | None = None, remote_id: str | None = None, attention: Any = None,
         progress: bool = True, **from_pretrained_kwargs: Any) -> VLM:
    """Load a hub id or a local folder (``AutoModelForImageTextToText`` + ``AutoProcessor``) and wrap it.
    ``progress=False``: no download or "Loading weights" bars and no transformers info lines.
    ``vrh_interp.load`` (``vrh_interp.specs.load``) takes these and the built-in ``toy:`` / ``tiny:`` specs.

    ``attn_implementation=None`` lets transformers choose per sub-model: sdpa where it exists, else eager (PaliGemma
    2's Gemma 2 backbone has no sdpa, which cannot soft-cap; asking for "sdpa" fails to load it).
    ``trust_remote_code`` is never enabled on the user's behalf: HF-native classes are used. ``attention``: an
    ``AttentionDescription`` for a model whose attention the adapters do not know (see ``wrap``).
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    spec = os.fspath(model_id_or_path)
    check_device(device_map)
    source = os.path.expanduser(spec)
    from_pretrained_kwargs = {**resolve_model_source(source, revision), **from_pretrained_kwargs}
    try:
        with loading_output(progress):  # the processor first: a folder without one fails before the weights load
            processor = AutoProcessor.from_pretrained(
                source, revision=revision, trust_remote_code=trust_remote_code,
                local_files_only=from_pretrained_kwargs.get("local_files_only", False))
            if not hasattr(processor, "image_processor"):  # AutoProcessor fell back to the tokenizer alone
                raise ModelLoadError(_no_image_processor(spec, source))
            model = AutoModelForImageTextToText.from_pretrained(
                source, device_map=device_map, dtype=dtype, revision=revision, trust_remote_code=trust_remote_code,
                attn_implementation=attn_implementation, **from_pretrained_kwargs,
            )
    except OSError as error:  # missing weights, gated, a download cut off: transformers' text says which
        raise ModelLoadError(f"could not load model {spec!r}: {error}") from error
    except TypeError as error:  # a keyword from_pretrained passed on to the model class, which does not take it
        unknown = [k for k in from_pretrained_kwargs if f"unexpected keyword argument '{k}'" in str(error)]
        if not unknown:
            raise
        raise ValueError(f"load({spec!r}) does not take {unknown[0]}=: neither vrh_interp.load nor transformers' "
                         f"from_pretrained for this model accepts it ({error})") from None
    return wrap(model, processor, adapter=adapter, model_id=source, revision=revision, remote_id=remote_id,
                attention=attention)
