"""Ablation kinds as objects: what replaces a masked head's output, and what reference values that needs.

A kind is one class, registered in ``ABLATION_METHODS`` (the one place the CLI's ``--ablation`` choices, ``Ablation``,
``experiments.conditions.ablation_for`` and the backends' declarations read). Its ``name`` is what records, condition
keys and run-folder manifests write ("zero", "mean", "resample"), so run folders of earlier versions resume.

The templates (``core.execution.templates.ablation``) have two mechanisms and a kind picks one through
``needs_reference_values``: without reference values the head's slice is set to 0 at every position (padding
too); with them, ``replacement`` gives the values that replace it, per position segment (visual / prompt /
answer; padding left untouched), either one table for every sample or, with ``per_sample``, one per sample (which
rules out sharing a scene's image prefix between its rows). The module imports no torch: ``vrh --help`` reads the
registry.

Adding a kind: subclass ``AblationMethod``, set ``name`` (and the flags), implement ``replacement`` from
``AblationValues`` (``mean()`` pools every reference sample, ``donor_mean(sample_id)`` is one donor's), and add an
instance to ``ABLATION_METHODS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:  # torch only for the types
    import torch


class ReferenceValues(Protocol):
    """What a kind reads of its reference values (``core.execution.templates.ablation.AblationValues``, which imports
    this module: hence a protocol here)."""

    def mean(self) -> "torch.Tensor": ...

    def donor_mean(self, sample_id: str) -> "torch.Tensor": ...


class AblationMethod:
    """One ablation kind (subclass it; module doc). Instances are stateless and shared (``ablation_method``)."""

    name: ClassVar[str]
    needs_reference_values: ClassVar[bool] = True  # False: the slice is set to 0 (no values, padding zeroed too)
    per_sample: ClassVar[bool] = False  # True: each sample gets its own replacement (needs the batch's sample_ids)
    row_values: ClassVar[str] = "its own replacement"  # per-sample kinds: what each row gets (for messages)

    def values_for(self, values: ReferenceValues, sample_id: str | None = None) -> "torch.Tensor":
        """``replacement``, refusing a per-sample kind without the sample's id."""
        if self.per_sample and sample_id is None:
            raise ValueError(f"{self.name} ablation needs the batch's sample_ids (each row gets {self.row_values})")
        return self.replacement(values, sample_id)

    def replacement(self, values: ReferenceValues, sample_id: str | None = None) -> "torch.Tensor":
        """``[layers, segments, width]``: what replaces the masked heads' outputs (of ``sample_id`` when
        ``per_sample``), segment by segment."""
        raise NotImplementedError(f"{self.name} ablation sets the heads' outputs to 0: it has no replacement values")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ZeroAblation(AblationMethod):
    """The slice is set to 0 (the paper's masking)."""

    name = "zero"
    needs_reference_values = False


class MeanAblation(AblationMethod):
    """The slice is set to the head's mean output per position segment over the reference samples."""

    name = "mean"

    def replacement(self, values: ReferenceValues, sample_id: str | None = None) -> "torch.Tensor":
        return values.mean()


class ResampleAblation(AblationMethod):
    """The slice is set to another reference sample's (the donor's, a fixed function of the id) per-segment mean."""

    name = "resample"
    per_sample = True
    row_values = "its donor's outputs"

    def replacement(self, values: ReferenceValues, sample_id: str | None = None) -> "torch.Tensor":
        assert sample_id is not None  # values_for checks
        return values.donor_mean(sample_id)


# the registry: name -> the kind (the paper's zero first; `vrh ... --ablation` lists them in this order)
ABLATION_METHODS: dict[str, AblationMethod] = {m.name: m for m in (ZeroAblation(), MeanAblation(), ResampleAblation())}
ABLATION_KINDS: tuple[str, ...] = tuple(ABLATION_METHODS)
DEFAULT_ABLATION_KIND: str = ZeroAblation.name  # condition keys leave it out (``experiments.conditions.Condition``)


def ablation_method(kind: str) -> AblationMethod:
    """The registered kind called ``kind``; ValueError naming the registered ones otherwise."""
    try:
        return ABLATION_METHODS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"ablation kind must be one of {tuple(ABLATION_METHODS)}, got {kind!r}") from None
