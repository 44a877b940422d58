"""The paper's published head sets (``vrh_interp.core.description.published``).

The lists are checked against the paper's own text: appendix D is parsed here from the reference copy
(``shared/reference/paper-retrieval-heads-meet-vision.txt``, next to the repository or inside it), never from
the module's hand entry. The analyses are checked against brute-force enumeration and plain set arithmetic,
and masking a published set is checked on a tiny Qwen2.5-VL with the real 28 x 28 head grid against the
plain-PyTorch reference (``tests.reference.zeroed_heads``) and through the ``vrh sweep`` command line.
"""

from __future__ import annotations

import importlib.util
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

from vrh_interp.core.description import published
from vrh_interp.core.description.heads import Head, HeadGeometry, HeadOutOfRangeError, HeadSet, HeadSpecError

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
    begin = "<!-- generated by python -m vrh_interp.core.description.published: begin -->\n"
    end = "<!-- generated: end -->"
    assert page[page.index(begin) + len(begin):page.index(end)] == published.markdown_tables(), \
        "docs/published-heads.md is stale: run `python docs/_generate_published.py`"


# ----------------------------------------------------------------- masking on a model with the real grid

def _tiny_qwen25_vl_with_7b_grid():
    """Tiny Qwen2.5-VL whose language model has Qwen2.5-7B's head grid: 28 layers x 28 heads (4 KV heads), with
    head_dim 8 (hidden 224) instead of 128, so the model stays a few MB."""
    from dataclasses import replace

    from vrh_interp.core.description.families.registry import (TINY_TEXT_CONFIG, family_row, merger_vision_config,
                                                               mrope_parameters)
    from vrh_interp.core.description.tiny import build_recipe

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
    from vrh_interp.core.description.model import wrap

    model, processor = _tiny_qwen25_vl_with_7b_grid()
    return wrap(model, processor, model_id="tiny-qwen2.5-vl-7b-grid")


def test_masking_a_published_set_equals_the_plain_pytorch_reference(grid_7b):
    from tests.conftest import noise_image
    from tests.reference import zeroed_heads
    from vrh_interp.core.execution import interventions as iv

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


# ----------------------------------------------------------------- text ancestors: QRHead's text-LLM lists

# The two lists that meet the paper's VLMs, as QRHead's configs publish them (``attn_head_set``), copied here by
# hand so the data file is checked against a second transcription: src/qrretriever/configs/<model>_qr_head_NQ.yaml
# of github.com/princeton-pli/QRHead (Qwen2.5-7B-Instruct at 7a668e7, Qwen3-8B at e2bf69f).
QRHEAD_UPSTREAM = {
    "Qwen2.5-7B-Instruct": ("16-19,16-2,16-20,16-14,16-0,15-24,16-18,17-18,16-1,19-18,19-19,18-16,16-17,19-25,"
                            "19-17,20-21"),
    "Qwen3-8B": "21-31,21-18,20-15,22-4,21-11,20-16,21-17,19-13,21-10,21-8,18-5,20-14,19-14,24-13,17-4,19-28",
}


def _upstream_pairs(text: str) -> list[tuple[int, int]]:
    return [(int(pair.split("-")[0]), int(pair.split("-")[1])) for pair in text.split(",")]


def test_qrhead_lists_load_in_rank_order_with_their_source_and_licence():
    sets = published.qrhead_sets()
    assert len(sets) == len(published.QRHEAD_DATA["lists"]) == 10
    for model, text in QRHEAD_UPSTREAM.items():
        got = published.qrhead_heads(model)
        assert [(h.layer, h.head) for h in got] == _upstream_pairs(text)  # same heads, QRHead's order
    for head_set in sets:
        src = head_set.source
        assert isinstance(head_set, published.PublishedHeadSet) and isinstance(src, published.TextAncestorSource)
        assert len(head_set) == src.size in (16, 32) and len(set(head_set)) == len(head_set)
        assert all(h.layer < src.model.num_layers and h.head < src.model.num_heads for h in head_set)
        assert src.config == f"src/qrretriever/configs/{src.model.name}_qr_head_{src.benchmark}.yaml"
        assert re.fullmatch(r"[0-9a-f]{40}", src.commit) and src.licence == "MIT"
        assert "Zhang" in src.citation and src.repository == "https://github.com/princeton-pli/QRHead"
    licence = published.QRHEAD_LICENCE_FILE.read_text(encoding="utf-8")
    assert licence.startswith("MIT License") and published.QRHEAD_DATA["licence"]["copyright"] in licence
    assert "The above copyright notice and this permission notice shall be included" in licence
    # each text model's grid is the paper's Table A7 grid of the VLMs built on its backbone
    for model in published.TEXT_MODELS:
        for vlm in published.MODELS:
            if vlm.backbone == model.backbone:
                assert (vlm.num_layers, vlm.num_heads) == (model.num_layers, model.num_heads)


