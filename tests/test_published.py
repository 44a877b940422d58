"""The paper's published head sets (``vrh_interp.core.published``).

The lists are checked against the paper's own text: appendix D is parsed here from the reference copy
(``shared/reference/paper-retrieval-heads-meet-vision.txt``, next to the repository or inside it), never from
the module's hand entry. The analyses are checked against brute-force enumeration and plain set arithmetic,
and masking a published set is checked on a tiny Qwen2.5-VL with the real 28 x 28 head grid against the
plain-PyTorch reference (``tests.reference.zeroed_heads``) and through the ``vrh sweep`` command line.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import warnings
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from vrh_interp.core import published
from vrh_interp.core.heads import Head, HeadGeometry, HeadOutOfRangeError, HeadSet, HeadSpecError

ROOT = Path(__file__).resolve().parents[1]
PAPER_NAME = "paper-retrieval-heads-meet-vision.txt"
MODELS = ("Qwen2.5-VL-7B", "Qwen3-VL-8B", "InternVL3-8B", "InternVL3.5-8B")
BENCHMARKS = ("RefCOCO", "RefCOCO+", "RefCOCOg", "Toloka", "RefSpatialBench")


def _paper_text() -> str:
    for folder in (ROOT / "shared" / "reference", ROOT.parent / "shared" / "reference"):
        if (folder / PAPER_NAME).is_file():
            return (folder / PAPER_NAME).read_text(encoding="utf-8")
    pytest.skip(f"reference copy of the paper ({PAPER_NAME}) not found in shared/reference inside or next to the "
                "repository: the published lists cannot be checked against its text")


@pytest.fixture(scope="module")
def appendix() -> dict[tuple[str, str], dict]:
    """(benchmark, model) -> {"table": "Table A2", "pairs": [(l, h), ...]} parsed from appendix D's tables."""
    text = _paper_text()
    start, end = text.index("Appendix D Detected Lists"), text.index("Appendix E ")
    parsed: dict[tuple[str, str], dict] = {}
    table = benchmark = None
    for line in text[start:end].splitlines():
        caption = re.match(r"^Table (A\d+): Top-20 VRHs detected on (.+?)\s\[\d+\]", line)
        if caption:
            table, benchmark = f"Table {caption.group(1)}", caption.group(2)
            continue
        row = re.match(r"^([A-Za-z][\w.\-]*)\t(\(\s*\d.*)$", line)  # not the "Model<TAB>Top-20 ..." header
        if row and table is not None:
            pairs = [(int(a), int(b)) for a, b in re.findall(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)", row.group(2))]
            assert (benchmark, row.group(1)) not in parsed
            parsed[(benchmark, row.group(1))] = {"table": table, "pairs": pairs}
    return parsed


def test_appendix_parses_to_twenty_lists_of_twenty(appendix):
    assert sorted(appendix) == sorted(itertools.product(BENCHMARKS, MODELS))
    assert all(len(entry["pairs"]) == 20 for entry in appendix.values())
    assert [appendix[(b, MODELS[0])]["table"] for b in BENCHMARKS] == [f"Table A{i}" for i in range(2, 7)]


@pytest.mark.parametrize("benchmark", BENCHMARKS)
@pytest.mark.parametrize("model", MODELS)
def test_published_list_round_trips_the_appendix_exactly(appendix, model, benchmark):
    entry = appendix[(benchmark, model)]
    got = published.heads(model, benchmark)
    assert [(h.layer, h.head) for h in got] == entry["pairs"]  # same heads, same (score) order
    assert got == HeadSet(Head(l, h) for l, h in entry["pairs"])
    assert got.source.table == entry["table"] and got.source.model.name == model
    assert got.source.benchmark == benchmark and "Park" in got.source.citation


def test_geometry_matches_table_a7():
    text = _paper_text()
    block = text[text.index("Table A7:"):text.index("E.2 Benchmarks")]
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(r"^(\S+)\t(\d+)\t(\d+)\t(\d+)\t(\S+)", block, re.MULTILINE)}
    assert sorted(rows) == sorted(MODELS)
    for model in published.MODELS:
        layers, heads, total, backbone = rows[model.name]
        assert (model.num_layers, model.num_heads, model.total_heads) == (int(layers), int(heads), int(total))
        assert model.backbone == backbone


