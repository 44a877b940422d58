"""The backend seam (``vrh_interp.core.execution.backends.base``): the pipelines on TransformerLens equal them on
nnsight.

Tolerances (stated in docs/recipes/transformer-lens.md): the bridge runs eager attention without a KV cache and
the scoring readout in one forward over prompt + answer, where nnsight reads it inside the cached sdpa generation:
the same numbers up to floating-point order, so per-row statistics and head scores agree to ``STATS_ATOL`` (1e-5;
measured ~1e-6 on toy:a) and spatial entropies for >= 99 % of the heads (measured: all). Greedy answers, boxes and
every accuracy are compared EXACTLY. The per-row masked
generation of the TransformerLens backend is also checked against plain HF generation with forward pre-hooks
(``tests/reference.py``), so the two backends are not only compared with each other.
"""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import noise_image, tiny_vlm
from tests.reference import zeroed_heads
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.execution.backends.base import Backend, BackendError, NnsightBackend, backend_config
from vrh_interp.core.execution.backends.select import backend_for, backend_type
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.bookkeeping.runs import RunMismatchError
from vrh_interp.scoring.design import resolve_design
from vrh_interp.scoring.detect import collect_detection_stats, score_heads
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.core.execution.templates.ablation import ZERO_ABLATION, Ablation

pytest.importorskip("transformer_lens")

STATS_ATOL = 1e-5
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def toy() -> Any:
    from vrh_interp.specs import load_spec

    return load_spec("toy:a", None, None)


@pytest.fixture(scope="module")
def lensed(toy: Any) -> Any:
    """The toy model's handle placed on TransformerLens (one bridge for the module)."""
    return toy.on(backend="transformer-lens")


@pytest.fixture(scope="module")
def lens(lensed: Any) -> Any:
    return backend_for(lensed)


def test_both_backends_conform_and_names_are_checked(toy, lensed, lens):
    nnsight = backend_for(toy)
    assert isinstance(nnsight, NnsightBackend) and isinstance(nnsight, Backend) and isinstance(lens, Backend)
    assert backend_for(toy) is nnsight and backend_for(lensed) is lens  # built once per handle
    assert lens.vlm is lensed and lensed.hf_model is toy.hf_model and lensed.processor is toy.processor
    assert backend_config(nnsight) == {} and backend_config(lens) == {"backend": "transformer-lens"}
    assert toy.on() is toy and lensed.on(backend="transformer-lens") is lensed
    assert lensed.on(backend="nnsight").placement == toy.placement
    with pytest.raises(ValueError, match="unknown backend 'jax': use one of nnsight, transformer-lens"):
        toy.on(backend="jax")
    with pytest.raises(BackendError, match="unknown backend 'jax': use one of nnsight, transformer-lens"):
        backend_type("jax")
    with pytest.raises(BackendError, match="remote runs .* go through nnsight"):
        backend_for(lensed.on(remote=True))


def test_an_unbridged_family_is_refused_naming_the_supported_ones():
    internvl = tiny_vlm("internvl")
    with pytest.raises(BackendError, match="cannot run family 'internvl'.*supported: .*llava.*--backend nnsight"):
        backend_for(internvl.on(backend="transformer-lens"))


def test_per_row_masked_generation_equals_plain_hf_generation(toy, lens):
    """Each condition's block of one batched TransformerLens generation equals HF's own ``generate`` with that
    condition's heads zeroed by a forward pre-hook on o_proj (the independent reference)."""
    samples = synthetic_samples("eval", 3)
    batch = toy.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    heads = HeadSet([Head(1, 2), Head(2, 0), Head(3, 5)])
    conditions = [(None, ZERO_ABLATION), (heads, ZERO_ABLATION), (HeadSet(), ZERO_ABLATION)]
    got = lens.generate_conditions(batch.encoding, conditions, max_new_tokens=NEW_TOKENS)
    prompt = batch.prompt_length
    for (masked, _), ids in zip(conditions, got):
        by_layer = {layer: list(index) for layer, index in (masked or HeadSet()).by_layer().items()}
        with torch.no_grad(), zeroed_heads(toy.hf_model, by_layer):
            want = toy.hf_model.generate(**batch.encoding, max_new_tokens=NEW_TOKENS, do_sample=False)
        assert toy.decode_answers(ids, prompt) == toy.decode_answers(want, prompt)
    assert toy.decode_answers(got[0], prompt) != toy.decode_answers(got[1], prompt), "masking changed nothing"
    from vrh_interp.evaluation.grounding import ablation_values

    mean = Ablation("mean", ablation_values(toy, synthetic_samples("detect", 2)))
    with pytest.raises(BackendError, match="zero ablation only, not mean"):
        lens.generate_conditions(batch.encoding, [(heads, mean)], max_new_tokens=2)