def test_qrhead_specs_parse_into_head_sets():
    want = published.qrhead_heads("Qwen2.5-7B-Instruct")
    for spec in ("published:qrhead/qwen2.5-7b-instruct", "published:qrhead/Qwen/Qwen2.5-7B-Instruct",
                 "  Published:QRHead/Qwen2.5-7B-Instruct/nq ", "published:qrhead/QWEN2.5-7B-INSTRUCT/NQ"):
        got = published.parse_heads(spec)
        assert isinstance(got, published.PublishedHeadSet) and got == want and got.to_list() == want.to_list()
        assert got.source.spec == "published:qrhead/qwen2.5-7b-instruct"
        with pytest.raises(HeadSpecError, match="parse_heads"):
            HeadSet.parse(spec)
    for head_set in published.qrhead_sets():  # every canonical spec reads back the same list and source
        again = published.parse_spec(head_set.source.spec)
        assert again.to_list() == head_set.to_list() and again.source == head_set.source
    lme = published.parse_heads("published:qrhead/meta-llama/Llama-3.1-8B-Instruct/lme")
    assert lme.source.benchmark == "LME" and lme.source.spec == "published:qrhead/llama-3.1-8b-instruct/lme"
    assert lme != published.qrhead_heads("llama-3.1-8b-instruct")
    assert published.qrhead_heads("qwen3-8b")[:4].to_list() == ["L21H31", "L21H18", "L20H15", "L22H4"]  # top 4


@pytest.mark.parametrize("spec, fragment", [
    ("published:qrhead/qwen2.5-7b", "no QRHead list for text model 'qwen2.5-7b'"),  # the base model: not listed
    ("published:qrhead/qwen2.5-vl-7b", "no QRHead list for text model 'qwen2.5-vl-7b'"),
    ("published:qrhead/qwen3-8b/lme", "no QRHead list of Qwen3-8B on 'lme': it has NQ"),
    ("published:qrhead", "expected 'published:qrhead/MODEL[/DATA]'"),
    ("published:qrhead/", "expected 'published:qrhead/MODEL[/DATA]'"),
])
def test_unknown_qrhead_specs_are_a_clear_error_listing_what_exists(spec, fragment):
    with pytest.raises(published.UnknownPublishedSetError) as error:
        published.parse_heads(spec)
    message = str(error.value)
    assert fragment in message and "qrhead/qwen2.5-7b-instruct" in message and "qrhead/qwen3-8b" in message


