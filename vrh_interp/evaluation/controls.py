"""Control head sets: random heads outside the detected set, and layer-matched heads (the same count per layer
as the set they control for). Seeded; nested in k for one seed."""

from __future__ import annotations

import numpy as np

from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet


DEFAULT_RANDOM_SEEDS: tuple[int, ...] = tuple(range(20))
# the control kinds a causal claim is judged against (condition kinds in sweeps; one function each below)
CONTROL_KINDS: tuple[str, ...] = ("random", "matched", "live")


def random_control(geometry: HeadGeometry, detected: HeadSet, k: int, seed: int, *,
                   exclude_first_layer: bool = False) -> HeadSet:
    """k heads drawn (seeded) from all heads not in ``detected`` (nested in k for a fixed seed)."""
    excluded = set(detected)
    eligible = [h for h in geometry.all_heads() if h not in excluded and not (exclude_first_layer and h.layer == 0)]
    if k > len(eligible):
        raise ValueError(f"cannot draw {k} random heads: only {len(eligible)} heads lie outside the detected set")
    order = np.random.default_rng(seed).permutation(len(eligible))
    return HeadSet(eligible[i] for i in order[:k])


def live_control(live: HeadSet, detected: HeadSet, k: int, seed: int) -> HeadSet:
    """k heads drawn (seeded) from the LIVE heads (``evaluation.census``: heads that measurably act) not in
    ``detected``: a control that inert heads cannot carry (nested in k for a fixed seed)."""
    excluded = set(detected)
    eligible = [h for h in live if h not in excluded]
    if k > len(eligible):
        raise ValueError(f"cannot draw {k} live heads: only {len(eligible)} live heads lie outside the detected set")
    order = np.random.default_rng(seed).permutation(len(eligible))
    return HeadSet(sorted((eligible[i] for i in order[:k]), key=lambda h: (h.layer, h.head)))


def layer_matched_control(geometry: HeadGeometry, detected: HeadSet, top_k_set: HeadSet, seed: int) -> HeadSet:
    """As many heads in each layer as ``top_k_set`` has there, drawn (seeded) from the heads not in ``detected``.

    ``np.random.default_rng(seed)`` permutes each layer's eligible heads in turn (layers in order, every layer,
    whatever the top-k set), and layer l contributes the first c_l of its permutation, c_l = the top-k set's
    heads in layer l. The draws therefore depend only on the seed and the detected set, so for one seed the
    sets are nested in k whenever the top-k sets are (prefixes of one ranking with one detected set, as in
    ``sweep``): per-layer counts only grow with k. Where the sets to match are not nested (a caller's
    unrelated head sets), each matched set is still a valid draw, just not a superset of the previous one.
    ``exclude_first_layer`` does not apply: a layer-matched set has layer-0 heads exactly when the top-k has.
    """
    geometry.validate(top_k_set)
    rng = np.random.default_rng(seed)
    counts = {layer: len(heads) for layer, heads in top_k_set.by_layer().items()}
    chosen = []
    excluded = set(detected)
    by_layer: dict[int, list[Head]] = {}
    for head in geometry.all_heads():  # (layer, head) order, as each layer's eligible list always was
        if head not in excluded:
            by_layer.setdefault(head.layer, []).append(head)
    for layer in range(geometry.num_layers):
        eligible = by_layer.get(layer, [])
        order = rng.permutation(len(eligible))
        need = counts.get(layer, 0)
        if need > len(eligible):
            raise ValueError(f"cannot draw a layer-matched control: the set to match has {need} heads in layer "
                             f"{layer} but only {len(eligible)} of that layer's heads lie outside the detected set")
        chosen += [eligible[i] for i in order[:need]]
    return HeadSet(sorted(chosen, key=lambda h: (h.layer, h.head)))