def test_head_scores_equal_nnsight_within_tolerance(toy, lensed, tmp_path):
    samples = synthetic_samples("detect", 6)
    want = collect_detection_stats(toy, samples, batch_size=6, max_new_tokens=NEW_TOKENS, progress=False)
    got = collect_detection_stats(lensed, samples, batch_size=6, max_new_tokens=NEW_TOKENS, progress=False)
    for a, b in zip(want, got):
        assert (a.answer, a.iou, a.parsed, a.region_tokens) == (b.answer, b.iou, b.parsed, b.region_tokens)
        for field in ("output_rows", "input_rows"):
            x, y = getattr(a, field), getattr(b, field)
            assert x.shape == y.shape and np.abs(x - y).max() <= STATS_ATOL, field
        # entropies are discrete in the above-mean cells: equal here, but a cell within float noise of its map's
        # mean may flip on another BLAS, so 1 % of the heads may differ
        assert np.mean(a.neg_entropy == b.neg_entropy) >= 0.99
    nnsight_scores = score_heads(toy, samples, batch_size=6, max_new_tokens=NEW_TOKENS, progress=False)
    lens_scores = score_heads(lensed, samples, batch_size=6, max_new_tokens=NEW_TOKENS, progress=False,
                              run_dir=tmp_path / "detect")
    assert np.abs(nnsight_scores.scores - lens_scores.scores).max() <= STATS_ATOL
    assert np.abs(nnsight_scores.scores).max() > 100 * STATS_ATOL, "scores too small for the tolerance to mean much"
    assert lens_scores.provenance["backend"] == "transformer-lens" and "backend" not in nnsight_scores.provenance
    # a run folder never mixes backends: the nnsight run cannot resume the transformer-lens folder
    with pytest.raises(RunMismatchError, match="backend"):
        score_heads(toy, samples, batch_size=6, max_new_tokens=NEW_TOKENS, progress=False, run_dir=tmp_path / "detect")


def test_teacher_forced_scores_equal_nnsight(toy, lensed):
    design = dataclasses.replace(resolve_design("vrh"), output_source="teacher_forced")
    samples = synthetic_samples("detect", 4)
    want = score_heads(toy, samples, design, batch_size=4, progress=False)
    got = score_heads(lensed, samples, design, batch_size=4, progress=False)
    assert np.abs(want.scores - got.scores).max() <= STATS_ATOL and np.abs(want.scores).max() > 100 * STATS_ATOL


def test_sweep_answers_boxes_and_accuracies_equal_nnsight(toy, lensed, tmp_path):
    from vrh_interp.experiments.sweep import sweep

    ranking = HeadSet([Head(2, 0), Head(3, 5), Head(2, 6), Head(3, 3)])
    samples = synthetic_samples("eval", 4)
    kwargs = dict(ks=[0, 1, 4], random_seeds=[0], matched=False, batch_size=4, max_new_tokens=NEW_TOKENS,
                  progress=False)
    want = sweep(toy, samples, ranking, **kwargs)
    got = sweep(lensed, samples, ranking, run_dir=tmp_path / "sweep", **kwargs)
    columns = ["condition", "sample_id", "answer", "parsed", "box", "iou"]
    assert want.records[columns].astype(str).equals(got.records[columns].astype(str))
    accuracy = ["condition", "k", "accuracy"]
    assert want.summary()[accuracy].equals(got.summary()[accuracy])
    records = want.records
    assert (records[records["condition"] == "top:k=4"]["answer"].tolist()
            != records[records["condition"] == "baseline:k=0"]["answer"].tolist()), "masking changed no answer"
    manifest = json.loads((tmp_path / "sweep" / "manifest.json").read_text())
    assert manifest["backend"] == "transformer-lens"
    from vrh_interp.evaluation.grounding import ablation_values

    values = ablation_values(toy, synthetic_samples("detect", 2))
    with pytest.raises(BackendError, match="zero ablation only, not resample: use the nnsight backend"):
        sweep(lensed, samples, ranking, ablation="resample", ablation_values=values, **kwargs)