def test_qrhead_sets_go_only_onto_a_model_of_the_text_llms_grid():
    qwen25, qwen3 = published.qrhead_heads("qwen2.5-7b-instruct"), published.qrhead_heads("qwen3-8b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the grid of Qwen2.5-VL-7B / InternVL3-8B and of Qwen3-VL-8B / InternVL3.5
        assert published.check_geometry(qwen25, HeadGeometry(28, 28, 4, 128)) is qwen25
        assert published.check_geometry(qwen3, HeadGeometry(36, 32, 8, 128)) is qwen3
    with pytest.raises(published.PublishedGeometryError) as error:  # heads out of range
        published.check_geometry(qwen3, HeadGeometry(28, 28, 4, 128))
    message = str(error.value)
    assert "36 layers x 32 heads" in message and "28 layers x 28 heads" in message and "L21H31" in message
    assert "Qwen/Qwen3-VL-8B-Instruct" in message and isinstance(error.value, HeadOutOfRangeError)
    with pytest.raises(published.PublishedGeometryError) as error:  # every head in range: still refused
        published.check_geometry(qwen25, HeadGeometry(36, 32, 8, 128))
    message = str(error.value)
    assert "every head is in range" in message and "28 layers x 28 heads" in message and "36 layers x 32" in message
    llama = published.qrhead_heads("llama-3.2-3b-instruct")  # 28 x 24: no paper VLM has that grid
    with pytest.raises(published.PublishedGeometryError, match="none of the paper's VLMs has that grid"):
        published.check_geometry(llama, HeadGeometry(28, 28, 4, 128))
    record = qwen25.source.to_dict()
    assert record["collection"] == "qrhead" and record["spec"] == "published:qrhead/qwen2.5-7b-instruct"
    assert record["licence"] == "MIT" and len(record["commit"]) == 40 and record["geometry"] == {"layers": 28,
                                                                                                  "heads": 28}


def _tail_by_hand(observed: int, total: int, a: int, b: int) -> Fraction:
    """P(|A ∩ B| >= observed), B a uniform b-subset of total items and |A| = a: the hypergeometric sum, by hand."""
    return sum((Fraction(math.comb(a, x) * math.comb(total - a, b - x), math.comb(total, b))
                for x in range(observed, min(a, b) + 1)), Fraction(0))


def test_tail_by_hand_equals_enumeration_on_small_grids():
    for total, a, b in [(8, 3, 4), (9, 4, 4), (10, 2, 5)]:
        counts = Counter(len(set(range(a)) & set(pick)) for pick in itertools.combinations(range(total), b))
        for observed in range(min(a, b) + 1):
            enumerated = Fraction(sum(n for x, n in counts.items() if x >= observed), sum(counts.values()))
            assert _tail_by_hand(observed, total, a, b) == enumerated
            assert published.overlap_tail(observed, total, a, b) == pytest.approx(float(enumerated), rel=1e-12)


def test_text_ancestor_overlap_against_an_independent_count(appendix):
    frame = published.text_ancestor_overlap()
    pairs = {(row.text_model, row.vlm) for row in frame.itertuples()}
    assert pairs == {("Qwen2.5-7B-Instruct", "Qwen2.5-VL-7B"), ("Qwen2.5-7B-Instruct", "InternVL3-8B"),
                     ("Qwen3-8B", "Qwen3-VL-8B"), ("Qwen3-8B", "InternVL3.5-8B"),
                     ("Qwen3-Embedding-8B", "Qwen3-VL-8B"), ("Qwen3-Embedding-8B", "InternVL3.5-8B")}
    assert len(frame) == len(pairs) * 5 * 2 and frame["same_backbone"].all()
    for row in frame.itertuples():
        text = set(_upstream_pairs(QRHEAD_UPSTREAM[row.text_model])) if row.text_model in QRHEAD_UPSTREAM else {
            (h.layer, h.head) for h in published.qrhead_heads(row.text_model)}
        vrhs = set(appendix[(row.benchmark, row.vlm)]["pairs"][:row.vrh_top])  # the paper's own text
        shared = len(text & vrhs)
        total = 784 if row.vlm in ("Qwen2.5-VL-7B", "InternVL3-8B") else 1152
        assert row.shared == shared and row.total_heads == total and row.qrhead_top == len(text) == 16
        assert row.chance_uniform == pytest.approx(16 * row.vrh_top / total, rel=1e-12)
        assert row.p_uniform == pytest.approx(float(_tail_by_hand(shared, total, 16, row.vrh_top)), rel=1e-9)
        assert row.chance_layer_matched >= row.chance_uniform  # both lists crowd the same layers
    # the statement of issue 54: QRHead's top-16 among the top-20 RefCOCO VRHs
    refcoco = frame[(frame["benchmark"] == "RefCOCO") & (frame["vrh_top"] == 20)].set_index(["text_model", "vlm"])
    assert refcoco.loc[("Qwen2.5-7B-Instruct", "Qwen2.5-VL-7B"), "shared"] == 8
    assert refcoco.loc[("Qwen2.5-7B-Instruct", "Qwen2.5-VL-7B"), "chance_uniform"] == pytest.approx(0.408, abs=1e-3)
    assert refcoco.loc[("Qwen3-8B", "Qwen3-VL-8B"), "shared"] == 9
    assert refcoco.loc[("Qwen3-8B", "InternVL3.5-8B"), "shared"] == 10


def test_text_ancestors_page_is_up_to_date():
    spec = importlib.util.spec_from_file_location("_generate_text_ancestors",
                                                  ROOT / "docs" / "_generate_text_ancestors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = ROOT / "docs" / "results" / "text-ancestors.md"
    assert page.read_text(encoding="utf-8") == module.render(), \
        "docs/results/text-ancestors.md is stale: run `python docs/_generate_text_ancestors.py`"


def test_cli_sweep_takes_a_qrhead_set_and_refuses_it_on_another_grid(grid_7b, tmp_path, capsys, monkeypatch):
    from vrh_interp.apps import cli

    load = cli._load_model
    monkeypatch.setattr(cli, "_load_model",
                        lambda spec, device, dtype: grid_7b if spec == "grid-7b" else load(spec, device, dtype))
    out = tmp_path / "sweep"
    status = cli.main(["sweep", "--model", "grid-7b", "--vrhs", "published:qrhead/Qwen/Qwen2.5-7B-Instruct", "--data",
                       "synthetic:eval:2", "--ks", "0,16", "--seeds", "0", "--no-matched", "--no-live", "--batch-size",
                       "2", "--max-new-tokens", "2", "--out", str(out), "--json"])
    assert status == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    source = manifest["heads_source"]
    assert source["spec"] == "published:qrhead/qwen2.5-7b-instruct" and source["collection"] == "qrhead"
    assert source["config"].endswith("Qwen2.5-7B-Instruct_qr_head_NQ.yaml") and source["licence"] == "MIT"
    assert manifest["conditions"]["top:k=16"] == published.qrhead_heads("qwen2.5-7b-instruct").to_list()
    status = cli.main(["sweep", "--model", "toy:c", "--vrhs", "published:qrhead/qwen3-8b", "--data",
                       "synthetic:eval:2", "--out", str(tmp_path / "refused")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and not (tmp_path / "refused").exists()
    assert "36 layers x 32 heads" in err and "8 layers x 16 heads" in err and "published:qrhead/qwen3-8b" in err
