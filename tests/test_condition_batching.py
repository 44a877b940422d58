"""Condition batching: many masking conditions evaluated in ONE batched generation equal one condition at a time.

Each batch row carries its own head set and ablation kind (``templates.ablation.RowHeadAblation``); the batch is
replicated once per condition (``interventions.replicate_encoding``). Checked EXACTLY against the single-condition
path (``HeadAblation``, itself checked against plain-PyTorch hooks in test_ablation_kinds): greedy token ids,
parsed answers and boxes, sweep records and run folders, on tiny models of four families and on the trained toy A
(whose answers end at different steps, so rows of one pass stop early while others go on), with zero, mean and
resample ablation; a row given another row's mask or donor fails the comparison; a run interrupted mid-way
redoes at most one pass.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from tests.conftest import tiny_vlm
from vrh_interp.core.execution import interventions as iv
from vrh_interp.experiments import sweep as sweep_module
from vrh_interp.evaluation.grounding import ablation_values, encode_samples, ground_batch, ground_conditions
from vrh_interp.experiments.conditions import Condition
from vrh_interp.experiments.passes import conditions_per_pass
from vrh_interp.experiments.sweep import run_conditions
from vrh_interp.evaluation.controls import random_control
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.description.model import wrap
from vrh_interp.core.bookkeeping.runs import RecordLog
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.core.execution.templates.ablation import Ablation
from vrh_interp.core.description.tiny import TINY_FAMILIES

FAMILIES = ["llava", "idefics3", "gemma3", "qwen2_vl"]
TOKENS = 6


def _eval_samples(n: int = 3):
    """Evaluation samples of different prompt lengths (left padding exercised)."""
    samples = list(synthetic_samples("eval", n))
    samples[1] = dataclasses.replace(samples[1], expression=samples[1].expression + " on the far left side")
    return samples


def _conditions(vlm, values) -> list[tuple[HeadSet, Ablation]]:
    """The baseline, then random head sets of 1-3 heads (overlapping layers), each under zero, mean and resample
    ablation, and a whole layer zeroed."""
    g = vlm.geometry
    kinds = [Ablation(), Ablation("mean", values), Ablation("resample", values)]
    conditions = [(HeadSet(), Ablation())]
    for seed in range(3):
        heads = random_control(g, HeadSet(), 1 + seed, seed)
        conditions += [(heads, kind) for kind in kinds]
    conditions.append((HeadSet([Head(0, h) for h in range(g.num_heads)]), Ablation()))
    return conditions


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request):
    vlm = tiny_vlm(request.param)
    values = ablation_values(vlm, synthetic_samples("detect", 4), batch_size=3)
    return vlm, values


def _alone(vlm, batch, heads, ablation, ids):
    templates = [iv.head_ablation(vlm, heads, ablation, segments=iv.batch_segments(batch), sample_ids=ids)] \
        if len(heads) else []
    return iv.run_generate(vlm, batch.encoding, templates, max_new_tokens=TOKENS).ids


def test_batched_generation_equals_each_condition_alone(setup):
    """Greedy ids and parsed outcomes of every condition, from one batched generation, equal those of the
    condition generated alone (the ``ground_batch`` path), on 3 samples x 11 conditions."""
    vlm, values = setup
    samples = _eval_samples()
    ids = [s.sample_id for s in samples]
    conditions = _conditions(vlm, values)
    batch = encode_samples(vlm, samples)
    batched = iv.generate_conditions(vlm, batch.encoding, conditions, max_new_tokens=TOKENS,
                                     segments=iv.batch_segments(batch), sample_ids=ids)
    pad = vlm.tokenizer.pad_token_id
    for (heads, ablation), got in zip(conditions, batched):
        want = _alone(vlm, batch, heads, ablation, ids)
        assert got.shape[0] == len(samples) and got.shape[1] >= want.shape[1]
        assert torch.equal(got[:, :want.shape[1]], want), (str(heads), ablation.kind)
        assert bool((got[:, want.shape[1]:] == pad).all())  # a pass longer than alone only pads stopped rows
    outcomes = ground_conditions(vlm, samples, conditions, max_new_tokens=TOKENS)
    sequential = [ground_batch(vlm, samples, heads=h, ablation=a, max_new_tokens=TOKENS) for h, a in conditions]
    assert outcomes == sequential
    # the comparison has teeth: the conditions answer differently (a row masked like another row would show)
    distinct = {tuple(o.answer for o in block) for block in sequential}
    assert len(distinct) >= len(conditions) // 2, f"only {len(distinct)} distinct answer sets"


def test_a_row_with_another_rows_mask_or_donor_fails_the_comparison(monkeypatch):
    """Mutations of the planner's row layout (conditions shifted by one block; resample donors shifted by one
    sample) change the answers: the equality tests above would catch such a bug."""
    vlm = tiny_vlm("llava")
    values = ablation_values(vlm, synthetic_samples("detect", 4), batch_size=3)
    samples = _eval_samples()
    conditions = _conditions(vlm, values)
    sequential = [ground_batch(vlm, samples, heads=h, ablation=a, max_new_tokens=TOKENS) for h, a in conditions]
    real = iv.condition_ablation

    def shifted_blocks(vlm, conds, rows, **kwargs):
        return real(vlm, list(conds[1:]) + list(conds[:1]), rows, **kwargs)

    monkeypatch.setattr(iv, "condition_ablation", shifted_blocks)
    wrong = ground_conditions(vlm, samples, conditions, max_new_tokens=TOKENS)
    assert sum(w != s for w, s in zip(wrong, sequential)) >= len(conditions) // 2

    resample = [(h, a) for h, a in conditions if a.kind == "resample"]
    want = [ground_batch(vlm, samples, heads=h, ablation=a, max_new_tokens=TOKENS) for h, a in resample]

    def shifted_donors(vlm, conds, rows, *, segments=None, sample_ids=None):
        return real(vlm, conds, rows, segments=segments, sample_ids=list(sample_ids[1:]) + list(sample_ids[:1]))

    monkeypatch.setattr(iv, "condition_ablation", shifted_donors)
    wrong = ground_conditions(vlm, samples, [(HeadSet(), Ablation())] + resample, max_new_tokens=TOKENS)[1:]
    assert wrong != want


def test_remote_request_equals_local():
    """The per-row template pickles into a remote (NDIF-style) request and runs the same code there."""
    vlm = tiny_vlm("qwen2_vl")
    values = ablation_values(vlm, synthetic_samples("detect", 4), batch_size=3)
    samples = _eval_samples()
    conditions = _conditions(vlm, values)[:7]
    local = ground_conditions(vlm, samples, conditions, max_new_tokens=4)
    assert ground_conditions(vlm.on(remote="local"), samples, conditions, max_new_tokens=4) == local


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_replicated_encoding_equals_encoding_the_repeated_samples(family):
    """``replicate_encoding`` (tensors concatenated block after block) is what the processor gives for the samples
    repeated, for every family's layout of pixel values (batched, flattened patches, tiles, image sizes)."""
    vlm = tiny_vlm(family)
    samples = _eval_samples(2)
    encoding = encode_samples(vlm, samples).encoding
    repeated = encode_samples(vlm, samples * 3).encoding
    replicated = iv.replicate_encoding(encoding, 3)
    assert set(replicated) == set(repeated)
    for key, value in repeated.items():
        assert torch.equal(replicated[key], value), key


