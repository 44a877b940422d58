"""``vrh demo``'s pure parts: fixed sizes (no clock in any decision), the default model resolution (toy C/D where
shipped, else A/B), the scan's head sample, the claims text. The end-to-end run is in ``test_cli``."""

from __future__ import annotations

import dataclasses

import numpy as np

from vrh_interp.experiments import builtin_specs, demo, demo_plan
from vrh_interp.experiments.builtin_specs import DemoSpec
from vrh_interp.experiments.head_scan import SCAN_SAMPLED_HEADS, scan_heads


def resolve_models(model=None, transfer_model="auto"):
    return DemoSpec(model=model, transfer_model=transfer_model).models()


def test_sizes_are_fixed_and_the_module_has_no_clock_in_its_decisions():
    import inspect

    sizes = demo_plan.DEFAULT_SIZES
    assert sizes == demo_plan.Sizes() and dataclasses.asdict(sizes)["random_sets"] >= 20
    source = inspect.getsource(demo) + inspect.getsource(demo_plan)
    for gone in ("calibrate", "choose_sizes", "PLAN_MARGIN", "Rates"):
        assert gone not in source, gone


def test_default_models_are_c_and_d_where_shipped_else_a_and_b(monkeypatch):
    monkeypatch.setattr(builtin_specs, "shipped", lambda spec: spec in {"toy:a", "toy:b"})
    main, transfer, why = resolve_models(None)
    assert (main, transfer) == ("toy:a", "toy:b") and "toy:c is not shipped" in why
    monkeypatch.setattr(builtin_specs, "shipped", lambda spec: True)
    main, transfer, why = resolve_models(None)
    assert (main, transfer) == ("toy:c", "toy:d") and "128 heads" in why
    assert resolve_models("toy:a")[:2] == ("toy:a", "toy:b")  # A and B stay selectable by name
    assert resolve_models("toy:b", "toy:a")[:2] == ("toy:b", "toy:a")
    assert resolve_models("toy:a", "")[:2] == ("toy:a", None)
    assert resolve_models("tiny:llava")[:2] == ("tiny:llava", None)


def test_scan_heads_sample():
    from vrh_interp.core.description.heads import HeadGeometry, HeadSet

    small, wide = HeadGeometry(4, 8, 4, 16), HeadGeometry(8, 16, 4, 16)
    assert scan_heads(small.all_heads(), small, 1) == small.all_heads()  # up to 48 heads: every head
    ranking = HeadSet(sorted(wide.all_heads(), key=lambda h: (-h.head, h.layer)))
    picked = scan_heads(ranking, wide, 3)
    assert len(picked) == SCAN_SAMPLED_HEADS and len(set(picked)) == len(picked)
    assert set(ranking[:3]) <= set(picked)  # the top k* are always scanned
    ranks = sorted(list(ranking).index(h) for h in picked)
    assert ranks[:3] == [0, 1, 2] and ranks[-1] == len(ranking) - 1  # the score range end to end
    gaps = np.diff(ranks[3:])
    assert gaps.max() - gaps.min() <= 1  # evenly spaced ranks: no seed, so the scan does not move with --seed


def test_claims_text_fits_a_terminal():
    import pandas as pd

    long_numbers = "k=3: baseline 0.836, top-k 0.652 " * 10
    table = pd.DataFrame([{"table": "paper", "claim": "causal: masking top-k VRHs hurts " * 4,
                           "verdict": "does not hold", "reason": "", "numbers": long_numbers},
                          {"table": "method", "claim": "sparse", "verdict": "holds", "reason": "",
                           "numbers": "top 10%"}])
    from vrh_interp.evaluation.claims import claims_text

    text = claims_text(table)
    assert max(len(line) for line in text.splitlines()) <= demo_plan.TERMINAL_WIDTH
    assert "DOES NOT HOLD  causal" in text and "HOLDS  sparse" in text
    assert " ".join(text.split()).count("top-k 0.652") == 10  # every number kept, words unbroken