def test_every_published_set_fits_its_own_model_and_is_refused_by_the_other_backbone():
    for head_set in published.all_sets():
        own = head_set.source.model
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            published.check_geometry(head_set, HeadGeometry(own.num_layers, own.num_heads, 4, 128))
    qwen3 = published.heads("qwen3-vl-8b", "refcoco")  # heads up to 31: not in a 28-head layer
    with pytest.raises(published.PublishedGeometryError) as error:
        published.check_geometry(qwen3, HeadGeometry(28, 28, 4, 128))
    message = str(error.value)
    assert "36 layers x 32 heads" in message and "28 layers x 28 heads" in message and "L23H30" in message
    assert isinstance(error.value, HeadOutOfRangeError) and isinstance(error.value, ValueError)
    qwen25 = published.heads("qwen2.5-vl-7b", "refcoco")  # in range on a 36 x 32 grid, but not the same grid
    with pytest.warns(published.PublishedGeometryWarning, match="28 layers x 28 heads"):
        published.check_geometry(qwen25, HeadGeometry(36, 32, 8, 128))


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-VL-7B-Instruct", "qwen2.5-vl-7b", "QWEN2.5-VL-7B", "qwen2.5_vl_7b",
                                  "Qwen2.5-VL-7B-Instruct", " qwen2.5vl-7b "])
def test_model_names_are_forgiving(name):
    assert published.heads(name, "refcoco") == published.heads("Qwen2.5-VL-7B", "RefCOCO")


def test_hub_ids_and_benchmark_names_resolve():
    assert published.resolve_model("OpenGVLab/InternVL3_5-8B").name == "InternVL3.5-8B"
    assert published.resolve_model("OpenGVLab/InternVL3_5-8B-HF").name == "InternVL3.5-8B"
    assert published.resolve_model("OpenGVLab/InternVL3-8B-hf").name == "InternVL3-8B"
    assert published.resolve_model("Qwen/Qwen3-VL-8B-Instruct").name == "Qwen3-VL-8B"
    for alias, name in [("refcoco+", "RefCOCO+"), ("RefCOCO_plus", "RefCOCO+"), ("refcocog", "RefCOCOg"),
                        ("REFCOCO", "RefCOCO"), ("toloka-vqa", "Toloka"), ("refspatial", "RefSpatialBench"),
                        ("RefSpatialBench", "RefSpatialBench")]:
        assert published.resolve_benchmark(alias) == name


@pytest.mark.parametrize("model, benchmark", [("OpenGVLab/InternVL3-8B-Instruct", "refcoco"),  # another checkpoint
                                              ("llava-next-8b", "refcoco"), ("qwen2.5-vl-7b", "refcocoh")])
def test_unknown_names_are_a_clear_error_listing_what_exists(model, benchmark):
    with pytest.raises(published.UnknownPublishedSetError) as error:
        published.heads(model, benchmark)
    message = str(error.value)
    assert repr(model if benchmark != "refcocoh" else benchmark) in message
    assert all(m.lower() in message for m in MODELS) and all(b.lower() in message for b in BENCHMARKS)
    assert isinstance(error.value, KeyError) and isinstance(error.value, ValueError)


def test_spec_form_everywhere_a_head_set_is_parsed():
    want = published.heads("InternVL3.5-8B", "RefSpatialBench")
    for spec in ("published:internvl3.5-8b/refspatialbench", "published:OpenGVLab/InternVL3_5-8B/refspatial",
                 "  Published:InternVL3.5-8B/RefSpatialBench "):
        got = published.parse_heads(spec)
        assert isinstance(got, published.PublishedHeadSet) and got == want
        with pytest.raises(HeadSpecError, match="parse_heads"):  # heads sit below published in the layers
            HeadSet.parse(spec)
        assert got.source.spec == "published:internvl3.5-8b/refspatialbench"
    assert published.parse_heads("L1H2,L3H0") == HeadSet.parse("L1H2,L3H0") == HeadSet([Head(1, 2), Head(3, 0)])
    with pytest.raises(published.UnknownPublishedSetError, match="expected 'published:MODEL/BENCHMARK'"):
        published.parse_heads("published:qwen2.5-vl-7b")