# --- the sweep planner (run_conditions) on the trained toy A --------------------------------------------------

@pytest.fixture(scope="module")
def toy():
    from vrh_interp.toy import load as load_toy

    model, processor = load_toy("a")
    return wrap(model, processor)


def _sweep_conditions(vlm, values_kinds=("zero", "mean", "resample")) -> list[Condition]:
    g = vlm.geometry
    conditions = [Condition("baseline", 0, None, HeadSet())]
    for kind in values_kinds:
        conditions.append(Condition("top", 2, None, HeadSet([Head(1, 3), Head(2, 5)]), kind))
        conditions += [Condition("random", 3, seed, random_control(g, HeadSet(), 3, seed), kind) for seed in range(3)]
    conditions.append(Condition("random", 3, 9, random_control(g, HeadSet(), 3, 0)))  # repeats seed 0's set
    # whole layers masked: answers of 1 to 16 tokens (rows of one pass stop at different steps)
    conditions += [Condition("layer", g.num_heads, layer, HeadSet([Head(layer, h) for h in range(g.num_heads)]))
                   for layer in (0, 2)]
    conditions.append(Condition("all", g.total_heads, None, g.all_heads()))
    return conditions


def test_sweep_records_equal_one_condition_at_a_time_on_toy_a(toy):
    """``run_conditions`` with conditions packed into passes (default budget, and a budget that splits each
    batch's conditions unevenly) gives exactly the records of one condition per generation and of a plain loop of
    ``ground_batch`` calls; answers end at different steps, so rows stop early inside a pass."""
    values = ablation_values(toy, synthetic_samples("detect", 6))
    samples = synthetic_samples("eval", 7)
    conditions = _sweep_conditions(toy)
    kwargs = dict(batch_size=3, max_new_tokens=16, progress=False, ablation_values=values)
    sequential = run_conditions(toy, samples, conditions, max_batch_rows=1, **kwargs)
    for rows in (None, 3 * 5):
        batched = run_conditions(toy, samples, conditions, max_batch_rows=rows, **kwargs)
        pd.testing.assert_frame_equal(batched.records, sequential.records)
    kinds = {"zero": Ablation(), "mean": Ablation("mean", values), "resample": Ablation("resample", values)}
    for cond in conditions:
        want = [o.answer for start in range(0, 7, 3)
                for o in ground_batch(toy, samples[start:start + 3], heads=cond.heads, ablation=kinds[cond.ablation],
                                      max_new_tokens=16)]
        assert sequential.records[sequential.records["condition"] == cond.key]["answer"].tolist() == want
    answers = sequential.records["answer"]
    lengths = {len(toy.tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers}
    assert min(lengths) <= 3 and max(lengths) == 16 and answers.nunique() > 5
    assert sequential.summary()["accuracy"].nunique() > 3


def test_default_budget_packs_many_conditions_per_pass(toy):
    batch = encode_samples(toy, synthetic_samples("eval", 8))
    per_pass = conditions_per_pass(8, batch.prompt_length + 24)
    assert per_pass >= 20  # a 20-condition sweep over a batch of 8 is one generation on toy A
    assert conditions_per_pass(8, batch.prompt_length + 24, max_batch_rows=8) == 1
    assert conditions_per_pass(8, 10 ** 6) == 1  # a batch over the budget still runs, one condition a pass


def test_interrupted_run_resumes_at_pass_granularity(tmp_path, monkeypatch):
    """Killed in its 6th pass, a run has written exactly the records of passes 1-5; resumed, it redoes only that
    pass and the rest, and its folder is byte for byte an uninterrupted run's (packed or not)."""
    vlm = tiny_vlm("llava")
    values = ablation_values(vlm, synthetic_samples("detect", 4), batch_size=3)
    samples = synthetic_samples("eval", 5)  # batches of 2: [0, 1] [2, 3] [4]
    g = vlm.geometry
    conditions = [Condition("baseline", 0, None, HeadSet())] + [
        Condition("random", 2, seed, random_control(g, HeadSet(), 2, seed), kind)
        for seed in range(3) for kind in ("zero", "mean")]  # 7 conditions
    kwargs = dict(batch_size=2, max_new_tokens=4, progress=False, ablation_values=values, max_batch_rows=4)
    # 2 conditions a pass for a batch of 2 (4 passes), 4 for the last batch of 1 (2 passes): 10 passes
    real = sweep_module.ground_conditions
    calls: list[int] = []

    def counted(vlm, chunk, masks, **kw):
        calls.append(len(masks))
        if len(calls) == fail_on:
            raise RuntimeError("killed")
        return real(vlm, chunk, masks, **kw)

    monkeypatch.setattr(sweep_module, "ground_conditions", counted)
    fail_on = 6
    with pytest.raises(RuntimeError, match="killed"):
        run_conditions(vlm, samples, conditions, run_dir=tmp_path / "killed", **kwargs)
    assert calls == [2, 2, 2, 1, 2, 2]
    written = RecordLog(tmp_path / "killed" / "sweep_records.jsonl").read()
    # the first batch under all 7 conditions, then the second batch under the first pass's 2 conditions
    assert len(written) == 7 * 2 + 2 * 2
    assert [(r["sample_id"], r["condition"]) for r in written[14:]] == [
        (s.sample_id, c.key) for c in conditions[:2] for s in samples[2:4]]
    calls.clear()
    fail_on = 0
    resumed = run_conditions(vlm, samples, conditions, run_dir=tmp_path / "killed", **kwargs)
    assert calls == [2, 2, 1, 4, 3]  # the failed pass, then the rest: nothing answered twice
    fresh = run_conditions(vlm, samples, conditions, run_dir=tmp_path / "fresh", **kwargs)
    one_at_a_time = run_conditions(vlm, samples, conditions, run_dir=tmp_path / "sequential",
                                   **{**kwargs, "max_batch_rows": 1})
    pd.testing.assert_frame_equal(resumed.records, fresh.records)
    pd.testing.assert_frame_equal(one_at_a_time.records, fresh.records)
    log = "sweep_records.jsonl"
    assert (tmp_path / "killed" / log).read_bytes() == (tmp_path / "fresh" / log).read_bytes() == \
        (tmp_path / "sequential" / log).read_bytes()
    assert len(RecordLog(tmp_path / "killed" / log).read()) == 7 * 5


def test_vqa_sweep_batched_equals_one_condition_at_a_time():
    """The VQA sweep goes through the same planner: packed and one-condition-at-a-time records are equal."""
    from vrh_interp.data.datasets.synthetic_vqa import synthetic_vqa
    from vrh_interp.experiments.vqa_sweep import vqa_sweep

    vlm = tiny_vlm("llava")
    values = ablation_values(vlm, synthetic_samples("detect", 4), batch_size=3)
    samples = list(synthetic_vqa("eval", 2))[:5]
    heads = HeadSet([Head(0, 1), Head(1, 2)])
    for kind in ("zero", "resample"):
        kwargs = dict(random_seeds=(0, 1, 2), batch_size=2, progress=False, ablation=kind,
                      ablation_values=values if kind != "zero" else None)
        batched = vqa_sweep(vlm, samples, heads, **kwargs)
        sequential = vqa_sweep(vlm, samples, heads, max_batch_rows=1, **kwargs)
        pd.testing.assert_frame_equal(batched.records, sequential.records)
        assert batched.records["response"].nunique() > 1
