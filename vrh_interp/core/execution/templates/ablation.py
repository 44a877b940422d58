"""Head ablation: replace a head's contribution BEFORE the output projection.

A head's output is its ``head_dim``-wide slice of the INPUT of ``o_proj``; replacing that slice changes
exactly that head's term of the attention block's output (the paper's masking, Wu et al.'s convention;
OCR_Head and pyvene do the same). Zeroing pre-softmax scores or queries instead makes the head attend
uniformly (it still writes the mean of V), and splitting the o_proj OUTPUT into "heads" isolates
nothing: both are mistakes found in peer code.

Three kinds (``Ablation.kind``; each a class in ``core.execution.ablation_kinds``, where a new kind is one more class):

* ``zero``: the slice is set to 0 (the paper's masking).
* ``mean``: the slice is set to the head's mean output over a reference set (the detection samples), taken
  separately per position SEGMENT: visual tokens, prompt text (every other prompt token) and answer
  tokens. A head writes different things on image tokens, on text and while answering; one mean over all
  positions would be dominated by the visual tokens (most of a sequence) and put an off-distribution value
  on text and answer tokens. Means are token-weighted over all reference tokens of the segment.
* ``resample``: the slice is set to the head's output on ANOTHER sample, segment by segment: the donor's
  mean over its own tokens of that segment. Copying position by position is undefined as soon as two
  prompts differ in length, image layout (dynamic resolution) or answer length; the donor's per-segment
  mean is defined for any pair, keeps what the head wrote for another image and expression, and drops
  only within-segment position detail. A sample's donor is a fixed function of its id (crc32 of the id
  into the reference set, skipping the sample itself), never of its batch, so batched, sharded and
  resumed runs ablate every sample identically.

Reference statistics come from ``evaluation.grounding.ablation_values`` (one teacher-forced forward per
batch with a ``SegmentSumCapture``): per reference sample, per layer and segment, the SUM of every head's
output and the token count (``AblationValues``), from which both the pooled means and each donor's means
follow.

Segments are given per batch by ``segment_ids``: ``[batch, seq]`` with ``PAD=-1, VISUAL=0, PROMPT=1,
ANSWER=2``. A forward as long as the segment map is the prompt (or prompt + a teacher-forced answer); a
one-token forward is a decode step, whose token is an answer token. Padding is left untouched (no real
token attends to it).
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

# re-exported (the registry's names)
from vrh_interp.core.execution.ablation_kinds import ABLATION_KINDS as ABLATION_KINDS
from vrh_interp.core.execution.ablation_kinds import AblationMethod, ablation_method
from vrh_interp.core.description.heads import HeadGeometry, HeadSet
from vrh_interp.core.execution.templates import ProjectionTemplate
from vrh_interp.core.execution.templates.head_outputs import HeadOutputCapture

# a registered kind's name (``core.execution.ablation_kinds.ABLATION_KINDS``: "zero", "mean", "resample")
AblationKind = str
SEGMENTS: tuple[str, ...] = ("visual", "prompt", "answer")
PAD, VISUAL, PROMPT, ANSWER = -1, 0, 1, 2


def segment_ids(attention_mask: torch.Tensor, visual_positions: Sequence[Sequence[int]],
                prompt_length: int | None = None) -> torch.Tensor:
    """``[batch, seq]`` segment of every position: ``VISUAL`` at each row's ``visual_positions`` (a layout's
    ``visual_positions``), ``ANSWER`` from ``prompt_length`` on (teacher-forced answers; default: no answer),
    ``PROMPT`` elsewhere, ``PAD`` where ``attention_mask`` is 0."""
    mask = attention_mask.detach().bool().cpu()
    batch, seq = mask.shape
    prompt_length = seq if prompt_length is None else prompt_length
    if len(visual_positions) != batch:
        raise ValueError(f"{len(visual_positions)} rows of visual positions for a batch of {batch}")
    segments = torch.full((batch, seq), PROMPT, dtype=torch.long)
    segments[:, prompt_length:] = ANSWER
    for row, positions in enumerate(visual_positions):
        positions = list(positions)
        if positions and not 0 <= min(positions) <= max(positions) < prompt_length:
            raise ValueError(f"row {row}: visual positions outside the prompt (length {prompt_length})")
        segments[row, positions] = VISUAL
    segments[~mask] = PAD
    return segments


@dataclass(frozen=True, eq=False)
class AblationValues:
    """Per reference sample, layer and segment: the SUM of every head's output and the segment's token count.

    ``sums`` is ``[samples, layers, segments, num_heads * head_dim]`` (float32), ``counts`` ``[samples, segments]``.
    Built by ``evaluation.grounding.ablation_values``; ``save`` / ``load`` keep it next to a run.
    """

    sample_ids: tuple[str, ...]
    sums: torch.Tensor
    counts: torch.Tensor

    def __post_init__(self) -> None:
        n = len(self.sample_ids)
        if n == 0:
            raise ValueError("AblationValues needs at least one reference sample")
        if len(set(self.sample_ids)) != n:
            raise ValueError("AblationValues: duplicate reference sample ids")
        if self.sums.dim() != 4 or self.sums.shape[0] != n or self.sums.shape[2] != len(SEGMENTS):
            raise ValueError(f"sums must be [{n}, layers, {len(SEGMENTS)}, width], got {tuple(self.sums.shape)}")
        if tuple(self.counts.shape) != (n, len(SEGMENTS)):
            raise ValueError(f"counts must be [{n}, {len(SEGMENTS)}], got {tuple(self.counts.shape)}")

    def check(self, geometry: HeadGeometry) -> None:
        """Refuse values collected on a model with another head grid (``sums`` is [samples, layers, segments,
        width])."""
        layers, width = int(self.sums.shape[1]), int(self.sums.shape[3])
        if (layers, width) != (geometry.num_layers, geometry.num_heads * geometry.head_dim):
            raise ValueError(
                f"ablation values are for {layers} layers x width {width}, the model has "
                f"{geometry.num_layers} x {geometry.num_heads * geometry.head_dim}: compute them on this model "
                "(evaluation.grounding.ablation_values)")

    def mean(self) -> torch.Tensor:
        """``[layers, segments, width]``: every head's token-weighted mean output per segment over all samples
        (computed once; do not modify it in place)."""
        return self._mean

    @functools.cached_property
    def _mean(self) -> torch.Tensor:
        counts = self.counts.sum(0)
        empty = [SEGMENTS[s] for s in range(len(SEGMENTS)) if counts[s] == 0]
        if empty:
            raise ValueError(f"the reference samples have no {' / '.join(empty)} tokens: mean ablation is undefined")
        return self.sums.sum(0) / counts[None, :, None].to(self.sums.dtype)

    def donor(self, sample_id: str) -> int:
        """Index of the reference sample whose outputs replace ``sample_id``'s under resample ablation."""
        n = len(self.sample_ids)
        index = zlib.crc32(sample_id.encode("utf-8")) % n
        if self.sample_ids[index] == sample_id:
            if n == 1:
                raise ValueError(f"resample ablation of {sample_id!r}: the only reference sample is the sample "
                                 "itself; use at least two reference samples")
            index = (index + 1) % n
        return index

    def donor_mean(self, sample_id: str) -> torch.Tensor:
        """``[layers, segments, width]``: the donor's per-segment mean outputs (resample ablation)."""
        index = self.donor(sample_id)
        counts = self.counts[index]
        empty = [SEGMENTS[s] for s in range(len(SEGMENTS)) if counts[s] == 0]
        if empty:
            raise ValueError(f"resample donor {self.sample_ids[index]!r} has no {' / '.join(empty)} tokens")
        return self.sums[index] / counts[None, :, None].to(self.sums.dtype)

    def fingerprint(self) -> str:
        """A digest of ids and values, for run manifests: resuming with other values is then refused."""
        digest = hashlib.sha256("\n".join(self.sample_ids).encode("utf-8"))
        for tensor in (self.sums, self.counts):
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()[:16]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        torch.save({"sample_ids": list(self.sample_ids), "sums": self.sums, "counts": self.counts}, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "AblationValues":
        data = torch.load(Path(path), weights_only=True)
        return cls(tuple(data["sample_ids"]), data["sums"], data["counts"])


@dataclass(frozen=True, eq=False)
class Ablation:
    """What replaces an ablated head's output: ``kind`` and, for ``mean`` / ``resample``, the reference ``values``."""

    kind: AblationKind = "zero"
    values: AblationValues | None = None

    def __post_init__(self) -> None:
        method = ablation_method(self.kind)
        if method.needs_reference_values and self.values is None:
            raise ValueError(f"{self.kind} ablation needs reference values: Ablation({self.kind!r}, "
                             "ablation_values(vlm, detection_samples)) (vrh_interp.evaluation.grounding)")
        if not method.needs_reference_values and self.values is not None:
            raise ValueError(f"{self.kind} ablation takes no reference values")

    @property
    def method(self) -> AblationMethod:
        """The kind as an object (``core.execution.ablation_kinds``): what replaces the heads' outputs, what it
        needs."""
        return ablation_method(self.kind)

    @property
    def replaces_by_segment(self) -> bool:
        """Replacement values per position segment (the kind has reference values): masking then needs the
        batch's ``segment_ids``."""
        return self.method.needs_reference_values

    def manifest(self) -> dict[str, Any]:
        """What a run folder records about the ablation (kind and a digest of the values)."""
        return {"kind": self.kind, "values": self.values.fingerprint() if self.values is not None else None}

    def replacement(self, sample_id: str | None = None) -> torch.Tensor:
        """``[layers, segments, width]``: what replaces the masked heads' outputs (of ``sample_id`` for a
        per-sample kind such as ``resample``)."""
        if self.values is None:
            raise ValueError(f"{self.kind} ablation has no replacement values (it sets the heads' outputs to 0)")
        return self.method.values_for(self.values, sample_id)

    def tables(self, layers: Sequence[int], sample_ids: Sequence[str] | None = None) -> dict[int, torch.Tensor]:
        """``{layer: [rows, segments, width]}``: one row shared by all samples (``mean``) or one per sample in
        ``sample_ids`` order (a per-sample kind: ``resample``); empty for ``zero``."""
        if self.values is None:
            return {}
        if not self.method.per_sample or sample_ids is None:
            shared = self.replacement()  # a per-sample kind refuses: it needs the sample ids
            return {layer: shared[layer][None] for layer in layers}
        rows = torch.stack([self.replacement(sample_id) for sample_id in sample_ids])
        return {layer: rows[:, layer] for layer in layers}


ZERO_ABLATION = Ablation()


@dataclass(frozen=True)
class HeadAblation(ProjectionTemplate):
    """Ablate ``heads`` (zero, or replace by per-segment values); use inside a trace via ``apply_in_order`` or
    ``apply``. ``tables[layer]`` is ``[rows (1 or batch), segments, heads of that layer, head_dim]``."""

    projection_paths: Mapping[int, str]  # layer -> path of its output projection (o_proj)
    heads_by_layer: Mapping[int, tuple[int, ...]]
    num_heads: int
    head_dim: int
    kind: AblationKind = "zero"
    tables: Mapping[int, torch.Tensor] = field(default_factory=dict)
    segments: torch.Tensor | None = None  # [batch, seq]: PAD / VISUAL / PROMPT / ANSWER

    @classmethod
    def build(cls, heads: HeadSet, geometry: HeadGeometry, projection_path: Any, ablation: Ablation = ZERO_ABLATION,
              *, segments: torch.Tensor | None = None, sample_ids: Sequence[str] | None = None) -> "HeadAblation":
        """``projection_path(layer) -> str`` gives the o_proj path of a layer (``FamilyAdapter``). ``mean`` and
        ``resample`` need the batch's ``segments`` (``segment_ids``); ``resample`` also its ``sample_ids``."""
        heads = geometry.validate(heads)
        by_layer = {layer: tuple(idx) for layer, idx in heads.by_layer().items()}
        paths = {layer: projection_path(layer) for layer in by_layer}
        if not ablation.replaces_by_segment:
            return cls(paths, by_layer, geometry.num_heads, geometry.head_dim, ablation.kind)
        assert ablation.values is not None
        ablation.values.check(geometry)
        if segments is None:
            raise ValueError(f"{ablation.kind} ablation replaces outputs segment by segment: pass segments="
                             "segment_ids(attention_mask, visual_positions) for the batch (ground_batch does)")
        if sample_ids is not None and len(sample_ids) != segments.shape[0]:
            raise ValueError(f"{len(sample_ids)} sample ids for a batch of {segments.shape[0]} rows")
        tables = {}
        for layer, table in ablation.tables(sorted(by_layer), sample_ids).items():
            per_head = table.view(table.shape[0], len(SEGMENTS), geometry.num_heads, geometry.head_dim)
            tables[layer] = per_head[:, :, list(by_layer[layer])].clone()
        return cls(paths, by_layer, geometry.num_heads, geometry.head_dim, ablation.kind, tables,
                   segments.detach().cpu().long())

    def at_output_projection(self, model: Any, layer: int) -> None:
        per_head = self.per_head(model, layer)
        heads = list(self.heads_by_layer[layer])
        if not self.tables:  # a kind without reference values (zero): every position, padding too
            per_head[:, :, heads] = 0
            return
        assert self.segments is not None
        batch, seq = per_head.shape[:2]
        device = per_head.device
        segments = forward_segments(self.segments, batch, seq, device, f"{self.kind} ablation")
        if batch != segments.shape[0]:
            raise ValueError(f"{self.kind} ablation was built for a batch of {segments.shape[0]}, got {batch}")
        table = self.tables[layer].to(device=device, dtype=per_head.dtype).expand(batch, -1, -1, -1)
        replacement = table[torch.arange(batch, device=device)[:, None], segments.clamp(min=0)]  # [b, s, n, d]
        keep = (segments == PAD)[:, :, None, None]
        per_head[:, :, heads] = torch.where(keep, per_head[:, :, heads], replacement)

    def apply(self, model: Any) -> None:
        """Apply at every layer, in order (for use inside ``model.trace`` or one generation step)."""
        for layer in sorted(self.heads_by_layer):
            self.at_output_projection(model, layer)


def forward_segments(segments: torch.Tensor, batch: int, seq: int, device: Any, what: str) -> torch.Tensor:
    """The segment ids of this forward: the built ``[batch, seq]`` ids at the prompt forward, ``ANSWER`` at a
    one-token decode step (the token fed in is an answer token)."""
    if seq == segments.shape[1]:
        return segments.to(device)
    if seq == 1:
        return torch.full((batch, 1), ANSWER, dtype=torch.long, device=device)
    raise ValueError(f"{what} was built for sequences of {segments.shape[1]} tokens (and one-token decode steps), "
                     f"this forward has {seq}: build it for this encoding")


@dataclass(frozen=True)
class RowHeadAblation(ProjectionTemplate):
    """Ablation that differs per batch ROW: row r ablates its own heads with its own kind (condition batching).

    One batched generation then evaluates many conditions (head sets, ablation kinds) over the same samples: the
    encoded batch is replicated once per condition (rows condition-major, ``interventions.replicate_encoding``)
    and row r of block c is masked like condition c alone would mask it. At the output projection's input, per
    layer, the heads any row ablates there (``heads_by_layer``) are edited with ONE ``torch.where`` over the
    ``[rows, seq, heads, head_dim]`` view: ``masks[layer]`` (``[rows, heads]``) selects the (row, head) pairs and
    ``tables[layer]`` (``[rows, segments, heads, head_dim]``, absent when every row zero-ablates) holds each row's
    replacement per segment (zeros for zero rows, the pooled means for mean rows, the row's donor means for
    resample rows). Like ``HeadAblation``, zero rows also zero padding positions and mean / resample rows leave
    them untouched (``keep_padding``), so each row gets exactly the values the single-condition template gives."""

    projection_paths: Mapping[int, str]
    heads_by_layer: Mapping[int, tuple[int, ...]]  # union over rows
    masks: Mapping[int, torch.Tensor]  # layer -> [rows, len(heads_by_layer[layer])] bool
    num_heads: int
    head_dim: int
    tables: Mapping[int, torch.Tensor] = field(default_factory=dict)  # layer -> [rows, segments, heads, head_dim]
    segments: torch.Tensor | None = None  # [rows, seq], only with tables
    keep_padding: torch.Tensor | None = None  # [rows] bool: rows whose padding is left untouched

    @classmethod
    def build(cls, heads: Sequence[HeadSet | None], ablations: Sequence[Ablation], geometry: HeadGeometry,
              projection_path: Any, *, segments: torch.Tensor | None = None,
              sample_ids: Sequence[str] | None = None) -> "RowHeadAblation":
        """``heads[r]`` / ``ablations[r]``: what row r ablates and how (None or an empty set: nothing).
        ``segments`` (``[rows, seq]``) is needed as soon as a row uses ``mean`` or ``resample``, ``sample_ids``
        (one per row) for ``resample``."""
        rows = len(heads)
        if len(ablations) != rows:
            raise ValueError(f"{len(ablations)} ablations for {rows} rows of heads")
        if rows == 0:
            raise ValueError("RowHeadAblation needs at least one row")
        sets = [geometry.validate(h) if h is not None else HeadSet() for h in heads]
        union: dict[int, set[int]] = {}
        for head_set in sets:
            for layer, idx in head_set.by_layer().items():
                union.setdefault(layer, set()).update(idx)
        by_layer = {layer: tuple(sorted(union[layer])) for layer in sorted(union)}
        paths = {layer: projection_path(layer) for layer in by_layer}
        masks = {}
        for layer, layer_heads in by_layer.items():
            column = {h: j for j, h in enumerate(layer_heads)}
            mask = torch.zeros(rows, len(layer_heads), dtype=torch.bool)
            for r, head_set in enumerate(sets):
                for h in head_set.by_layer().get(layer, ()):
                    mask[r, column[h]] = True
            masks[layer] = mask
        replacing = [r for r in range(rows) if ablations[r].replaces_by_segment and len(sets[r])]
        if not replacing:
            return cls(paths, by_layer, masks, geometry.num_heads, geometry.head_dim)
        if segments is None:
            raise ValueError("mean / resample ablation replaces outputs segment by segment: pass segments= (one row "
                             "per batch row, interventions.batch_segments)")
        if segments.shape[0] != rows:
            raise ValueError(f"segments have {segments.shape[0]} rows for a batch of {rows}")
        if sample_ids is not None and len(sample_ids) != rows:
            raise ValueError(f"{len(sample_ids)} sample ids for a batch of {rows} rows")
        sources: dict[int, torch.Tensor] = {}  # row -> [layers, segments, width]; zero rows have none
        for r in replacing:
            ablation = ablations[r]
            assert ablation.values is not None
            ablation.values.check(geometry)
            sources[r] = ablation.replacement(sample_ids[r] if sample_ids is not None else None)
        filled = list(sources)
        stacked = torch.stack([sources[r] for r in filled])  # [filled rows, layers, segments, width]
        stacked = stacked.view(len(filled), geometry.num_layers, len(SEGMENTS), geometry.num_heads, geometry.head_dim)
        tables = {}
        for layer, layer_heads in by_layer.items():
            table = torch.zeros(rows, len(SEGMENTS), len(layer_heads), geometry.head_dim, dtype=stacked.dtype)
            table[filled] = stacked[:, layer][:, :, list(layer_heads)]
            tables[layer] = table
        keep = torch.tensor([a.replaces_by_segment for a in ablations], dtype=torch.bool)
        return cls(paths, by_layer, masks, geometry.num_heads, geometry.head_dim, tables,
                   segments.detach().cpu().long(), keep)

    @property
    def rows(self) -> int:
        return int(next(iter(self.masks.values())).shape[0]) if self.masks else 0

    def at_output_projection(self, model: Any, layer: int) -> None:
        per_head = self.per_head(model, layer)
        heads = list(self.heads_by_layer[layer])
        batch, seq = per_head.shape[:2]
        device = per_head.device
        mask = self.masks[layer].to(device)
        if batch != mask.shape[0]:
            raise ValueError(f"the per-row ablation was built for {mask.shape[0]} rows, the batch has {batch}")
        if not self.tables:
            per_head[:, :, heads] = torch.where(mask[:, None, :, None], 0.0, per_head[:, :, heads])
            return
        assert self.segments is not None and self.keep_padding is not None
        segments = forward_segments(self.segments, batch, seq, device, "the per-row ablation")
        table = self.tables[layer].to(device=device, dtype=per_head.dtype)
        replacement = table[torch.arange(batch, device=device)[:, None], segments.clamp(min=0)]  # [b, s, n, d]
        untouched = (segments == PAD) & self.keep_padding.to(device)[:, None]
        apply = mask[:, None, :, None] & ~untouched[:, :, None, None]
        per_head[:, :, heads] = torch.where(apply, replacement, per_head[:, :, heads])

    def apply(self, model: Any) -> None:
        """Apply at every layer, in order (for use inside ``model.trace`` or one generation step)."""
        for layer in sorted(self.heads_by_layer):
            self.at_output_projection(model, layer)


@dataclass(frozen=True)
class SegmentSumCapture:
    """Per-segment SUMS of every head's output at the capture's layers: ``{layer: [batch, segments, width]}``
    (float32), reduced inside the trace so only these come back (remote-safe, no ``[batch, seq, ...]`` copy)."""

    capture: HeadOutputCapture
    segments: torch.Tensor  # [batch, seq]

    def layers(self) -> Sequence[int]:
        return self.capture.layers()

    def at_attention_call(self, model: Any, layer: int) -> None:
        return None

    def at_output_projection(self, model: Any, layer: int) -> torch.Tensor:
        outputs = self.capture.at_output_projection(model, layer)  # [b, s, heads, head_dim]
        batch, seq = outputs.shape[:2]
        segments = self.segments.to(outputs.device)
        if tuple(segments.shape) != (batch, seq):
            raise ValueError(f"segments {tuple(segments.shape)} do not match the forward's [batch, seq] {(batch, seq)}")
        onehot = torch.nn.functional.one_hot(segments.clamp(min=0), len(SEGMENTS)) * (segments != PAD)[..., None]
        return torch.einsum("bsk,bsw->bkw", onehot.float(), outputs.reshape(batch, seq, -1).float())
