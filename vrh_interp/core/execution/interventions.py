"""One-call helpers: build trace templates for a ``VLM`` and run them in a forward pass or a generation.

These are thin: the templates (``vrh_interp.core.execution.templates``) do the work and can be used in a user's own
trace instead. ``run_forward`` runs one ``model.trace``; ``run_generate`` runs ``model.generate`` with
the templates applied at EVERY step (prefill and each decode step) through nnsight's open-ended
``tracer.iter[:]`` loop, and reads the generated ids in a second, empty invoke (code after an
open-ended loop does not run; bounding the loop would need ``min_new_tokens``, which changes greedy
outputs by suppressing EOS).

Where a run goes is the handle's (``vlm.remote``, set by ``vlm.on(remote=...)``; ``core.description.model``): with a
remote handle (NDIF) a failed run raises ``RemoteExecutionError``, whose message names the host and model key and says
what to do (docs/recipes/remote.md); ``remote_errors(vlm)`` gives the same to your own traces.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import torch

from vrh_interp.core.execution.layer_sharing import row_block
from vrh_interp.core.description.heads import HeadSet, HeadsLike
from vrh_interp.core.description.model import VLM, GroundingBatch
from vrh_interp.core.execution.templates import LayerTemplate, apply_in_order
from vrh_interp.core.execution.templates.ablation import (PAD, ZERO_ABLATION, Ablation, HeadAblation, RowHeadAblation,
                                                          segment_ids)
from vrh_interp.core.execution.templates.head_outputs import HeadOutputCapture, HeadOutputPatch
from vrh_interp.core.execution.templates.readout import (AttentionRowsReadout, ReadoutUnavailableError,
                                                         attention_call_label)
from vrh_interp.core.execution.templates.redirect import HeadRedirect

OPEN_LOOP_WARNING = r".*was never reached.*"


class RemoteExecutionError(RuntimeError):
    """A remote run (``vlm.on(remote=True)``) failed: the NDIF server was unreachable, refused the request, or the
    traced code raised on the server. The message names the host and model key and says what to do; the original
    exception is chained (``__cause__``)."""


def _remote_hint(message: str) -> str:
    if "ModuleNotFoundError" in message or "No module named" in message:
        return ("a module used inside the trace is not installed on the server: ship it with "
                "nnsight.register(module) before the run (vrh_interp registers itself)")
    lowered = message.lower()
    if "deploy" in lowered or "not running" in lowered or "not found" in lowered or "no replica" in lowered:
        return ("the server does not serve this model key: check nnsight.is_model_running(...) / the server's "
                "deployments, and that VLM.remote_id spells the id exactly as deployed")
    return "the traceback above is the server's; the same call on vlm.on(remote=False) runs it locally"


@contextlib.contextmanager
def remote_errors(vlm: VLM) -> Iterator[None]:
    """Turn a failed remote run of ``vlm`` (``vlm.remote``) into a ``RemoteExecutionError`` that says what to do
    (local runs untouched). For your own traces: ``with remote_errors(vlm), vlm.nn.trace(..., remote=vlm.remote):``.

    nnsight reports a refused connection as a bare ``ConnectionRefusedError`` from its websocket client, a
    model it cannot name as a hub error, and a server-side failure as ``RemoteError`` carrying only the
    server's text; none of them names the host or the model key.
    """
    remote = vlm.remote
    if not remote or remote == "local":
        yield
        return
    import nnsight
    from nnsight.intervention.backends.remote import RemoteError

    from vrh_interp.core.execution.remote import RemoteTimeoutError, timed_remote_calls

    host = remote if isinstance(remote, str) else nnsight.CONFIG.API.HOST
    try:
        key = f"model key {vlm.nn.to_model_key()!r}"  # minted once, cached by nnsight
    except Exception as err:  # noqa: BLE001 - any failure to name the model has the same fix
        raise RemoteExecutionError(
            f"cannot name this model for the NDIF server ({type(err).__name__}: {err}); nnsight asks the hub "
            "for the id the model was loaded from. Pass the id the server deployed it under: "
            "vrh.wrap(..., remote_id=...) or vrh.load(..., remote_id=...)") from err
    try:
        with timed_remote_calls():
            yield
    except RemoteTimeoutError as err:
        raise RemoteExecutionError(
            f"{err} for {key}: check that the host is up and is an NDIF API (nnsight.CONFIG.API.HOST or NDIF_HOST), "
            "and that no firewall or proxy holds the connection; a busy server may need a longer timeout "
            "(vrh_interp.core.execution.remote.set_remote_timeouts)") from err
    except RemoteError as err:
        text = str(err)
        if text.startswith("Failed to send request"):
            raise RemoteExecutionError(f"the NDIF server at {host} refused the request for {key}: {text}") from err
        raise RemoteExecutionError(f"the NDIF server at {host} reported an error running {key}:\n{text}\n"
                                   f"hint: {_remote_hint(text)}") from err
    except OSError as err:  # ConnectionRefusedError, DNS failure, timeouts
        raise RemoteExecutionError(
            f"could not reach an NDIF server at {host} ({type(err).__name__}: {err}); set the host with "
            "nnsight.CONFIG.API.HOST or the NDIF_HOST environment variable, check the server is up, or run "
            "on vlm.on(remote=False) to compute locally") from err
    except Exception as err:
        if type(err).__name__ == "WebSocketAddressException":  # the websocket client's DNS failure
            raise RemoteExecutionError(
                f"could not resolve the NDIF host {host} ({err}): check its spelling (nnsight.CONFIG.API.HOST or "
                "NDIF_HOST) and this machine's network and DNS, or run on vlm.on(remote=False) to compute locally"
            ) from err
        if type(err).__module__.startswith("websocket"):  # e.g. a host that is not an NDIF API
            raise RemoteExecutionError(f"the NDIF connection to {host} failed ({type(err).__name__}: {err}); "
                                       "is this host an NDIF API (nnsight.CONFIG.API.HOST)?") from err
        raise


class NotNnsightError(ValueError):
    """A handle placed on a backend that runs no nnsight traces was given to a method that traces the model."""


def nnsight_model(vlm: VLM) -> Any:
    """``vlm.nn``, the model to trace, for a handle whose backend runs nnsight traces (``vlm.runs_nnsight_traces``);
    a handle placed elsewhere (``vlm.on(backend="transformer-lens")``) is refused in one line, so a method that
    traces the model never runs silently on another backend than the handle says."""
    if not vlm.runs_nnsight_traces:
        raise NotNnsightError(f"this method traces the model with nnsight, but the model handle is placed on the "
                              f"{vlm.backend_name} backend: run it on vlm.on(backend='nnsight') (--backend nnsight)")
    return vlm.nn


def prepare_remote(vlm: VLM) -> None:
    """Ship vrh_interp's template code with ``vlm``'s requests when it runs remotely (the server need not have it
    installed).

    ``nnsight.register`` makes cloudpickle serialise the package by value; it is idempotent.
    """
    if vlm.remote:
        import nnsight

        nnsight.register("vrh_interp")


def head_ablation(vlm: VLM, heads: HeadsLike, ablation: Ablation = ZERO_ABLATION, *,
                  segments: torch.Tensor | None = None, sample_ids: Sequence[str] | None = None) -> HeadAblation:
    """Ablate ``heads`` (``ablation``: zero by default); heads in any form ``HeadSet.coerce`` reads (``"L3H2"``,
    ``Head(3, 2)``, ``(3, 2)``, a ``HeadSet``, a list of these). ``mean`` / ``resample`` act segment by segment and
    need the batch's ``segments`` (``batch_segments``); ``resample`` also its ``sample_ids`` (row order)."""
    return HeadAblation.build(vlm.geometry.validate(heads, "head_ablation(heads)"), vlm.geometry, projection_path(vlm),
                              ablation, segments=segments, sample_ids=sample_ids)