def test_catalog_has_one_row_per_list_or_per_head(appendix):
    frame = published.catalog()
    assert len(frame) == 20 and set(frame["n_heads"]) == {20}
    row = frame[(frame["model"] == "Qwen2.5-VL-7B") & (frame["benchmark"] == "RefCOCO")].iloc[0]
    assert row["heads"].startswith("L19H17,L16H0,L18H16") and row["total_heads"] == 784
    assert row["spec"] == "published:qwen2.5-vl-7b/refcoco" and row["table"] == "Table A2"
    per_head = published.catalog(per_head=True)
    assert len(per_head) == 400
    first = per_head[(per_head["model"] == "InternVL3.5-8B") & (per_head["benchmark"] == "Toloka")]
    assert list(zip(first["layer"], first["head"])) == appendix[("Toloka", "InternVL3.5-8B")]["pairs"]
    assert list(first["rank"]) == list(range(1, 21))
    np.testing.assert_allclose(first["depth"], first["layer"] / 35)


# ------------------------------------------------------------------------------------------- the analyses

def _enumerated_overlap(total: int, a: set[int], b_size: int) -> list[Fraction]:
    """Overlap distribution of ``a`` with every ``b_size``-subset of range(total), by enumeration."""
    counts = Counter(len(a & set(b)) for b in itertools.combinations(range(total), b_size))
    n = sum(counts.values())
    return [Fraction(counts.get(x, 0), n) for x in range(min(len(a), b_size) + 1)]


@pytest.mark.parametrize("total, a, b", [(9, 3, 4), (10, 5, 5), (7, 1, 6), (8, 0, 3)])
def test_hypergeometric_equals_enumeration(total, a, b):
    want = _enumerated_overlap(total, set(range(a)), b)
    assert published.hypergeometric_pmf(total, a, b) == want
    observed = min(a, b) // 2 + (1 if min(a, b) else 0)
    assert published.overlap_tail(observed, total, a, b) == pytest.approx(float(sum(want[observed:])))


def test_layer_matched_null_equals_enumeration():
    """3 layers x 4 heads; A and B keep their heads-per-layer counts, heads within a layer are uniform."""
    num_heads = 4
    a = HeadSet([Head(0, 0), Head(0, 1), Head(1, 2), Head(2, 3)])
    per_layer_b = {0: 1, 1: 2, 2: 2}
    counts: Counter[int] = Counter()
    choices = [itertools.combinations(range(num_heads), per_layer_b[layer]) for layer in sorted(per_layer_b)]
    for picks in itertools.product(*[list(c) for c in choices]):
        b = {Head(layer, h) for layer, heads in zip(sorted(per_layer_b), picks) for h in heads}
        counts[len(b & set(a))] += 1
    n = sum(counts.values())
    want = [Fraction(counts.get(x, 0), n) for x in range(max(counts) + 1)]
    got = published.layer_matched_pmf(num_heads, {0: 2, 1: 1, 2: 1}, per_layer_b)
    assert got[: len(want)] == want and all(p == 0 for p in got[len(want):])
    b_example = HeadSet([Head(0, 1), Head(1, 2), Head(1, 3), Head(2, 0), Head(2, 3)])
    row = published.overlap_row(a, b_example, 3, num_heads)
    assert row["shared"] == 3 and row["jaccard"] == pytest.approx(3 / 6)
    assert row["chance_layer_matched"] == pytest.approx(float(sum(x * p for x, p in enumerate(want))))
    assert row["p_layer_matched"] == pytest.approx(float(sum(want[3:])))
    assert row["chance_uniform"] == pytest.approx(4 * 5 / 12)


def test_layer_matched_null_by_simulation_on_a_published_pair():
    """The exact layer-matched mean and tail against seeded shuffles of the head indices within each layer."""
    a, b = published.heads("Qwen2.5-VL-7B", "RefCOCO"), published.heads("InternVL3-8B", "RefCOCO")
    row = published.overlap_row(a, b, 28, 28)
    rng = np.random.default_rng(0)
    members = set(a)
    draws = []
    for _ in range(4000):
        shuffled = {Head(layer, int(h)) for layer, heads in b.by_layer().items()
                    for h in rng.choice(28, size=len(heads), replace=False)}
        draws.append(len(shuffled & members))
    assert np.mean(draws) == pytest.approx(row["chance_layer_matched"], abs=0.1)  # ~4 standard errors
    assert row["shared"] == 15 and max(draws) < 15 and row["p_layer_matched"] < 1e-6