def test_vqa_answers_equal_nnsight(toy, lensed, tmp_path):
    """The VQA sweep runs on the handle's backend: the same answers under each condition, the folder records it."""
    from vrh_interp.data.datasets.synthetic_vqa import synthetic_vqa
    from vrh_interp.experiments.vqa_sweep import answer_conditions, vqa_sweep

    samples = list(synthetic_vqa("eval", 1))[:3]
    conditions = [(HeadSet(), ZERO_ABLATION), (HeadSet([Head(2, 0), Head(3, 5)]), ZERO_ABLATION)]
    want = answer_conditions(toy, samples, conditions, max_new_tokens=6)
    assert answer_conditions(lensed, samples, conditions, max_new_tokens=6) == want
    vqa_sweep(lensed, samples, HeadSet([Head(2, 0)]), random_seeds=[0], matched=False, batch_size=3,
              run_dir=tmp_path / "vqa", progress=False)
    assert json.loads((tmp_path / "vqa" / "manifest.json").read_text())["backend"] == "transformer-lens"


def test_attention_rows_and_head_patching_equal_across_backends():
    """The seam's other calls on a tiny fixture: per-row attention rows (real query rows) and patched logits (real
    tokens) agree to 1e-5 between the nnsight templates and the bridge."""
    vlm = tiny_vlm("llava")
    nnsight, lens = backend_for(vlm), backend_for(vlm.on(backend="transformer-lens"))
    batch = vlm.encode_grounding([noise_image(83, 61, seed=1), noise_image(64, 96, seed=2)],
                                 ["the red circle", "the cat left of the dog"])
    s = batch.prompt_length
    rows = torch.tensor([[s - 3, s - 1], [s - 2, s - 1]])
    a, b = nnsight.attention_rows(batch.encoding, rows), lens.attention_rows(batch.encoding, rows)
    assert sorted(a) == sorted(b) == list(range(vlm.geometry.num_layers))
    assert max((a[layer] - b[layer]).abs().max().item() for layer in a) <= 1e-5
    assert b[0].shape == (2, vlm.geometry.num_heads, 2, s)
    reduced = lens.attention_rows(batch.encoding, rows, layers=[1], reduce=lambda layer, probs: probs.sum(-1))
    assert list(reduced) == [1] and torch.allclose(reduced[1], torch.ones_like(reduced[1]))
    heads = HeadSet([Head(0, 1), Head(1, 0)])
    other = vlm.encode_grounding([noise_image(83, 61, seed=3), noise_image(64, 96, seed=4)],
                                 ["the red circle", "the cat left of the dog"])
    source = nnsight.capture_head_outputs(other.encoding)
    lens_source = lens.capture_head_outputs(other.encoding)
    real = batch.encoding["attention_mask"].bool()
    assert max((source[layer] - lens_source[layer]).abs()[real].max().item() for layer in source) <= 1e-5
    want = nnsight.patch_head_outputs(batch.encoding, heads, source, positions=[s - 1])
    got = lens.patch_head_outputs(batch.encoding, heads, source, positions=[s - 1])
    plain = iv.run_forward(vlm, batch.encoding).logits
    assert (want - got).abs()[real].max().item() <= 1e-5
    assert (want - plain).abs()[real].max().item() > 1e-4, "the patch had no effect"