def row_head_ablation(vlm: VLM, heads: Sequence[HeadSet | None], ablations: Sequence[Ablation], *,
                      segments: torch.Tensor | None = None,
                      sample_ids: Sequence[str] | None = None) -> RowHeadAblation:
    """Per-row ablation: row r ablates ``heads[r]`` with ``ablations[r]`` (``templates.ablation.RowHeadAblation``).
    ``segments`` (``[rows, seq]``) is needed when a row uses mean / resample, ``sample_ids`` (per row) for
    resample."""
    return RowHeadAblation.build(heads, ablations, vlm.geometry, projection_path(vlm), segments=segments,
                                 sample_ids=sample_ids)


def condition_ablation(vlm: VLM, conditions: Sequence[tuple[HeadSet | None, Ablation]], rows_per_condition: int, *,
                       segments: torch.Tensor | None = None,
                       sample_ids: Sequence[str] | None = None) -> RowHeadAblation:
    """Per-row ablation of a batch replicated once per condition (``replicate_encoding``): rows are
    condition-major, block c (``rows_per_condition`` rows) ablates ``conditions[c] = (heads, ablation)``.
    ``segments`` (``[rows_per_condition, seq]``) and ``sample_ids`` are the ORIGINAL batch's; they are repeated
    per block."""
    heads = [h for h, _ in conditions for _ in range(rows_per_condition)]
    ablations = [a for _, a in conditions for _ in range(rows_per_condition)]
    if segments is not None:
        if segments.shape[0] != rows_per_condition:
            raise ValueError(f"segments have {segments.shape[0]} rows, the batch has {rows_per_condition}")
        segments = segments.repeat(len(conditions), 1)
    if sample_ids is not None:
        if len(sample_ids) != rows_per_condition:
            raise ValueError(f"{len(sample_ids)} sample ids for a batch of {rows_per_condition}")
        sample_ids = list(sample_ids) * len(conditions)
    return row_head_ablation(vlm, heads, ablations, segments=segments, sample_ids=sample_ids)


