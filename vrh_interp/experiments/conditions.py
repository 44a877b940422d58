"""The condition vocabulary every masking experiment shares: ``Condition`` (what one masked run of the model is:
kind, k, seed, heads, ablation kind, and its key in run folders), the control sets drawn per k
(``control_conditions``, ``sweep_conditions``, ``largest_usable_k``), the ``Ablation`` a condition's kind names
(``ablation_for``) and what decides a condition's answers (``head_signature``).

Apart from ``experiments.sweep`` because the grounding sweep is only one of its users: the design space, head
scan, cross-masking, positive control, steering, the VQA sweep and the demo build and read the same conditions
without running grounding. The control kinds themselves are ``evaluation.controls.CONTROL_KINDS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from vrh_interp.core.execution.ablation_kinds import ABLATION_METHODS, DEFAULT_ABLATION_KIND, ablation_method
from vrh_interp.core.description.heads import HeadGeometry, HeadSet
from vrh_interp.core.execution.templates.ablation import ZERO_ABLATION, Ablation, AblationValues
from vrh_interp.evaluation.controls import DEFAULT_RANDOM_SEEDS, layer_matched_control, live_control, random_control


@dataclass(frozen=True)
class Condition:
    """One masked condition. ``kind``: "baseline", "top", a control kind ("random", "matched") or a caller's
    own (cross-masking's "own" / "transferred", design-space variants); ``ablation`` is how the heads are
    removed ("zero": the paper's zero ablation; appended to the key only when not "zero")."""

    kind: str
    k: int
    seed: int | None
    heads: HeadSet
    ablation: str = "zero"

    @property
    def key(self) -> str:
        return (f"{self.kind}:k={self.k}" + (f":seed={self.seed}" if self.seed is not None else "")
                + (f":ablation={self.ablation}" if self.ablation != DEFAULT_ABLATION_KIND else ""))

    @classmethod
    def from_key(cls, key: str, heads: HeadSet) -> "Condition":
        """The condition whose ``key`` is ``key`` (as run folders record them: ``{key: heads}``)."""
        kind, k, *rest = key.split(":")
        names = [part.partition("=")[0] for part in rest]
        if k.startswith("k=") and names in ([], ["seed"], ["ablation"], ["seed", "ablation"]):
            fields = dict(part.split("=", 1) for part in rest)
            return cls(kind, int(k[2:]), int(fields["seed"]) if "seed" in fields else None, heads,
                       fields.get("ablation", DEFAULT_ABLATION_KIND))
        raise ValueError(f"{key!r} is not a condition key such as 'random:k=5:seed=1'")


def control_conditions(geometry: HeadGeometry, detected: HeadSet, k: int, top_k_set: HeadSet | None,
                       random_seeds: Sequence[int], *, matched: bool = True, exclude_first_layer: bool = False,
                       ablation: str = "zero", live: HeadSet | None = None) -> list[Condition]:
    """The random (then, with ``matched`` and a ``top_k_set``, layer-matched; then, with ``live``, live-head)
    control sets at one k, one per seed."""
    conditions = [Condition("random", k, seed, random_control(geometry, detected, k, seed,
                                                              exclude_first_layer=exclude_first_layer), ablation)
                  for seed in random_seeds]
    if matched and top_k_set is not None:
        conditions += [Condition("matched", k, seed, layer_matched_control(geometry, detected, top_k_set, seed),
                                 ablation) for seed in random_seeds]
    if live is not None:
        conditions += [Condition("live", k, seed, live_control(live, detected, k, seed), ablation)
                       for seed in random_seeds]
    return conditions


def largest_usable_k(ranking: HeadSet, geometry: HeadGeometry, *, matched: bool = True,
                     exclude_first_layer: bool = False) -> int:
    """The largest k whose controls can be drawn when the top k of ``ranking`` is the detected set: k random
    heads outside it (and, with ``matched``, in each layer as many heads outside it as it has there)."""
    for k in range(min(len(ranking), geometry.total_heads), 0, -1):
        top = ranking[:k]
        outside = [h for h in geometry.all_heads() if h not in top and not (exclude_first_layer and h.layer == 0)]
        if k > len(outside):
            continue
        if matched and any(2 * len(heads) > geometry.num_heads for heads in top.by_layer().values()):
            continue
        return k
    return 0


def sweep_conditions(ranking: HeadSet, geometry: HeadGeometry, ks: Sequence[int],
                     random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, *, exclude_first_layer: bool = False,
                     matched: bool = True, ablation: str = "zero", live: HeadSet | None = None) -> list[Condition]:
    """Baseline, then per k > 0 (ascending): top-k, the random sets, the layer-matched sets, with ``live`` (the
    census's live heads) the live-head sets, all masked with ``ablation`` (the baseline masks nothing and stays
    ``baseline:k=0`` whatever the kind)."""
    total = geometry.total_heads
    bad = [k for k in ks if not 0 <= k <= total]
    if bad:
        raise ValueError(f"k values {bad} out of range: the model has {total} heads")
    if len(set(ks)) != len(ks):
        raise ValueError(f"duplicate k values in {list(ks)}")
    short = [k for k in ks if k > len(ranking)]
    if short:  # ranking[:k] would mask fewer heads than its label says
        raise ValueError(f"k values {short} exceed the ranking's {len(ranking)} heads: pass ks up to "
                         f"{len(ranking)} (--ks), or a longer ranking")
    detected = ranking[: max(ks)] if ks else HeadSet()
    conditions = [Condition("baseline", 0, None, HeadSet())]  # masks nothing: the same under every ablation kind
    for k in sorted(k for k in ks if k > 0):
        conditions.append(Condition("top", k, None, ranking[:k], ablation))
        try:
            conditions += control_conditions(geometry, detected, k, ranking[:k], random_seeds, matched=matched,
                                             exclude_first_layer=exclude_first_layer, ablation=ablation, live=live)
        except ValueError as error:
            usable = largest_usable_k(ranking, geometry, matched=matched, exclude_first_layer=exclude_first_layer)
            raise ValueError(
                f"k={k} with the top {max(ks)} heads as the detected set: {error}. The largest usable k on this "
                f"model ({total} heads) is {usable} ({usable / total:.1%}): pass ks up to {usable} (--ks)"
                + (", or leave the layer-matched control out (matched=False, --no-matched)" if matched else "")
            ) from None
    return conditions


def ablation_for(kind: str, values: AblationValues | None, geometry: HeadGeometry | None = None) -> Ablation:
    """The ``Ablation`` of ``kind`` (a name of the registry, ``core.execution.ablation_kinds``): a kind without
    reference values ("zero") ignores ``values``; "mean" and "resample" need them (checked against ``geometry`` when
    given)."""
    if kind not in ABLATION_METHODS:
        raise ValueError(f"unknown ablation kind {kind!r}: use one of {', '.join(ABLATION_METHODS)}")
    if not ablation_method(kind).needs_reference_values:
        return ZERO_ABLATION if kind == ZERO_ABLATION.kind else Ablation(kind)
    if values is None:
        raise ValueError(f"{kind} ablation needs reference outputs: pass ablation_values=ablation_values(vlm, "
                         "detection_samples) (vrh_interp.evaluation.grounding; the CLI computes them for --ablation)")
    if geometry is not None:
        values.check(geometry)
    return Ablation(kind, values)


def head_signature(cond: Condition) -> tuple[Any, ...]:
    """What decides a condition's answers: its heads as a set and the ablation kind (not its name)."""
    return (frozenset(cond.heads), cond.ablation)