def _demo(out: Any, *extra: str) -> dict[str, Any]:
    from vrh_interp.apps.cli import main

    assert main(["demo", "--model", "toy:planted", "--transfer-model", "", "--no-positive-control", "--detect", "4",
                 "--eval", "2", "--random-sets", "2", "--check-items", "3", "--vqa-scenes", "1",
                 "--rank-sets", "0", "--out", str(out), "--json", *extra]) == 0
    return json.loads((out / "demo.json").read_text())


@pytest.mark.e2e
def test_demo_on_transformer_lens_equals_the_nnsight_demo(tmp_path, capsys):
    """``vrh demo --backend transformer-lens`` end to end on the shipped toy:planted (64 heads) at explicit small
    sizes (about 10 s on nnsight, 70 s on the bridge, whose generation is uncached; the default demo pair is measured
    in docs/recipes/transformer-lens.md): it says what runs where, and its head scores (within ``STATS_ATOL``),
    top heads, masked accuracies, single-head scan and design-space tables equal the nnsight demo's."""
    import pandas as pd

    want = _demo(tmp_path / "nnsight")
    capsys.readouterr()
    got = _demo(tmp_path / "lens", "--backend", "transformer-lens")
    printed = " ".join(capsys.readouterr().out.split())
    assert "backend transformer-lens: 1 positive control" in printed and "on nnsight: 2 the head census" in printed
    assert got["backend"] == "transformer-lens" and want["backend"] == "nnsight" and got["backend_steps"]
    scores = [json.loads((tmp_path / run / "scores-vrh.json").read_text())["scores"] for run in ("nnsight", "lens")]
    assert np.abs(np.array(scores[0]) - np.array(scores[1])).max() <= STATS_ATOL
    assert np.abs(np.array(scores[0])).max() > 100 * STATS_ATOL
    assert want["top_heads"] == got["top_heads"]
    for table, columns in (("sweep_summary.csv", ["condition", "k", "seed", "accuracy"]),
                           ("head_scan.csv", ["head", "accuracy"]), ("design_space.csv", None)):
        a, b = (pd.read_csv(tmp_path / run / table) for run in ("nnsight", "lens"))
        assert a[columns or list(a.columns)].equals(b[columns or list(b.columns)]), table
    manifest = json.loads((tmp_path / "lens" / "sweep" / "manifest.json").read_text())
    assert manifest["backend"] == "transformer-lens"


def test_cli_refuses_an_unbridged_family_and_remote_on_transformer_lens(tmp_path, capsys):
    from vrh_interp.apps.cli import main

    base = ["detect", "--data", "synthetic:detect:2", "--out", str(tmp_path / "run"), "--backend", "transformer-lens"]
    assert main([*base, "--model", "tiny:internvl"]) == 2
    err = capsys.readouterr().err
    assert "cannot run family 'internvl'" in err and "Traceback" not in err
    assert main([*base, "--model", "tiny:llava", "--remote"]) == 2
    assert "remote runs (NDIF) go through nnsight" in capsys.readouterr().err