def replicate_encoding(encoding: Mapping[str, Any], times: int) -> dict[str, Any]:
    """``encoding`` with its batch repeated ``times`` times (block after block): every tensor is concatenated
    along its first dimension, which for every supported family is either the batch or a concatenation of
    per-image pieces in row order (Qwen's flattened patches and ``image_grid_thw``, InternVL's tiles, image sizes,
    token type ids). Each copy keeps the original left padding, so row b of every block is the same input as row b
    of the original batch (tested equal to encoding the repeated samples, for every family)."""
    if times < 1:
        raise ValueError("times must be >= 1")
    if times == 1:
        return dict(encoding)
    out: dict[str, Any] = {}
    for key, value in encoding.items():
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                raise ValueError(f"cannot replicate the scalar encoding entry {key!r}")
            out[key] = torch.cat([value] * times, dim=0)
        elif isinstance(value, (list, tuple)):
            out[key] = type(value)(list(value) * times)
        else:
            out[key] = value
    return out


def generate_conditions(vlm: VLM, encoding: Mapping[str, Any], conditions: Sequence[tuple[HeadSet | None, Ablation]],
                        *, max_new_tokens: int, segments: torch.Tensor | None = None,
                        sample_ids: Sequence[str] | None = None, shared_prefix: bool = True,
                        **generate_kwargs: Any) -> list[torch.Tensor]:
    """Greedy generation of ONE batch under several conditions ``(heads, ablation)`` in one pass: the batch is
    replicated per condition (``replicate_encoding``) and each block masked with its own heads and kind
    (``condition_ablation``). Returns one ``[batch, prompt + new]`` id tensor per condition. One condition runs
    the single-condition template (``head_ablation``), a condition without heads masks nothing.

    Each row's tokens equal those of its condition generated alone (rows do not interact; tested exactly): a
    pass only runs until EVERY row stopped, so a condition's tensor may be wider than alone, with the pad token
    after its rows' EOS (``VLM.decode_answers`` stops at both). ``segments`` / ``sample_ids`` (of the original
    batch) are needed for mean / resample conditions. ``shared_prefix``: where several rows show the same image
    (a scene's referents) and every condition zero-ablates, the image prefix runs once per image and condition
    (``shared_image_prefix``; local runs only: not on a remote handle)."""
    if not conditions:
        raise ValueError("generate_conditions needs at least one condition")
    rows = int(encoding["input_ids"].shape[0])
    masked = [(h, a) for h, a in conditions if h is not None and len(h)]
    # a per-sample kind (resample) gives each row its own values, so rows that share an image differ in the prefix
    if shared_prefix and not vlm.remote and all(not a.method.per_sample and (segments is not None or
                                                                         not a.replaces_by_segment)
                                            for _, a in masked):
        from vrh_interp.core.execution import layer_sharing  # layers below the first masked one, computed once

        # layer sharing shares across the conditions too, so it takes a prefix even where no image repeats
        sharing = len(conditions) > 1 and layer_sharing.applies(vlm, [a.kind for _, a in masked])
        prefix = shared_image_prefix(vlm, encoding, unique=sharing)
        if prefix is not None:
            shared = layer_sharing.generate_layer_shared(vlm, encoding, conditions, prefix,
                                                         max_new_tokens=max_new_tokens, **generate_kwargs)
            if shared is not None:
                return shared
            if len(prefix.first) < rows:
                return _generate_from_prefix(vlm, encoding, conditions, prefix, max_new_tokens=max_new_tokens,
                                             segments=segments, **generate_kwargs)
    if len(conditions) == 1:
        heads, ablation = conditions[0]
        templates = [head_ablation(vlm, heads, ablation, segments=segments, sample_ids=sample_ids)] if masked else []
        return [run_generate(vlm, encoding, templates, max_new_tokens=max_new_tokens, **generate_kwargs).ids]
    templates = [condition_ablation(vlm, conditions, rows, segments=segments, sample_ids=sample_ids)] if masked else []
    ids = run_generate(vlm, replicate_encoding(encoding, len(conditions)), templates, max_new_tokens=max_new_tokens,
                       **generate_kwargs).ids
    return list(ids.split(rows, dim=0))


