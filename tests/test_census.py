"""The head census (``evaluation.census``) against a plain-PyTorch reference, and the live-head control.

The single-head effect is re-computed with Hugging Face ``generate`` and forward pre-hooks that zero one head's
slice of o_proj's input (``tests/reference.zeroed_heads``), the KL written out by hand; a head whose output
projection is zeroed must be found inert by both rules and never drawn by the live-head control.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_vlm
from tests.reference import zeroed_heads
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.evaluation.census import CENSUS_CSV, Census, census, output_norms, run_census, single_head_effects
from vrh_interp.evaluation.controls import live_control

TOKENS = 4


def _reference_effects(vlm, samples) -> np.ndarray:
    model = vlm.hf_model
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    with torch.no_grad():
        ids = model.generate(**batch.encoding, max_new_tokens=TOKENS, do_sample=False)
    start = batch.prompt_length
    stop = {vlm.tokenizer.eos_token_id, vlm.tokenizer.pad_token_id}
    answers = []
    for row in ids[:, start:].tolist():
        n = next((i for i, t in enumerate(row) if t in stop), len(row))
        answers.append(row[:max(1, n)])
    encoding = vlm.teacher_forced(batch, answers)
    with torch.no_grad():
        base = torch.log_softmax(model(**encoding).logits.float(), -1)
    geometry = vlm.geometry
    out = np.zeros((geometry.num_layers, geometry.num_heads))
    for layer in range(geometry.num_layers):
        for head in range(geometry.num_heads):
            with torch.no_grad(), zeroed_heads(model, {layer: [head]}):
                masked = torch.log_softmax(model(**encoding).logits.float(), -1)
            total, count = 0.0, 0
            for row, answer in enumerate(answers):
                for j in range(len(answer)):
                    p, q = base[row, start - 1 + j], masked[row, start - 1 + j]
                    total += float((p.exp() * (p - q)).sum())
                    count += 1
            out[layer, head] = total / count
    return out


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_single_head_effects_equal_a_plain_pytorch_reference(family):
    vlm = tiny_vlm(family)
    samples = synthetic_samples("detect", 2)
    measured = single_head_effects(vlm, samples, max_new_tokens=TOKENS, heads_per_pass=3)
    expected = _reference_effects(vlm, samples)
    assert measured.shape == expected.shape
    np.testing.assert_allclose(measured, expected, rtol=1e-3, atol=1e-6)
    assert (expected > 0).any()


def test_a_dead_head_is_inert_by_both_rules_and_never_drawn_by_the_live_control():
    vlm = tiny_vlm("llava")
    d = vlm.geometry.head_dim
    projection = vlm.adapter.output_projection(vlm.hf_model, 1)
    saved = projection.weight.detach().clone()
    try:
        with torch.no_grad():
            projection.weight[:, 2 * d:3 * d] = 0.0
        norms = output_norms(vlm)
        assert norms[1, 2] == 0.0 and norms[1, 0] == pytest.approx(float(saved[:, :d].norm()), rel=1e-5)
        pool = census(vlm, synthetic_samples("detect", 2), max_new_tokens=TOKENS)
        row = pool.table.set_index("head").loc["L1H2"]
        assert row["inert_norm"] and row["inert_effect"] and not row["live"]
        assert Head(1, 2) in pool.inert and Head(1, 2) not in pool.live
        summary = pool.summary()
        assert summary["inert_by_norm"] >= 1 and "L1H2" in summary["inert"]
        for seed in range(30):
            drawn = live_control(pool.live, HeadSet([Head(0, 0)]), 2, seed)
            assert Head(1, 2) not in drawn and Head(0, 0) not in drawn and len(drawn) == 2
    finally:
        with torch.no_grad():
            projection.weight.copy_(saved)


def test_live_control_refuses_a_pool_too_small():
    with pytest.raises(ValueError, match="only 1 live heads"):
        live_control(HeadSet([Head(0, 0), Head(0, 1)]), HeadSet([Head(0, 0)]), 2, 0)


def test_a_run_keeps_its_census_and_a_rerun_reads_it_back(tmp_path):
    """``run_census`` measures once and saves; a rerun reads the file (here edited to mark L0H0 inert: the read-back
    pool must say so, which a re-measurement would not); a census of another head count is refused."""
    vlm = tiny_vlm("llava")
    samples = synthetic_samples("detect", 2)
    first = run_census(vlm, samples, tmp_path, items=2, max_new_tokens=TOKENS)
    expected = census(vlm, samples, max_new_tokens=TOKENS)
    np.testing.assert_allclose(first.table["effect"], expected.table["effect"], rtol=1e-6)
    assert first.items == 2 and Head(0, 0) in first.live
    saved = (tmp_path / CENSUS_CSV).read_text()
    lines = saved.splitlines()
    row = lines[1].split(",")
    row[-2] = "False"  # live
    (tmp_path / CENSUS_CSV).write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    again = run_census(vlm, samples, tmp_path, items=2, max_new_tokens=TOKENS)
    assert Head(0, 0) not in again.live and again.items == 2
    assert again.control_pool(HeadSet([Head(0, 1)]), 1) == again.live
    assert again.control_pool(HeadSet(), len(again.live) + 1) is None
    (tmp_path / CENSUS_CSV).write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(ValueError, match="census of 2 heads, but the model has"):
        run_census(vlm, samples, tmp_path)
    (tmp_path / CENSUS_CSV).write_text("not,a\ncensus,1\n")
    with pytest.raises(ValueError, match="not a head census"):
        Census.load(tmp_path / CENSUS_CSV, vlm.geometry.total_heads)
    # edited files are inputs: a head the model lacks, an empty flag, a head twice are refused, the file named
    header, first = lines[0], lines[1].split(",")
    for edit, message in ((lambda r: ["L9H9", *r[1:]], "does not have"), (lambda r: [*r[:-2], "", r[-1]], "live"),
                          (lambda r: r, "twice")):
        rows = [",".join(edit(list(first))), *lines[2:]] if message != "twice" else [lines[1], *lines[1:]][:-1]
        (tmp_path / CENSUS_CSV).write_text("\n".join([header, *rows]) + "\n")
        with pytest.raises(ValueError, match=message) as error:
            run_census(vlm, samples, tmp_path)
        assert CENSUS_CSV in str(error.value)


def test_vrh_sweep_draws_its_live_control_from_the_census(tmp_path, capsys):
    """``vrh sweep``: the census on the first evaluation samples (census.csv in --out), live-head sets drawn only
    from its live heads outside the top k, judged with the other controls; ``--no-live`` leaves them out."""
    import json

    import pandas as pd

    from vrh_interp.apps.cli import main

    out = tmp_path / "sweep"
    args = ["sweep", "--model", "tiny:llava", "--vrhs", "L0H1,L1H0", "--data", "synthetic:eval:3", "--ks", "0,2",
            "--random-sets", "3", "--max-new-tokens", "3"]
    assert main([*args, "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert "head census:" in captured.err
    pool = Census.load(out / CENSUS_CSV, tiny_vlm("llava").geometry.total_heads)
    summary = pd.DataFrame(json.loads(captured.out))
    assert {"live", "random", "matched"} <= set(summary["condition"]) and "p_vs_live" in summary
    conditions = json.loads((out / "manifest.json").read_text())["conditions"]
    live_sets = [heads for key, heads in conditions.items() if key.startswith("live:")]
    assert len(live_sets) == 3
    for heads in live_sets:
        drawn = {Head.parse(h) for h in heads}
        assert len(drawn) == 2 and drawn <= set(pool.live) and not drawn & {Head(0, 1), Head(1, 0)}
    bare = tmp_path / "bare"
    assert main([*args, "--out", str(bare), "--json", "--no-live"]) == 0
    assert "live" not in set(pd.DataFrame(json.loads(capsys.readouterr().out))["condition"])
    assert not (bare / CENSUS_CSV).exists()