def test_scan_and_design_space_commands_run_on_either_backend_alike(tmp_path, capsys):
    """``--backend`` reaches ``vrh scan`` and ``vrh design-space``: on the tiny LLaVA fixture their tables equal the
    nnsight runs' (accuracies exactly; head scores within ``STATS_ATOL``) and the folders record the backend."""
    import pandas as pd

    from vrh_interp.apps.cli import main

    common = ["--model", "tiny:llava", "--batch-size", "4", "--max-new-tokens", "3", "--json"]
    assert main(["detect", *common, "--data", "synthetic:detect:3", "--out", str(tmp_path / "detect")]) == 0
    scores_file = json.loads(capsys.readouterr().out)["scores_file"]
    tables = {}
    for backend in ("nnsight", "transformer-lens"):
        out = tmp_path / backend
        assert main(["scan", *common, "--data", "synthetic:eval:2", "--scores", scores_file, "--heads", "L0H0,L1H1",
                     "--out", str(out / "scan"), "--backend", backend]) == 0
        assert main(["design-space", *common, "--data", "synthetic:detect:3", "--eval-data", "synthetic:eval:2",
                     "--k", "1", "--random-sets", "1", "--out", str(out / "design"), "--backend", backend]) == 0
        capsys.readouterr()
        tables[backend] = (pd.read_csv(out / "scan" / "head_scan.csv"),
                           pd.read_csv(out / "design" / "design_space.csv"))
        manifest = json.loads((out / "scan" / "scan" / "manifest.json").read_text())
        assert manifest.get("backend", "nnsight") == backend
    (scan_a, design_a), (scan_b, design_b) = tables["nnsight"], tables["transformer-lens"]
    assert scan_a[["head", "n", "accuracy", "drop"]].equals(scan_b[["head", "n", "accuracy", "drop"]])
    numeric = design_a.select_dtypes("number").columns
    assert design_a.drop(columns=numeric).equals(design_b.drop(columns=numeric))
    assert np.allclose(design_a[numeric].to_numpy(float), design_b[numeric].to_numpy(float), atol=STATS_ATOL,
                       equal_nan=True)


class _ModelLoaded(Exception):
    """Raised by the patched ``cli._load_model``: the command got as far as loading its model."""


def test_refusals_come_before_any_work_in_one_line(tmp_path, capsys, monkeypatch):
    """``--ablation mean`` and ``vrh patch`` on TransformerLens are refused before the model loads, from the backend's
    declaration (``ablation_kinds``, ``operations``), naming what is unsupported and the alternative; what it runs
    gets as far as loading the model (so the guard on ``_load_model`` fires where it should)."""
    from vrh_interp.apps import cli

    def loaded(*args: Any) -> None:
        raise _ModelLoaded

    monkeypatch.setattr(cli, "_load_model", loaded)
    monkeypatch.setenv("VRH_DEBUG", "1")  # an unexpected error (this one) propagates
    sweep = ["sweep", "--model", "toy:a", "--vrhs", "L0H0", "--data", "synthetic:eval:2", "--backend",
             "transformer-lens"]
    patch = ["patch", "--model", "toy:a", "--backend", "transformer-lens"]
    scores = tmp_path / "s.json"  # it exists: the path checks (which come first) pass, the backend is refused next
    scores.write_text("{}")
    for argv, words in ((sweep + ["--ablation", "mean"], "zero ablation only, not mean"),
                        (sweep + ["--ablation", "resample"], "zero ablation only, not resample"),
                        (["scan", "--model", "toy:a", "--scores", str(scores), "--ablation", "mean", "--backend",
                          "transformer-lens"], "zero ablation only, not mean"),
                        (patch, "does not run activation patching")):
        out = tmp_path / "-".join(argv[:1] + argv[-2:])
        assert cli.main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "--backend nnsight" in err and "Traceback" not in err, err
        assert len(err.splitlines()) == 1 and not out.exists(), err
    for argv in (sweep + ["--ablation", "zero"], ["patch", "--model", "toy:a"]):  # runnable: reaches the model
        with pytest.raises(_ModelLoaded):
            cli.main([*argv, "--out", str(tmp_path / "runnable")])


def test_the_patching_study_refuses_a_backend_that_cannot_run_it_before_any_work(toy, tmp_path):
    from vrh_interp.core.execution.backends.base import check_supported
    from vrh_interp.experiments.patching_study import detect_and_study

    placed = toy.on(backend="transformer-lens")  # not built: the refusal reads the class, no model copy
    with pytest.raises(BackendError, match="does not run activation patching .*--backend nnsight"):
        detect_and_study(placed, tmp_path / "study", detect_scenes=2)
    assert not (tmp_path / "study").exists() and placed._backend is None
    assert backend_type("nnsight") is NnsightBackend and backend_type(toy) is NnsightBackend
    check_supported(NnsightBackend, ablation_kinds=["zero", "mean", "resample"], operations=["patching"])
    with pytest.raises(BackendError, match="unknown backend"):
        backend_type("jax")
