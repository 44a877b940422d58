"""The `vrh` command line end to end on a tiny fixture: families, detect, sweep, report, demo."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from vrh_interp.apps.cli import main
from vrh_interp.core.description.families import BUILTIN_ADAPTERS
from vrh_interp.scoring.scores import HeadScores


def test_families_lists_every_adapter(capsys):
    assert main(["families", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(BUILTIN_ADAPTERS) == 13
    assert {"qwen2_5_vl", "internvl", "llava", "idefics3"} <= {r["family"] for r in rows}


@pytest.mark.parametrize("paper", [False, True], ids=["families", "paper"])
def test_families_is_a_static_table_in_100_columns(paper):
    """No model code is imported (the tables are registries: data), no line is wider than 100 columns and no
    cell is cut: every box format / status appears whole once the wrapped lines are joined."""
    import subprocess
    import sys

    from vrh_interp.core.description.families.paper_models import PAPER_MODELS
    from vrh_interp.core.description.families.registry import FAMILIES

    probe = ("import sys; from vrh_interp.apps.cli import main; main(['families'" + (", '--paper'" if paper else "")
             + "]); print('IMPORTED', sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.rstrip().endswith("IMPORTED []")
    table = out.rsplit("IMPORTED", 1)[0]
    assert max(len(line) for line in table.splitlines()) <= 100
    joined = " ".join(table.split())
    for text in ([m.status for m in PAPER_MODELS] if paper else [row.box_format for row in FAMILIES]):
        assert " ".join(text.split()) in joined


def test_detect_sweep_report_pipeline(tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--model", "tiny:qwen2_vl", "--batch-size", "4", "--max-new-tokens", "3"]
    assert main(["detect", *common, "--data", "synthetic:detect:4", "--out", str(out), "--json", "--top", "3"]) == 0
    detected = json.loads(capsys.readouterr().out)
    scores = HeadScores.load(detected["scores_file"])
    assert detected["top"] == scores.top(3).to_list()
    assert scores.provenance["dataset"] == "synthetic:detect:4" and len(scores.sample_ids) == 4
    assert main(["sweep", *common, "--data", "synthetic:eval:3", "--scores", detected["scores_file"], "--ks",
                 "0,12.5%,2", "--random-sets", "2", "--out", str(out / "sweep"), "--json"]) == 0
    summary = pd.DataFrame(json.loads(capsys.readouterr().out))
    assert set(summary["condition"]) == {"baseline", "top", "random", "matched", "live"} and (summary["n"] >= 3).all()
    assert set(zip(summary["k"], summary["k_fraction"])) == {(0, 0.0), (1, 0.125), (2, 0.25)}  # 12.5% of 8 heads
    assert set(summary["seed"].dropna().astype(str)) == {"0", "1", "all"}
    (out / "sweep" / "sweep_summary.csv").replace(out / "sweep_summary.csv")
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3 and "Causal k-sweep" in page


def test_sweep_and_scan_with_mean_ablation_mask_like_ground_batch(tmp_path, capsys):
    """``--ablation mean``: the reference outputs come from the scores' detection samples, and every masked
    answer is what ``ground_batch`` gives with the same ablation (itself checked against a plain-hook reference
    in test_ablation_kinds); the baseline stays unmasked and zero-kind."""
    from vrh_interp.evaluation.grounding import ablation_values, ground_batch
    from vrh_interp.core.description.heads import HeadSet
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.core.execution.templates.ablation import Ablation, AblationValues

    out = tmp_path / "run"
    common = ["--model", "tiny:qwen2_vl", "--batch-size", "4", "--max-new-tokens", "3"]
    assert main(["detect", *common, "--data", "synthetic:detect:4", "--out", str(out), "--json"]) == 0
    scores_file = json.loads(capsys.readouterr().out)["scores_file"]
    argv = ["sweep", *common, "--data", "synthetic:eval:3", "--scores", scores_file, "--ks", "0,1", "--random-sets",
            "2", "--ablation", "mean", "--out", str(out / "sweep"), "--json"]
    assert main([*argv, "--detect-data", "synthetic:detect:2"]) == 2  # not the samples the scores were made on
    assert "--detect-data synthetic:detect:2 holds 2 of the 4 samples" in capsys.readouterr().err
    assert main([*argv, "--detect-data", "synthetic:detect:4"]) == 0
    summary = pd.DataFrame(json.loads(capsys.readouterr().out))
    assert summary["key"].iloc[0] == "baseline:k=0" and summary["ablation"].iloc[0] == "zero"
    assert set(summary["ablation"].iloc[1:]) == {"mean"}
    values = AblationValues.load(out / "sweep" / "ablation_values.pt")
    manifest = json.loads((out / "sweep" / "manifest.json").read_text())
    assert manifest["ablation_values"] == values.fingerprint()

    from vrh_interp import load

    vlm = load("tiny:qwen2_vl")
    detection, evaluation = synthetic_samples("detect", 4), synthetic_samples("eval", 3)
    assert values.fingerprint() == ablation_values(vlm, detection, batch_size=4).fingerprint()
    records = pd.read_json(out / "sweep" / "sweep_records.jsonl", lines=True)
    top = HeadSet(manifest["conditions"]["top:k=1:ablation=mean"])
    expected = ground_batch(vlm, evaluation, heads=top, ablation=Ablation("mean", values), max_new_tokens=3)
    assert records[records["condition"] == "top:k=1:ablation=mean"]["answer"].tolist() == [o.answer for o in expected]

    assert main(["scan", *common, "--data", "synthetic:eval:3", "--scores", scores_file, "--limit", "2",
                 "--out", str(out / "scan"), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    table = pd.read_csv(facts["csv"])
    assert len(table) == facts["heads"] == 8 and facts["n"] == 2 and (out / "scan" / "head_scan.png").exists()
    assert set(table["damage_rank"]) <= set(range(1, 9)) and table["score_rank"].tolist() == list(range(1, 9))
    assert np.isnan(facts["spearman"]) or 0 < facts["p_value"] <= 1


def test_sweep_refuses_detection_samples(tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--model", "tiny:qwen2_vl", "--batch-size", "4", "--max-new-tokens", "2"]
    assert main(["detect", *common, "--data", "synthetic:detect:2", "--out", str(out), "--json"]) == 0
    scores_file = json.loads(capsys.readouterr().out)["scores_file"]
    code = main(["sweep", *common, "--data", "synthetic:detect:2", "--scores", scores_file, "--ks", "0,1",
                 "--out", str(out / "sweep")])
    assert code == 2 and "disjoint" in capsys.readouterr().err


def test_bad_data_spec_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as stop:  # refused while the options are parsed, before the model loads
        main(["detect", "--model", "tiny:qwen2_vl", "--data", "coco:/nowhere"])
    assert stop.value.code == 2 and "unknown data spec" in capsys.readouterr().err
    assert main(["detect", "--model", "tiny:qwen2_vl", "--data", "refcoco:/nowhere"]) == 2
    assert "/nowhere" in capsys.readouterr().err


def test_demo_runs_end_to_end_on_tiny_models(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--model", "tiny:llava", "--transfer-model", "tiny:llava_next", "--out", str(out),
                 "--detect", "4", "--eval", "3", "--random-sets", "2", "--check-items", "4", "--vqa-scenes", "2",
                 "--rank-sets", "40", "--no-positive-control", "--json"]) == 0
    printed = capsys.readouterr().out
    payload = json.loads(printed.strip().splitlines()[-1])
    assert payload["positive_control"] is None and payload["census"]["heads"] == 8
    # the terminal output is one screen: plan, one line per step, the claims tables, the report (issue 55); the
    # same run resumed (its records read back) prints it
    assert main(["demo", "--model", "tiny:llava", "--transfer-model", "tiny:llava_next", "--out", str(out),
                 "--detect", "4", "--eval", "3", "--random-sets", "2", "--check-items", "4", "--vqa-scenes", "2",
                 "--rank-sets", "40", "--no-positive-control"]) == 0
    screen = capsys.readouterr().out.strip().splitlines()
    assert len(screen) <= 60 and "The paper's claims:" in screen and screen[-1].startswith("report: ")
    assert sum(line.startswith("[") for line in screen) == 9  # one line per step (2-10: no positive control)
    from vrh_interp.evaluation.claims import CLAIMS

    ids = {v["id"] for v in payload["verdicts"]}
    assert {"causal", "causal_curve", "sparse", "specific", "stable", "shared", "vqa", "ablation_kinds",
            "score_damage", "design_space"} <= ids <= set(CLAIMS)
    # a tiny random model on 3 scenes decides nothing: no claim may read "does not hold" on so few items
    assert {v["verdict"] for v in payload["verdicts"]} <= {"inconclusive", "not measured"}
    # the rank step: sets at k* on a few items, in blocks, stopped once 5 are as harmful as the top-k, each set
    # answered item by item (curtailed); the k-sweep: one fresh set of each kind per scene, on its referents only
    causal = next(v for v in payload["verdicts"] if v["id"] == "causal")
    assert (out / "rank-k1" / "target" / "manifest.json").exists() and "rank p" in causal["numbers"]
    assert (out / "rank-k1" / "block-0000" / "item-000" / "manifest.json").exists()
    items_of = json.loads((out / "sweep" / "manifest.json").read_text())["items_of"]
    assert items_of and all(len({i.rsplit("-", 2)[0] for i in ids}) == 1 for ids in items_of.values())
    assert "one per scene" in causal["numbers"]
    shared = next(v for v in payload["verdicts"] if v["id"] == "shared")
    assert any((out / "cross_rank").glob("block-*")) and "rank p" in shared["numbers"]
    from vrh_interp.data import grounding_samples

    items = [s.sample_id for i in range(3) for s in grounding_samples("eval", i, 1)]
    assert json.loads((out / "sweep" / "manifest.json").read_text())["sample_ids"] == items
    kinds = pd.read_csv(out / "ablation_kinds.csv")
    assert kinds["ablation"].tolist() == ["zero", "mean", "resample"] and set(kinds["n"]) == {4}
    scan = pd.read_csv(out / "head_scan.csv")
    assert len(scan) == 8 and set(scan["n"]) == {4}
    assert len(list((out / "overlays").glob("*.png"))) == 3
    vqa = pd.read_csv(out / "vqa_summary.csv")
    assert set(vqa["benchmark"]) == {"synthetic-attribute", "synthetic-counting", "synthetic-spatial"}
    assert set(vqa["condition"]) == {"baseline", "top", "random", "matched", "live"}  # one set of each per scene
    sweep = pd.read_csv(out / "sweep_summary.csv")
    assert {"k_fraction", "p_vs_random", "p_vs_matched", "p_vs_live", "accuracy_q05"} <= set(sweep)
    assert set(sweep[sweep["seed"].astype(str) == "all"]["condition"]) == {"random", "matched", "live"}
    for name in ("report.html", "report.md", "sweep_summary.csv", "design_space.csv", "verdicts.csv", "transfer.csv",
                 "vqa_summary.csv", "head_scan.png", "ablation_values.pt", "timing.csv", "plan.json", "census.csv"):
        assert (out / name).exists(), name
    record = json.loads((out / "demo.json").read_text())
    assert record["budget_seconds"] is None and record["seed"] == 0 and record["evaluation_items"] == len(items)
    assert [row["step"] for row in record["steps"]] == [str(n) for n in range(2, 11)] + ["total"]
    report = (out / "report.md").read_text()
    assert report.index("The paper's claims") < report.index("Checks of the method") < report.index("## Figures")
    # rerunning the same command resumes; another request into the folder is refused at once
    capsys.readouterr()
    assert main(["demo", "--model", "tiny:llava", "--transfer-model", "tiny:llava_next", "--out", str(out),
                 "--detect", "5", "--no-positive-control"]) == 2
    assert "planned for another request (differs in sizes)" in capsys.readouterr().err


def test_demo_budget_cap_skips_steps_and_their_claims_read_inconclusive(tmp_path, capsys):
    out = tmp_path / "capped"
    assert main(["demo", "--model", "tiny:llava", "--transfer-model", "", "--out", str(out), "--detect", "4",
                 "--eval", "2", "--random-sets", "2", "--check-items", "3", "--vqa-scenes", "1",
                 "--no-positive-control", "--budget-seconds", "0.001", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    verdicts = {v["id"]: v for v in payload["verdicts"]}
    assert verdicts["causal"]["verdict"] == "inconclusive" and "budget" in verdicts["causal"]["reason"]
    assert not any(v["verdict"] in ("holds", "does not hold") for v in payload["verdicts"])


def test_remote_flag_runs_detection_through_ndif_and_never_prints_the_key(tmp_path, capsys, monkeypatch):
    """``--remote`` places the model with ``vlm.on(remote=True)``: nnsight's configured host and key, here a host
    where nothing listens, so the run fails with the clear error, and the key appears nowhere (output or run folder)."""
    import nnsight

    from tests.ndif_server import free_port

    secret = "ndif-test-key-4f1c9a"
    host = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(nnsight.CONFIG.API, "HOST", host)
    monkeypatch.setattr(nnsight.CONFIG.API, "APIKEY", secret)
    out = tmp_path / "run"
    status = main(["detect", "--model", "toy:a", "--data", "synthetic:detect:2", "--out", str(out), "--batch-size",
                   "2", "--max-new-tokens", "3", "--remote", "--json"])
    printed = capsys.readouterr()
    assert status == 2
    # not "cannot name this model": the toy's remote_id named it without asking the hub, then the connection failed
    assert f"could not reach an NDIF server at {host}" in printed.err
    assert secret not in printed.out + printed.err
    assert all(secret not in f.read_text(encoding="utf-8") for f in out.rglob("*") if f.is_file())


def test_patch_command_writes_tables_and_numeric_answers(tmp_path, capsys):
    out = tmp_path / "patching"
    status = main(["patch", "--model", "tiny:llava", "--vrhs", "L0H1,L1H0", "--pairs", "3", "--probe-scenes", "12",
                   "--seeds", "0", "--targets", "ground_truth", "--out", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "**Location** (referent_moved" in printed and "Spearman" in printed
    manifest = json.loads((out / "patching.json").read_text())
    assert manifest["provenance"]["vrhs"] == ["L0H1", "L1H0"]
    sets = pd.read_csv(out / "head_set_patching.csv")
    assert set(sets["head_set"]) == {"vrh", "random:seed=0", "matched:seed=0", "all"}
    # patching every head at the answer positions restores the clean metric exactly
    assert np.allclose(sets[sets["head_set"] == "all"]["recovery"], 1.0, atol=1e-4)
    assert (out / "patching.md").read_text().startswith("# Activation patching: tiny:llava")


def test_patch_command_resumes_a_finished_run_and_refuses_other_settings(tmp_path, capsys):
    out = tmp_path / "patching"
    argv = ["patch", "--model", "tiny:llava", "--vrhs", "L0H1", "--pairs", "2", "--probe-scenes", "12", "--seeds", "0",
            "--targets", "ground_truth", "--out", str(out)]
    assert main(argv) == 0
    first = (out / "head_set_patching.csv").read_text()
    stamp = (out / "patching.json").stat().st_mtime_ns
    assert main(argv) == 0  # finished: read back, not recomputed
    assert (out / "patching.json").stat().st_mtime_ns == stamp and (out / "head_set_patching.csv").read_text() == first
    assert main(argv[:-2] + ["--pairs", "3", "--out", str(out)]) == 2
    assert "other settings" in capsys.readouterr().err


def test_patch_command_resumes_an_interrupted_study_part_by_part(tmp_path, monkeypatch):
    from vrh_interp.experiments import patching_study as study

    argv = ["patch", "--model", "tiny:llava", "--vrhs", "L0H1", "--pairs", "2", "--probe-scenes", "12", "--seeds", "0",
            "--targets", "ground_truth"]
    assert main(argv + ["--out", str(tmp_path / "whole")]) == 0
    real, computed = study._kind_tables, []

    def killed_at_third_kind(vlm, kind, *args, **kwargs):
        if kind == study.PAIR_KINDS_STUDIED[2]:
            raise KeyboardInterrupt("simulated kill")
        computed.append(kind)
        return real(vlm, kind, *args, **kwargs)

    monkeypatch.setattr(study, "_kind_tables", killed_at_third_kind)
    out = tmp_path / "interrupted"
    try:
        main(argv + ["--out", str(out)])
    except KeyboardInterrupt:
        pass
    assert computed == list(study.PAIR_KINDS_STUDIED[:2]) and not (out / "patching.json").exists()

    def resumed(vlm, kind, *args, **kwargs):
        computed.append(kind)
        return real(vlm, kind, *args, **kwargs)

    monkeypatch.setattr(study, "_kind_tables", resumed)
    assert main(argv + ["--out", str(out)]) == 0
    assert computed == list(study.PAIR_KINDS_STUDIED)  # the two finished kinds were not recomputed
    for table in json.loads((out / "patching.json").read_text())["tables"]:
        assert (out / f"{table}.csv").read_text() == (tmp_path / "whole" / f"{table}.csv").read_text(), table
    (tmp_path / "changed").mkdir()
    (tmp_path / "changed" / "parts").mkdir()
    (tmp_path / "changed" / "parts" / "config.json").write_text("{}")
    assert main(argv + ["--out", str(tmp_path / "changed")]) == 2


def _vqa_summary(benchmark, n, base, top, sets, majority):
    """A VQA summary from hand-built records: ``base`` / ``top`` / each set's number of correct answers of ``n``
    (20 random and 20 layer-matched sets answering ``sets`` correctly, each missing other items)."""
    from vrh_interp.experiments.vqa_sweep import RECORD_COLUMNS, VQASweepResult
    from vrh_interp.experiments.conditions import Condition
    from vrh_interp.core.description.heads import HeadSet

    conditions = [Condition("baseline", 0, None, HeadSet()), Condition("top", 3, None, HeadSet())]
    conditions += [Condition(kind, 3, seed, HeadSet()) for kind in ("random", "matched") for seed in range(20)]
    hits = {"baseline": base, "top": top}
    records = [{"benchmark": benchmark, "sample_id": f"q{i}", "condition": c.key, "kind": c.kind, "k": c.k,
                "seed": c.seed, "response": "", "prediction": None,
                "correct": (i - (c.seed or 0)) % n < hits.get(c.kind, sets)}
               for c in conditions for i in range(n)]
    result = VQASweepResult(pd.DataFrame(records, columns=RECORD_COLUMNS), conditions, [benchmark], total_heads=32)
    return result, result.summary(resamples=200).assign(majority_baseline=majority)


def test_vqa_claim_is_judged_on_the_kinds_the_model_answers():
    from vrh_interp.experiments.vqa_sweep import vqa_answered
    from vrh_interp.evaluation.claims import judge
    from vrh_interp.experiments.verdicts import vqa_evidence
    from vrh_interp.experiments.vqa_sweep import VQASweepResult

    drop, drop_summary = _vqa_summary("synthetic-counting", 60, 54, 18, 51, 0.4)
    unanswered, unanswered_summary = _vqa_summary("synthetic-attribute", 60, 18, 0, 18, 0.25)
    both = VQASweepResult(pd.concat([drop.records, unanswered.records]), drop.conditions,
                          ["synthetic-counting", "synthetic-attribute"])
    answered = vqa_answered(pd.concat([drop_summary, unanswered_summary]))
    assert answered == ["synthetic-counting"]
    evidence = vqa_evidence(both, answered, 3)
    assert evidence.n == 60 and "synthetic-counting" in evidence.numbers
    from vrh_interp.evaluation.claims import CLAIMS

    # a family of one (its 20 sets reach rank p = 1/21); in the paper's family of 8 it would need 159 sets
    assert judge({"vqa": evidence}, specs={"vqa": CLAIMS["vqa"]}).iloc[0]["verdict"] == "holds"
    assert judge({"vqa": evidence}).iloc[0]["verdict"] == "inconclusive"
    small, small_summary = _vqa_summary("synthetic-counting", 12, 11, 4, 10, 0.4)
    assert judge({"vqa": vqa_evidence(small, ["synthetic-counting"], 3)}).iloc[0]["verdict"] == "inconclusive"


def test_spearman_permutation_p_equals_exhaustive_enumeration():
    """The permutation p-value against the exact one from all 720 pairings of 6 values (ties included)."""
    import itertools

    from vrh_interp.evaluation.statistics import spearman, spearman_permutation_p

    for a, b in (([0.9, 0.1, 0.5, 0.3, 0.7, 0.2], [0.3, 0.0, 0.1, 0.1, 0.2, 0.05]),
                 ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]), ([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1])):
        a, b = np.array(a, float), np.array(b, float)
        observed = spearman(a, b)
        exact = np.mean([spearman(a, b[list(order)]) >= observed - 1e-12 for order in itertools.permutations(range(6))])
        assert abs(spearman_permutation_p(a, b, permutations=20000) - exact) < 0.01, (a, b)
    assert np.isnan(spearman_permutation_p(np.ones(4), np.arange(4.0)))


def test_grading_csv_reads_back_into_the_positive_control_table(tmp_path):
    """The report reads the positive control's ``grading.csv``, whose rank lists are stored as text."""
    from vrh_interp.core.description.heads import HeadSet
    from vrh_interp.experiments.positive_control import grading_table
    from vrh_interp.apps.report import read_grading
    from vrh_interp.scoring.grading import grade_ranking

    ranking = HeadSet.parse("L2H1,L3H0,L1H5,L0H0")
    rows = [{"design": "a", "defined": True,
             **grade_ranking(ranking, HeadSet.parse("L2H1,L3H0"), HeadSet.parse("L1H5"))},
            {"design": "b", "defined": True,
             **grade_ranking(ranking, HeadSet.parse("L0H0,L3H0"), HeadSet.parse("L7H7"))}]
    frame = pd.DataFrame(rows)
    frame.to_csv(tmp_path / "grading.csv", index=False)
    shown = read_grading(tmp_path / "grading.csv")
    pd.testing.assert_frame_equal(shown, grading_table(frame))
    assert shown["planted_ranks"].tolist() == ["1, 2", "4, 2"] and shown["decoy_ranks"].tolist() == ["3", "None"]
