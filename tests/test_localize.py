"""``experiments.localize`` and ``vrh localize``: attention boxes beside the generated boxes on the same items, the
four-way table, the McNemar test, the run folder (resume, read back) and the command on toy:planted."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import tiny_vlm
from vrh_interp.apps.cli import main
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.bookkeeping.runs import RunMismatchError
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.evaluation.attention_box import BoxReadout
from vrh_interp.evaluation.statistics import mcnemar_exact
from vrh_interp.experiments.localize import LocalizeResult, localize, localize_from_run, outcome, write_localize


def test_four_way_table_and_mcnemar_from_hand_made_records():
    # 2 both, 3 heads only, 1 answer only, 4 neither
    cells = [(0.9, 0.8)] * 2 + [(0.6, 0.1)] * 3 + [(0.2, 0.7)] + [(0.0, 0.3)] * 4
    records = pd.DataFrame([{"heads": "h", "sample_id": f"s{i}", "truth": [0, 0, 1, 1], "answer": "", "parsed": True,
                             "answer_box": None, "answer_iou": a, "heads_box": [0, 0, 1, 1] if i else None,
                             "heads_iou": h, "components": 1} for i, (h, a) in enumerate(cells)])
    result = LocalizeResult(records, {"h": ["L0H0"]}, BoxReadout())
    row = result.summary().iloc[0]
    assert (row["both"], row["heads_only"], row["answer_only"], row["neither"]) == (2, 3, 1, 4)
    assert row["heads_acc"] == pytest.approx(0.5) and row["answer_acc"] == pytest.approx(0.3)
    assert row["mcnemar_p"] == pytest.approx(0.625)  # two-sided exact: 2 * P(Bin(4, 1/2) <= 1) = 2 * 5 / 16
    assert row["p_heads_better"] == pytest.approx(5 / 16) and row["p_answer_better"] == pytest.approx(15 / 16)
    assert row["no_box"] == pytest.approx(0.1)
    table = result.four_way()
    assert table.to_numpy().tolist() == [[2, 3], [1, 4]]
    assert [outcome(True, True), outcome(True, False), outcome(False, True), outcome(False, False)] == \
        ["both", "heads_only", "answer_only", "neither"]
    # the threshold decides: at IoU 0.65 the 0.6 boxes are wrong
    stricter = LocalizeResult(records, {"h": ["L0H0"]}, BoxReadout(), iou_threshold=0.65).summary().iloc[0]
    assert (stricter["both"], stricter["heads_only"]) == (2, 0)


def test_localize_records_resume_and_read_back(tmp_path):
    vlm = tiny_vlm("qwen2_vl")
    samples = synthetic_samples("eval", 3)
    sets = {"a": HeadSet.parse("L0H1,L1H2"), "b": "L1H0"}
    run = tmp_path / "run"
    first = localize(vlm, samples[:2], sets, batch_size=2, max_new_tokens=6, run_dir=run, progress=False)
    assert len(first.records) == 4 and list(first.records["heads"]) == ["a", "a", "b", "b"]
    # the same folder with more samples is another configuration: refused, not mixed
    with pytest.raises(RunMismatchError):
        localize(vlm, samples, sets, batch_size=2, max_new_tokens=6, run_dir=run, progress=False)
    log = run / "localize_records.jsonl"
    lines = log.read_text().count("\n")
    again = localize(vlm, samples[:2], sets, batch_size=2, max_new_tokens=6, run_dir=run, progress=False)
    pd.testing.assert_frame_equal(again.records, first.records)
    assert log.read_text().count("\n") == lines == 4  # resumed: nothing recomputed or appended
    read = localize_from_run(run)
    pd.testing.assert_frame_equal(read.records, first.records)
    assert read.readout == BoxReadout() and read.head_sets == {"a": ["L0H1", "L1H2"], "b": ["L1H0"]}
    # the answer side equals the grounding evaluation's greedy outcome, the heads side the attention box
    from vrh_interp.evaluation.attention_box import attention_boxes
    from vrh_interp.evaluation.grounding import ground_batch

    answers = ground_batch(vlm, samples[:2], max_new_tokens=6)
    np.testing.assert_allclose(first.records["answer_iou"][:2], [o.iou for o in answers])
    batch = vlm.encode_grounding([s.image for s in samples[:2]], [s.expression for s in samples[:2]])
    boxes = attention_boxes(vlm, batch, sets["a"])
    assert [b.box.as_tuple() if b.box else None for b in boxes] == \
        [tuple(b) if b is not None else None for b in first.records["heads_box"][:2]]
    facts = write_localize(read, tmp_path / "out")
    assert facts["summary"][0]["n"] == 2 and (tmp_path / "out" / "localize.csv").exists()
    assert json.loads((tmp_path / "out" / "localize.json").read_text())["provenance"]["kind"] == "localize"
    counts = mcnemar_exact(read.items()["heads_right"][:2], read.items()["answer_right"][:2])
    assert read.summary()["mcnemar_p"].iloc[0] == pytest.approx(counts["p_value"])
    # it shows itself in a few lines and as HTML, one row per head set, never the records frame
    shown = repr(read)
    assert shown.startswith("LocalizeResult:") and len(shown.splitlines()) == 3 and "attention box" in shown
    assert "heads_iou" not in shown and "<table>" in read._repr_html_()


def test_vrh_localize_on_toy_planted(tmp_path, capsys):
    out = tmp_path / "loc"
    common = ["localize", "--model", "toy:planted", "--data", "synthetic:eval:4", "--batch-size", "4",
              "--max-new-tokens", "12", "--out", str(out)]
    assert main([*common, "--heads", "L2H3,L3H2,L3H11", "--sigma", "0", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    row = facts["summary"][0]
    assert row["heads"] == "L2H3,L3H2,L3H11" and row["n"] == 4
    assert row["both"] + row["heads_only"] + row["answer_only"] + row["neither"] == 4
    items = pd.read_csv(out / "localize.csv")
    assert len(items) == 4 and set(items["outcome"]) <= {"both", "heads_only", "answer_only", "neither"}
    assert json.loads((out / "localize.json").read_text())["readout"]["sigma"] == 0
    # rerun: resumed from the run folder, same numbers; printed as a table
    assert main([*common, "--heads", "L2H3,L3H2,L3H11", "--sigma", "0"]) == 0
    text = capsys.readouterr().out
    assert "attention box right" in text and f"attention box {row['heads_acc']:.3f}" in text
    # another readout in the same folder is refused in one line, no traceback
    assert main([*common, "--heads", "L2H3,L3H2,L3H11", "--sigma", "1"]) == 2
    error = capsys.readouterr().err
    assert "different configuration" in error and "Traceback" not in error
    # heads chosen by a detection run here (top --k of --preset), kept in OUT/detect
    assert main(["localize", "--model", "toy:planted", "--data", "synthetic:eval:2", "--detect-data",
                 "synthetic:detect:4", "--k", "2", "--max-new-tokens", "12", "--out", str(tmp_path / "det"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"][0]["heads"] == "vrh top-2"
    assert (tmp_path / "det" / "detect" / "detect_records.jsonl").exists()


@pytest.mark.parametrize("argv, message", [
    (["--heads", "L9H9"], "L9H9 is not a head of toy:planted"),
    (["--heads", "L0H0", "--scores", "s.json"], "not both"),
    (["--threshold", "1.5"], "quantile"),
    (["--sigma", "-1"], "smoothing width"),
    (["--component", "biggest"], "invalid choice"),
    (["--data", "synthetic:detect:3", "--detect-data", "synthetic:detect:3"], "overlaps --detect-data"),
])
def test_vrh_localize_refuses_in_one_line(tmp_path, capsys, argv, message):
    if "s.json" in argv:
        (tmp_path / "s.json").write_text("{}")
        argv = [a.replace("s.json", str(tmp_path / "s.json")) for a in argv]
    try:
        code = main(["localize", "--model", "toy:planted", "--out", str(tmp_path / "o"), *argv])
    except SystemExit as exit_:  # argparse refuses a bad option value itself
        code = exit_.code
    error = capsys.readouterr().err
    assert code == 2 and message in error and "Traceback" not in error