@dataclass(frozen=True)
class SharedPrefix:
    """Rows of a left-padded batch that share their prompt up to the last image token and the text after it that
    every row has (``shared_image_prefix``):
    ``ids`` (``[images, length]``) is each distinct image's prefix, ``first[i]`` a row showing image i,
    ``image_of[r]`` row r's image and ``starts[r]`` where row r's prompt begins (after its left padding)."""

    ids: torch.Tensor
    first: list[int]
    image_of: list[int]
    starts: list[int]

    @property
    def length(self) -> int:
        return int(self.ids.shape[1])


def shared_image_prefix(vlm: VLM, encoding: Mapping[str, Any], *, unique: bool = False) -> SharedPrefix | None:
    """The batch's shared image prefixes, or None where sharing does not apply or would not pay.

    Exactness argument: attention is causal, so the keys and values of a prompt's tokens up to its last image
    token (and the text every row has after it) depend on those tokens and the image only; where several rows have the same prefix tokens and the same
    image (the same pixel rows, compared exactly), one forward pass over the prefix gives every such row its
    cache. The suffixes (expression, generation prompt) then run on that cache with the padding between prefix
    and suffix masked out; positions come from the attention mask (``FamilyAdapter.image_prefix_cache``: 1-D
    rotary positions, causal image attention), so every token sees the same keys at the same positions as in
    the left-padded batch. Only the order of floating-point sums differs (other matrix shapes); greedy answers
    are tested equal to the unshared path. Applies when the family allows it, every row has one image at the
    same prefix length, each per-image tensor has one row per prompt, and some image repeats (or, with ``unique``,
    also when none does: layer sharing shares across the conditions a batch is replicated over)."""  # noqa: E501
    if not vlm.adapter.image_prefix_cache or "input_ids" not in encoding or "attention_mask" not in encoding:
        return None
    ids, mask = encoding["input_ids"], encoding["attention_mask"]
    rows, width = ids.shape
    image_inputs = {k: v for k, v in encoding.items() if k not in ("input_ids", "attention_mask")}
    if not image_inputs or not all(isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] % rows == 0
                                   for v in image_inputs.values()):
        return None  # per-image tensors in blocks of equal size per row (InternVL's tiles), or not shareable
    token = vlm.adapter.image_token_id(vlm.processor)
    starts = (width - mask.sum(dim=1)).tolist()
    ends = []
    for r in range(rows):
        where = (ids[r] == token).nonzero()
        if not len(where):
            return None
        ends.append(int(where.max()) + 1)
    lengths = {end - start for end, start in zip(ends, starts)}
    if len(lengths) != 1 or not bool((mask[torch.arange(rows)[:, None], torch.tensor(starts)[:, None]
                                           + torch.arange(next(iter(lengths)))] == 1).all()):
        return None
    length = lengths.pop()
    # past the image, the rows usually go on alike (the instruction before the expression): share that too, up to
    # the first token where any two rows differ, leaving every row at least one token to run
    sizes = [width - start for start in starts]
    reference = ids[0, starts[0]:]
    while length < min(sizes) - 1 and all(int(ids[r, starts[r] + length]) == int(reference[length])
                                          for r in range(rows)):
        length += 1
    keys: dict[bytes, int] = {}
    first: list[int] = []
    image_of: list[int] = []
    for r in range(rows):
        prefix = ids[r, starts[r]:starts[r] + length]
        key = b"".join(row_block(v, rows, r).detach().cpu().contiguous().numpy().tobytes()
                       for v in image_inputs.values())
        key += prefix.cpu().numpy().tobytes()
        if key not in keys:
            keys[key] = len(first)
            first.append(r)
        image_of.append(keys[key])
    if len(first) == rows and not unique:  # no image repeats: nothing to share
        return None
    prefix_ids = torch.stack([ids[r, starts[r]:starts[r] + length] for r in first])
    return SharedPrefix(prefix_ids, first, image_of, starts)