def test_same_backbone_overlap_is_plain_set_arithmetic_on_the_appendix(appendix):
    frame = published.same_backbone_overlap()
    assert len(frame) == 10
    for row in frame.itertuples():
        first, second = row.pair.split(" / ")
        a, b = set(appendix[(row.benchmark, first)]["pairs"]), set(appendix[(row.benchmark, second)]["pairs"])
        assert row.shared == len(a & b) and row.jaccard == pytest.approx(len(a & b) / len(a | b))
        total = 784 if first == "Qwen2.5-VL-7B" else 1152
        assert row.total_heads == total and row.chance_uniform == pytest.approx(400 / total)
        tail = sum(math.comb(20, x) * math.comb(total - 20, 20 - x) for x in range(len(a & b), 21))
        assert row.p_uniform == pytest.approx(tail / math.comb(total, 20), rel=1e-9)


def test_benchmark_stability_and_depth_against_the_appendix(appendix):
    pairs = published.benchmark_stability()
    assert len(pairs) == 4 * 10
    for row in pairs.itertuples():
        a = set(appendix[(row.benchmark_a, row.model)]["pairs"])
        b = set(appendix[(row.benchmark_b, row.model)]["pairs"])
        assert row.shared == len(a & b) and row.jaccard == pytest.approx(len(a & b) / len(a | b))
    summary = published.stability_summary().set_index("model")
    hist = published.layer_histogram(pooled=True)
    for model in MODELS:
        lists = [set(appendix[(b, model)]["pairs"]) for b in BENCHMARKS]
        assert summary.loc[model, "core"] == len(set.intersection(*lists))
        assert summary.loc[model, "union"] == len(set.union(*lists))
        layers = Counter(layer for pairs in lists for layer, _ in pairs)
        part = hist[hist["model"] == model]
        assert dict(zip(part["layer"], part["count"])) == dict(layers)
        num_layers = 28 if model in ("Qwen2.5-VL-7B", "InternVL3-8B") else 36
        np.testing.assert_allclose(part["depth"], part["layer"] / (num_layers - 1))
    per_list = published.layer_histogram()
    assert per_list.groupby(["model", "benchmark"])["count"].sum().eq(20).all()
    np.testing.assert_allclose(per_list.groupby(["model", "benchmark"])["share"].sum(), 1.0)


def test_docs_page_embeds_the_current_tables():
    page = (ROOT / "docs" / "published-heads.md").read_text(encoding="utf-8")
    begin, end = "<!-- generated by python -m vrh_interp.core.published: begin -->\n", "<!-- generated: end -->"
    assert page[page.index(begin) + len(begin):page.index(end)] == published.markdown_tables(), \
        "docs/published-heads.md is stale: run `python docs/_generate_published.py`"


# ----------------------------------------------------------------- masking on a model with the real grid

def _tiny_qwen25_vl_with_7b_grid():
    """Tiny Qwen2.5-VL whose language model has Qwen2.5-7B's head grid: 28 layers x 28 heads (4 KV heads), with
    head_dim 8 (hidden 224) instead of 128, so the model stays a few MB."""
    from dataclasses import replace

    from vrh_interp.core.families.registry import TINY_TEXT_CONFIG, family_row, merger_vision_config, mrope_parameters
    from vrh_interp.core.tiny import build_recipe

    hidden = 28 * 8
    recipe = replace(
        family_row("qwen2_5_vl").tiny,
        text_config={**TINY_TEXT_CONFIG, "hidden_size": hidden, "intermediate_size": 64, "num_hidden_layers": 28,
                     "num_attention_heads": 28, "num_key_value_heads": 4,
                     "rope_parameters": mrope_parameters([2, 1, 1])},
        vision_config=merger_vision_config(14, window_size=56, fullatt_block_indexes=[1], out_hidden_size=hidden),
    )
    tiny = build_recipe(recipe, seed=0)
    return tiny.model, tiny.processor


@pytest.fixture(scope="module")
def grid_7b():
    """The tiny 28 x 28 model, wrapped."""
    from vrh_interp.core.model import wrap

    model, processor = _tiny_qwen25_vl_with_7b_grid()
    return wrap(model, processor, model_id="tiny-qwen2.5-vl-7b-grid")


