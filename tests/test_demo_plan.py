"""``vrh demo`` plans its work: sample counts from a time budget, the printed estimate, per-step timing.

Pure arithmetic on made-up rates (no model): the cost model (``plan_steps``), the budget -> sizes choice with its
minimums and explicit overrides (``choose_sizes``), the printed plan, the step clock's re-estimates, and the
default model resolution (toy C/D where shipped, else A/B). The end-to-end run is in ``test_cli``.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from vrh_interp.apps import demo
from vrh_interp.apps.demo import (FULL_SIZES, MINIMUM_SIZES, PlanFacts, Rates, Sizes, StepClock, choose_sizes,
                             format_plan, half_width, plan_facts, plan_steps, planned_seconds, resolve_models, sizes_at)
from vrh_interp.core.heads import HeadGeometry

RATES = Rates(answer=0.03, scoring=0.06, vqa=0.02, control_answer=0.025, load=0.5)
TOY_A = HeadGeometry(num_layers=4, num_heads=8, num_kv_heads=8, head_dim=16)
TOY_C = HeadGeometry(num_layers=8, num_heads=16, num_kv_heads=4, head_dim=16)


@functools.lru_cache(maxsize=None)
def _facts(geometry: HeadGeometry) -> PlanFacts:  # drawing 20 + 20 control sets per k takes seconds on 128 heads
    return plan_facts(geometry, 20, 2, model="toy", positive_control=True, transfer=True)


def facts(geometry=TOY_A, **changes) -> PlanFacts:
    return dataclasses.replace(_facts(geometry), **changes)


def test_plan_facts_count_distinct_head_sets_on_a_128_head_model():
    f = facts(TOY_C)
    assert (f.total_heads, f.k_star) == (128, 3)
    assert demo.demo_ks(128) == ([0, 1, 2, 3, 6, 13], 3)
    # baseline, top-k at 5 ks, 20 + 20 sets at k* = 3, 2 + 2 at the 4 other ks; no 3-head set repeats
    assert f.main_sets == f.main_conditions == 1 + 5 + 40 + 4 * 4
    assert f.kind_sets == 2 + 2 * 20 and f.control_sets == 3 + 2 * 20
    # on 32 heads, 1-head control sets repeat: counted once, as run_conditions answers them
    small = facts(TOY_A)
    assert small.k_star == 1 and small.kind_sets < 2 + 2 * 20


def test_plan_steps_arithmetic():
    f = facts(TOY_C)
    sizes = Sizes(detect_scenes=100, eval_scenes=30, check_items=20, vqa_scenes=10, control_scenes=25)
    steps = {s.number: s for s in plan_steps(sizes, f, RATES)}
    assert sorted(steps) == list(range(1, 11))
    items = round(30 * demo.ITEMS_PER_SCENE)
    assert steps[1].answers == f.control_sets * 25
    assert steps[2].scored == 100 and steps[2].seconds == pytest.approx(100 * RATES.scoring)
    assert steps[3].answers == f.main_sets * items
    assert steps[3].seconds == pytest.approx(RATES.answer * steps[3].answers)
    assert steps[4].answers == 2 * f.kind_sets * 20
    # where a scene's referents share their image prefix, resample rows (half of step 4) cost UNSHARED_COST more
    shared = {s.number: s for s in plan_steps(sizes, dataclasses.replace(f, shared_prefix=True), RATES)}
    generation = RATES.answer * demo.ABLATION_COST * steps[4].answers
    assert shared[4].seconds - steps[4].seconds == pytest.approx(generation * (demo.UNSHARED_COST - 1) / 2)
    # 128 heads > SCAN_ALL_HEADS: the top k* and a random sample, 32 heads, plus the baseline
    assert steps[5].answers == 33 * 20 and "33 sets" in steps[5].work
    assert {s.number: s for s in plan_steps(sizes, facts(TOY_A), RATES)}[5].answers == 33 * 20  # 32: all heads
    assert steps[6].answers == f.design_sets * 20
    assert steps[8].answers == 2 * f.cross_sets * 20
    assert steps[9].answers == f.kind_sets * round(10 * demo.QUESTIONS_PER_SCENE)
    assert steps[9].seconds == pytest.approx(RATES.vqa * steps[9].answers)
    # check items never exceed the evaluation items; skipped steps cost nothing
    tiny = {s.number: s for s in plan_steps(dataclasses.replace(sizes, eval_scenes=2, check_items=50),
                                            facts(TOY_C, positive_control=False, transfer=False), RATES)}
    assert tiny[5].answers == 33 * round(2 * demo.ITEMS_PER_SCENE)
    assert tiny[1].seconds == tiny[8].seconds == 0 and tiny[1].work == "skipped"
    # summaries (bootstrap, set-level statistics) cost per condition summarised
    summarised = {s.number: s for s in plan_steps(sizes, f, dataclasses.replace(RATES, summary=0.1))}
    assert summarised[3].seconds - steps[3].seconds == pytest.approx(0.1 * f.main_conditions)
    assert summarised[4].seconds - steps[4].seconds == pytest.approx(0.1 * 3 * 42)  # zero, mean, resample
    assert summarised[5].seconds == steps[5].seconds  # the scan's table is no summary
    grouped = {s.number: s for s in plan_steps(sizes, f, dataclasses.replace(RATES, group=1.0))}
    assert f.main_groups == 2 * 5 and grouped[3].seconds - steps[3].seconds == pytest.approx(10.0)
    assert grouped[9].seconds - steps[9].seconds == pytest.approx(2 * demo.VQA_KINDS)  # random, matched per kind
    # slower rates scale every generation step
    slow = plan_steps(sizes, f, RATES.scaled(2.0))
    assert planned_seconds(slow) == pytest.approx(2 * planned_seconds(plan_steps(sizes, f, RATES))
                                                  - demo.STABILITY_SECONDS - demo.REPORT_SECONDS)


def test_choose_sizes_fits_the_budget_between_minimum_and_full():
    f = facts(TOY_A)
    smallest = planned_seconds(plan_steps(MINIMUM_SIZES, f, RATES))
    largest = planned_seconds(plan_steps(FULL_SIZES, f, RATES))
    assert choose_sizes(smallest / 2, f, RATES) == (MINIMUM_SIZES, False)  # never below the minimum
    assert choose_sizes(largest * 2, f, RATES) == (FULL_SIZES, True)  # never above the full sizes
    assert choose_sizes(None, f, RATES) == (FULL_SIZES, True)  # no budget
    assert choose_sizes(0, f, RATES) == (MINIMUM_SIZES, False)  # no time left: the smallest plan
    previous = MINIMUM_SIZES
    for budget in (smallest * 1.01, (smallest + largest) / 2, largest * 0.99):
        sizes, fits = choose_sizes(budget, f, RATES)
        assert fits and planned_seconds(plan_steps(sizes, f, RATES)) <= budget
        assert all(getattr(MINIMUM_SIZES, n) <= getattr(sizes, n) <= getattr(FULL_SIZES, n) for n in demo.BUDGETED)
        assert all(getattr(previous, n) <= getattr(sizes, n) for n in demo.BUDGETED)  # more budget, more samples
        assert (sizes.random_sets, sizes.curve_sets) == (20, 2)  # the verdict rule's 20 + 20 sets, always
        previous = sizes
    # the largest fitting plan: one more step of the interpolation would not fit
    sizes, _ = choose_sizes((smallest + largest) / 2, f, RATES)
    assert sizes != FULL_SIZES


def test_explicit_sizes_override_the_budget_and_the_rest_is_planned_around_them():
    f = facts(TOY_A)
    budget = planned_seconds(plan_steps(sizes_at(0.5), f, RATES))
    sizes, _ = choose_sizes(budget, f, RATES, {"eval_scenes": 152, "random_sets": 5})
    assert sizes.eval_scenes == 152 and sizes.random_sets == 5
    free, _ = choose_sizes(budget, f, RATES)
    assert sizes.check_items <= free.check_items  # the big explicit sweep leaves less for the rest
    tiny, _ = choose_sizes(budget, f, RATES, {"check_items": 3, "detect_scenes": 4})
    assert (tiny.check_items, tiny.detect_scenes) == (3, 4)  # explicit sizes may go below the minimum
    # re-planning the later steps only: the earlier sizes are kept, the later ones fill the time left
    later, fits = choose_sizes(1e9, f, RATES, {"eval_scenes": 40}, from_step=4)
    assert fits and later.eval_scenes == 40 and later.check_items == FULL_SIZES.check_items


def test_sizes_at_interpolates_and_rounds():
    assert sizes_at(0.0) == MINIMUM_SIZES and sizes_at(1.0) == FULL_SIZES
    half = sizes_at(0.5)
    assert half.eval_scenes == 84 and half.check_items == 31 and half.detect_scenes == 130  # 16+68, 12+19, 60+70
    assert sizes_at(0.5, {"vqa_scenes": 3}).vqa_scenes == 3


def test_format_plan_lists_every_step_the_total_and_the_interval_widths():
    f = facts(TOY_A)
    sizes = sizes_at(0.3)
    steps = plan_steps(sizes, f, RATES)
    text = format_plan(steps, sizes, f, RATES, budget=180, calibration_seconds=4.0)
    lines = text.splitlines()
    assert lines[0] == "plan for toy (32 heads, k* = 1) from the calibration:"
    assert lines[1].startswith("  30 ms per masked answer, 60 ms per detection sample, 20 ms per VQA answer")
    for number, name in demo.STEP_NAMES.items():
        assert any(line.strip().startswith(f"{number} {name}") for line in lines), name
    total = next(line for line in lines if line.strip().startswith("total"))
    assert f"{4 + planned_seconds(steps):.0f}s  (budget 180 s)" in total
    assert f"{sum(s.answers for s in steps):,}" in total
    items = round(sizes.eval_scenes * demo.ITEMS_PER_SCENE)
    assert f"+/-{half_width(items):.3f} at 0.5" in text and f"{sizes.check_items} check items" in text
    over = format_plan(steps, sizes, f, RATES, budget=10, calibration_seconds=4.0, fits=False)
    assert "even the smallest plan does not fit" in over
    assert "no budget: the full sizes" in format_plan(steps, sizes, f, RATES, budget=None, calibration_seconds=4.0)
    assert half_width(100) == pytest.approx(0.098, abs=1e-3) and half_width(100, 0.9) == pytest.approx(0.0588, abs=1e-3)


def test_step_clock_reestimates_from_the_measured_rate(monkeypatch, capsys):
    now = [100.0]
    monkeypatch.setattr(demo.time, "perf_counter", lambda: now[0])
    f = facts(TOY_A)
    steps = plan_steps(sizes_at(0.0), f, RATES)
    base = {s.number: s.seconds for s in steps}
    clock = StepClock(95.0, 180.0, 5.0, steps)
    assert clock.factor() == 1.0 and clock.left() == pytest.approx(sum(base.values()))
    clock.begin(1, "one")
    now[0] += 2 * base[1]  # twice as slow as planned
    clock.begin(2, "two")
    assert clock.factor() == pytest.approx(2.0)
    assert clock.rows[2]["estimated_s"] == pytest.approx(2 * base[2])
    assert clock.left() == pytest.approx(2 * sum(v for n, v in base.items() if n >= 2))
    printed = capsys.readouterr().out
    assert "[2/10] two" in printed and f"step 1 took {2 * base[1]:.1f} s" in printed and "budget 180 s" in printed
    now[0] += base[2]
    clock.end()
    smaller = plan_steps(sizes_at(0.0, {"check_items": 5}), f, RATES)
    clock.replan(smaller)
    assert clock.rows[5]["answers"] == 33 * 5 and clock.rows[5]["planned_s"] == base[5]  # the first plan stays
    table = clock.table()
    assert table["step"].tolist() == [str(n) for n in range(11)] + ["total"]
    assert list(table.columns) == ["step", "name", "work", "answers", "planned_s", "estimated_s", "seconds"]
    assert table["seconds"].iloc[1] == pytest.approx(round(2 * base[1], 1))
    assert table["seconds"].iloc[3:11].isna().all()
    assert table["planned_s"].iloc[-1] == pytest.approx(round(5.0 + sum(base.values()), 1), abs=0.2)


def test_default_models_are_c_and_d_where_shipped_else_a_and_b(monkeypatch):
    monkeypatch.setattr(demo, "shipped", lambda spec: spec in {"toy:a", "toy:b"})
    main, transfer, why = resolve_models(None)
    assert (main, transfer) == ("toy:a", "toy:b") and "toy:c is not shipped" in why
    monkeypatch.setattr(demo, "shipped", lambda spec: True)
    main, transfer, why = resolve_models(None)
    assert (main, transfer) == ("toy:c", "toy:d") and "128 heads" in why
    assert resolve_models("toy:a")[:2] == ("toy:a", "toy:b")  # A and B stay selectable by name
    assert resolve_models("toy:b", "toy:a")[:2] == ("toy:b", "toy:a")
    assert resolve_models("toy:a", "")[:2] == ("toy:a", None)
    assert resolve_models("tiny:llava")[:2] == ("tiny:llava", None)


def test_scan_heads_sample():
    from vrh_interp.core.heads import HeadGeometry, HeadSet

    small, wide = HeadGeometry(4, 8, 4, 16), HeadGeometry(8, 16, 4, 16)
    assert demo.scan_heads(small.all_heads(), small, 1) == small.all_heads()  # up to 48 heads: every head
    ranking = HeadSet(sorted(wide.all_heads(), key=lambda h: (-h.head, h.layer)))
    picked = demo.scan_heads(ranking, wide, 3)
    assert len(picked) == demo.SCAN_SAMPLED_HEADS and len(set(picked)) == len(picked)
    assert set(ranking[:3]) <= set(picked)  # the top k* are always scanned
    assert picked == demo.scan_heads(ranking, wide, 3)  # seeded
    assert len({h.layer for h in picked}) > 4  # a uniform draw spreads over the layers


def test_claims_text_fits_a_terminal():
    import pandas as pd

    table = pd.DataFrame([{"claim": "causal: masking top-k VRHs hurts " * 4, "verdict": "does not hold",
                           "numbers": "k=3: baseline 0.836, top-k 0.652 " * 10}, {"claim": "sparse", "verdict": "holds",
                                                                                   "numbers": "top 10%"}])
    text = demo.claims_text(table)
    assert max(len(line) for line in text.splitlines()) <= demo.TERMINAL_WIDTH
    assert "DOES NOT HOLD  causal" in text and "HOLDS  sparse" in text
    assert " ".join(text.split()).count("top-k 0.652") == 10  # every number kept, words unbroken