def _generate_from_prefix(vlm: VLM, encoding: Mapping[str, Any], conditions: Sequence[tuple[HeadSet | None, Ablation]],
                          prefix: SharedPrefix, *, max_new_tokens: int, segments: torch.Tensor | None = None,
                          **generate_kwargs: Any) -> list[torch.Tensor]:
    """``generate_conditions`` through ``prefix``: one masked forward over the distinct image prefixes of every
    condition (rows condition-major, ``images`` per condition), its cache gathered to the batch's rows, then the
    suffixes generated on it. ``segments`` (the left-padded batch's, for mean ablation) are cut the same way: the
    prefix's for the prefix pass, the suffix's (padding between) for the generation. Returns what
    ``generate_conditions`` returns: the original left-padded prompt ids followed by the new tokens."""
    import nnsight

    ids, mask = encoding["input_ids"], encoding["attention_mask"]
    rows, width = ids.shape
    count, images, length = len(conditions), len(prefix.first), prefix.length
    masked = any(h is not None and len(h) for h, _ in conditions)
    prefix_encoding = {"input_ids": prefix.ids.repeat(count, 1), "attention_mask": torch.ones_like(prefix.ids).repeat(
        count, 1)}
    image_inputs = {key: torch.cat([row_block(value, rows, r) for r in prefix.first], dim=0)
                    for key, value in encoding.items() if key not in ("input_ids", "attention_mask")}
    if count == 1:
        prefix_encoding.update(image_inputs)
    else:  # the vision tower once per image; every condition's rows get its features (masking is in the LM only)
        with torch.no_grad():
            features = vlm.hf_model.model.get_image_features(**image_inputs, return_dict=True)
        pooled = features.pooler_output
        features.pooler_output = torch.cat([pooled] * count) if isinstance(pooled, torch.Tensor) \
            else type(pooled)(list(pooled) * count)  # condition-major, as the prefix rows
        prefix_encoding["mm_encoder_outputs"] = {"image": features}
    suffixes = [ids[r, prefix.starts[r] + length:] for r in range(rows)]
    longest = max(len(x) for x in suffixes)
    prefix_segments = suffix_segments = None
    if segments is not None:
        prefix_segments = torch.stack([segments[r, prefix.starts[r]:prefix.starts[r] + length] for r in prefix.first])
        suffix_segments = torch.full((rows, longest), PAD, dtype=segments.dtype)
        for r, suffix in enumerate(suffixes):
            suffix_segments[r, longest - len(suffix):] = segments[r, prefix.starts[r] + length:]
    model = nnsight_model(vlm)
    with torch.no_grad():
        if masked:
            template = condition_ablation(vlm, conditions, images, segments=prefix_segments)
            with model.trace(**prefix_encoding, use_cache=True):
                apply_in_order(model, [template])
                cache = nnsight.save(model.output.cache)
        else:
            cache = vlm.hf_model(**prefix_encoding, use_cache=True).cache
    image_of = torch.tensor(prefix.image_of)
    cache.batch_select_indices(torch.cat([c * images + image_of for c in range(count)]).to(ids.device))
    pad = getattr(getattr(vlm.processor, "tokenizer", None), "pad_token_id", None)
    full = torch.full((rows, length + longest), int(pad or 0), dtype=ids.dtype, device=ids.device)
    full_mask = torch.zeros((rows, length + longest), dtype=mask.dtype, device=mask.device)
    for r, suffix in enumerate(suffixes):
        full[r, :length] = prefix.ids[prefix.image_of[r]]
        full[r, length + longest - len(suffix):] = suffix
        full_mask[r, :length] = 1
        full_mask[r, length + longest - len(suffix):] = 1
    templates = [condition_ablation(vlm, conditions, rows, segments=suffix_segments)] if masked else []
    out = run_generate(vlm, {"input_ids": full.repeat(count, 1), "attention_mask": full_mask.repeat(count, 1),
                             "cache": cache}, templates, max_new_tokens=max_new_tokens, **generate_kwargs).ids
    new = out[:, length + longest:]
    return [torch.cat([ids, part.to(ids.device)], dim=1) for part in new.split(rows, dim=0)]