def test_masking_a_published_set_equals_the_plain_pytorch_reference(grid_7b):
    from tests.conftest import noise_image
    from tests.reference import zeroed_heads
    from vrh_interp.core import interventions as iv

    vlm = grid_7b
    assert (vlm.geometry.num_layers, vlm.geometry.num_heads) == (28, 28)
    heads = published.heads("Qwen/Qwen2.5-VL-7B-Instruct", "refcoco")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same grid as the paper's checkpoint: no warning
        assert published.check_geometry(heads, vlm.geometry) is heads
    batch = vlm.encode_grounding([noise_image(70, 56)], ["the red circle"])
    with torch.no_grad():
        plain = vlm.hf_model(**batch.encoding).logits
        with zeroed_heads(vlm.hf_model, heads.by_layer()):
            want = vlm.hf_model(**batch.encoding).logits
    got = iv.run_forward(vlm, batch.encoding, [iv.head_ablation(vlm, heads)]).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (got - plain).abs().max() > 1e-4  # the published heads were really masked


def test_cli_sweep_with_a_published_set_records_its_source(grid_7b, tmp_path, capsys, monkeypatch):
    from vrh_interp.apps import cli

    # the model is built in memory (its grid exists in no shipped spec); everything after loading is the real CLI
    monkeypatch.setattr(cli, "_load_model", lambda spec, device, dtype: grid_7b if spec == "grid-7b" else None)
    out = tmp_path / "sweep"
    status = cli.main(["sweep", "--model", "grid-7b", "--vrhs", "published:qwen2.5-vl-7b/refcoco", "--data",
                   "synthetic:eval:3", "--ks", "0,20", "--seeds", "0", "--no-matched", "--no-live", "--batch-size", "3",
                   "--max-new-tokens", "2", "--out", str(out), "--json"])
    assert status == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    source = manifest["heads_source"]
    assert source["spec"] == "published:qwen2.5-vl-7b/refcoco" and source["table"] == "Table A2"
    assert source["checkpoint"] == "Qwen/Qwen2.5-VL-7B-Instruct" and source["geometry"] == {"layers": 28,
                                                                                            "heads": 28}
    assert manifest["conditions"]["top:k=20"] == published.heads("qwen2.5-vl-7b", "refcoco").to_list()
    assert manifest["model"]["geometry"]["layers"] == 28


def test_cli_sweep_refuses_a_7b_set_on_a_toy_model(tmp_path, capsys):
    from vrh_interp.apps.cli import main

    status = main(["sweep", "--model", "toy:c", "--vrhs", "published:qwen2.5-vl-7b/refcoco", "--data",
                   "synthetic:eval:2", "--out", str(tmp_path / "sweep")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and not (tmp_path / "sweep").exists()
    assert "28 layers x 28 heads" in err and "8 layers x 16 heads" in err and "published:qwen2.5-vl-7b/refcoco" in err
    try:  # refused while parsing the arguments (argparse exits with 2) or by the command (returns 2)
        status = main(["sweep", "--model", "toy:c", "--vrhs", "published:gpt-4v/refcoco"])
    except SystemExit as exit_:
        status = exit_.code
    assert status == 2 and "no published VRHs for model 'gpt-4v'" in capsys.readouterr().err
    status = main(["patch", "--model", "toy:c", "--vrhs", "published:internvl3-8b/toloka", "--out",
                   str(tmp_path / "patch")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and "28 layers x 28 heads" in err and "8 layers x 16 heads" in err


def test_cross_masking_with_published_sets_records_both_sources(grid_7b, tmp_path):
    """The paper's Fig. 7b from the published lists: each model masks its own list and its partner's."""
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.experiments.transfer import cross_masking

    own, partner = published.heads("qwen2.5-vl-7b", "refcoco"), published.heads("internvl3-8b", "refcoco")
    result = cross_masking(grid_7b, grid_7b, own, partner, synthetic_samples("eval", 2), ks=(0, 20),
                           random_seeds=(0,), labels=("qwen", "internvl"), batch_size=2, max_new_tokens=2,
                           run_dir=tmp_path, progress=False)
    assert set(result.results) == {"qwen", "internvl"}
    manifest = json.loads((tmp_path / "masked_in_qwen" / "manifest.json").read_text())
    assert manifest["heads_source"]["own"]["spec"] == "published:qwen2.5-vl-7b/refcoco"
    assert manifest["heads_source"]["transferred"]["spec"] == "published:internvl3-8b/refcoco"
    assert manifest["conditions"]["transferred:k=20"] == partner.to_list()
    qwen3 = published.heads("qwen3-vl-8b", "refcoco")
    with pytest.raises(published.PublishedGeometryError, match="36 layers x 32 heads"):
        cross_masking(grid_7b, grid_7b, qwen3, partner, synthetic_samples("eval", 2), ks=(0, 20), random_seeds=(0,))