def batch_segments(batch: GroundingBatch, encoding: Mapping[str, Any] | None = None) -> torch.Tensor:
    """``[batch, seq]`` position segments (visual / prompt / answer / pad, ``templates.ablation.segment_ids``) of
    ``batch``'s encoding, or of ``encoding`` (the batch's prompts with a teacher-forced answer appended)."""
    encoding = batch.encoding if encoding is None else encoding
    return segment_ids(encoding["attention_mask"], [layout.visual_positions for layout in batch.layouts],
                       batch.prompt_length)


def encoding_segments(vlm: VLM, encoding: Mapping[str, Any], image_sizes: Sequence[tuple[int, int]]) -> torch.Tensor:
    """``[batch, seq]`` position segments of any prompt encoding with one image per row (e.g. VQA prompts):
    visual positions from the family's ``visual_layout`` of each row's image (``(width, height)``)."""
    layouts = [vlm.adapter.visual_layout(encoding, size, vlm.processor, i) for i, size in enumerate(image_sizes)]
    return segment_ids(encoding["attention_mask"], [layout.visual_positions for layout in layouts])


def attention_readout(vlm: VLM, prefill_rows: Sequence[int] | torch.Tensor, *, layers: Sequence[int] | None = None,
                      heads: HeadsLike | None = None) -> AttentionRowsReadout:
    """Readout of ``prefill_rows`` (and the fed-in token at each decode step) for ``layers`` / ``heads``."""
    geometry = vlm.geometry
    if heads is not None:
        heads = geometry.validate(heads, "attention_readout(heads)")
        by_layer = {layer: tuple(idx) for layer, idx in heads.by_layer().items()}
        layer_list = sorted(by_layer)
    else:
        by_layer = None
        layer_list = sorted(layers) if layers is not None else list(range(geometry.num_layers))
    bad = [layer for layer in layer_list if not 0 <= layer < geometry.num_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range for a model with {geometry.num_layers} layers")
    described = getattr(vlm.adapter, "rows_readout", None)  # a DescribedAdapter recomputes q / k itself
    if described is not None:
        return described(layer_list, prefill_rows, heads_by_layer=by_layer)
    paths = {layer: vlm.adapter.attention_path(layer) for layer in layer_list}
    label = attention_call_label(vlm.adapter.attention_module(vlm.nn, layer_list[0]).source.names)
    return AttentionRowsReadout.build(paths, label, prefill_rows, heads_by_layer=by_layer)


def head_redirect(vlm: VLM, heads: HeadsLike | Sequence[HeadSet | None], alphas: float | Sequence[float],
                  target_keys: torch.Tensor, *, prefill_rows: Sequence[int] | torch.Tensor = (-1,)) -> HeadRedirect:
    """Redirect heads onto ``target_keys`` (``[rows, prompt_len]`` booleans, e.g. ``region_keys``) with a
    pre-softmax bias ``alpha`` at the answer rows (``templates.redirect.HeadRedirect``). ``heads`` is one head set
    for every row (any form ``HeadSet.coerce`` reads) or one per row (``[HeadSet | None, ...]``), ``alphas`` one
    number or one per row."""
    rows = int(target_keys.shape[0])
    per_row = isinstance(heads, (list, tuple)) and len(heads) == rows and len(heads) > 0 and all(
        h is None or isinstance(h, HeadSet) for h in heads)
    if per_row:
        sets = [vlm.geometry.validate(h, "head_redirect(heads)") if h is not None else None for h in heads]
    else:
        sets = [vlm.geometry.validate(heads, "head_redirect(heads)")] * rows
    strengths = [float(alphas)] * rows if isinstance(alphas, (int, float)) else [float(a) for a in alphas]
    if getattr(vlm.adapter, "rows_readout", None) is not None:
        raise ReadoutUnavailableError("redirection recomputes heads from the attention-function call's inputs; this "
                                      "model's attention is described (families.described) and has none")
    layers = sorted({layer for s in sets if s is not None for layer in s.by_layer()}) or [0]
    label = attention_call_label(vlm.adapter.attention_module(vlm.nn, layers[0]).source.names)
    return HeadRedirect.build(sets, strengths, target_keys, vlm.geometry, attention_path=vlm.adapter.attention_path,
                              projection_path=projection_path(vlm), call_label=label, prefill_rows=prefill_rows)


def region_keys(batch: GroundingBatch, boxes: Sequence[Any]) -> torch.Tensor:
    """``[batch, prompt_len]`` booleans: row r's visual tokens whose patch overlaps ``boxes[r]`` (original-image
    pixels; ``VisualLayout.positions_for_box``, what head scoring calls the region: tiles, thumbnails and
    non-square grids included)."""
    from vrh_interp.core.description.boxes import Box

    if len(boxes) != batch.batch_size:
        raise ValueError(f"{len(boxes)} boxes for a batch of {batch.batch_size}")
    keys = torch.zeros(batch.batch_size, batch.prompt_length, dtype=torch.bool)
    for row, (layout, box) in enumerate(zip(batch.layouts, boxes)):
        box = box if isinstance(box, Box) else Box(*(float(v) for v in box))
        keys[row, layout.positions_for_box(box)] = True
    return keys


def head_output_capture(vlm: VLM, layers: Sequence[int] | None = None) -> HeadOutputCapture:
    geometry = vlm.geometry
    return HeadOutputCapture.build(list(layers) if layers is not None else list(range(geometry.num_layers)),
                                   geometry, projection_path(vlm))


def head_output_patch(vlm: VLM, heads: HeadsLike, **kwargs: Any) -> HeadOutputPatch:
    return HeadOutputPatch.build(vlm.geometry.validate(heads, "head_output_patch(heads)"), vlm.geometry,
                                 projection_path(vlm), **kwargs)


@dataclass
class ForwardResult:
    logits: torch.Tensor
    values: list[dict[int, torch.Tensor]]  # per template: {layer: value} (readouts, captures)


@dataclass
class GenerateResult:
    ids: torch.Tensor  # [batch, prompt + new]
    steps: list[list[dict[int, torch.Tensor]]]  # per step, per template: {layer: value}


def run_forward(vlm: VLM, encoding: Mapping[str, Any], templates: Sequence[LayerTemplate] = ()) -> ForwardResult:
    """One ``model.trace`` with ``templates`` applied, where ``vlm`` runs (``vlm.remote``)."""
    import nnsight

    model, remote = nnsight_model(vlm), vlm.remote
    prepare_remote(vlm)
    with torch.no_grad(), remote_errors(vlm):
        with model.trace(**dict(encoding), remote=remote):
            values = nnsight.save(apply_in_order(model, templates))
            logits = nnsight.save(model.output.logits)
    return ForwardResult(logits=logits, values=values)


def run_generate(vlm: VLM, encoding: Mapping[str, Any], templates: Sequence[LayerTemplate] = (), *,
                 max_new_tokens: int, **generate_kwargs: Any) -> GenerateResult:
    """``model.generate`` with ``templates`` at every step, where ``vlm`` runs (``vlm.remote``)."""
    import nnsight

    model, remote = nnsight_model(vlm), vlm.remote
    prepare_remote(vlm)
    generate_kwargs.setdefault("do_sample", False)
    with torch.no_grad(), warnings.catch_warnings(), remote_errors(vlm):
        warnings.filterwarnings("ignore", message=OPEN_LOOP_WARNING)
        if not templates:  # an iter loop that touches no module would never advance
            with model.generate(**dict(encoding), max_new_tokens=max_new_tokens, remote=remote,
                                **generate_kwargs) as tracer:
                ids = nnsight.save(tracer.result)
            return GenerateResult(ids=ids, steps=[])
        with model.generate(max_new_tokens=max_new_tokens, remote=remote, **generate_kwargs) as tracer:
            with tracer.invoke(**dict(encoding)):
                steps = nnsight.save([])
                for _ in tracer.iter[:]:
                    steps.append(apply_in_order(model, templates))
            with tracer.invoke():
                ids = nnsight.save(tracer.result)
    return GenerateResult(ids=ids, steps=steps)


def projection_path(vlm: VLM) -> Any:
    """``layer -> dotted path`` of the output projection whose input holds the per-head outputs."""
    adapter = vlm.adapter
    return lambda layer: f"{adapter.attention_path(layer)}.{adapter.output_projection_attr}"
