"""What a finished run prints: one ``show(result, spec, as_json) -> exit status`` per experiment (the declaration's
``show``), and the table and bullet printers every command shares. Tables fit a 100-column terminal; ``--json``
prints the machine-readable result instead; the run folder holds everything whole."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

WIDTH = 100


def table(frame: pd.DataFrame | list[dict[str, Any]], title: str) -> None:
    """A table (or its rows) that fits a 100-column terminal: wider tables wrap into column blocks and long text
    cells end in "..." (the files and ``--json`` hold them whole)."""
    import pandas as pd

    frame = frame if isinstance(frame, pd.DataFrame) else pd.DataFrame(frame)
    print(f"\n{title}")
    with pd.option_context("display.max_columns", 20, "display.precision", 3):
        print(frame.to_string(index=False, line_width=WIDTH, max_colwidth=48))


def bullets(lines: list[str]) -> None:
    print("\n".join(textwrap.fill(line, WIDTH, initial_indent="- ", subsequent_indent="  ",
                                   break_on_hyphens=False) for line in lines))


def shard_done(spec: Any, done: int, as_json: bool) -> int:
    """What a shard run prints instead of the tables (they need every shard)."""
    if as_json:
        print(json.dumps({"shard": str(spec.shard), "out": spec.out, "done": done}))
    else:
        print(f"\nshard {spec.shard} done: {done} units in {spec.out}. When all {spec.shard.count} shards are done: "
              f"vrh merge MERGED_OUT SHARD_0_OUT ... SHARD_{spec.shard.count - 1}_OUT")
    return 0


def scores(result: Any, path: Path, preset: str, top: int, as_json: bool) -> None:
    top = min(top, result.scores.size)
    if as_json:
        print(json.dumps({"scores_file": str(path), "top": result.top(top).to_list()}))
    else:
        table(result.to_frame().head(top), f"Top {top} heads ({preset}); saved {path}")


def detect(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh detect``: the top heads and the scores file (a shard: its sample count)."""
    from vrh_interp.experiments.detect import scores_path

    if spec.shard is not None:
        return shard_done(spec, len(result), as_json)
    scores(result, scores_path(spec.out, spec.preset), spec.preset, spec.top, as_json)
    return 0


def sweep_table(result: Any, as_json: bool, out: str | Path) -> None:
    """A compact table (each control's distribution row stands for its per-set rows), then one verdict line per
    k (``report.verdict_lines``: the claims rules); the full summary is ``OUT/sweep_summary.csv``."""
    from vrh_interp.apps.report import compact_sweep_table, verdict_lines
    from vrh_interp.evaluation.inference import sets_for

    summary = result.summary()
    if as_json:
        print(summary.to_json(orient="records"))
        return
    table(compact_sweep_table(summary), "k-sweep: top-k heads vs control head sets (control rows: their sets' "
                                        "distribution)")
    pooled = summary[summary["seed"].astype(str) == "all"]
    if len(pooled):
        sets = int(pooled["sets"].min())
        family = max(1, summary["k"].nunique() - 1)
        floor = (f"p_random / p_matched / p_live: the top-k's rank among {sets} sets of each kind, so no smaller "
                 f"than 1/{sets + 1} = {1 / (sets + 1):.3f} (more --random-sets lower that floor: Bonferroni over "
                 f"{family} k values needs about {sets_for(0.05 / family)} for a HOLDS).")
        print(textwrap.fill(floor, WIDTH))
    print("\n" + textwrap.fill("Verdict (evaluation.claims: HOLDS = the top-k ranks above the control sets including "
                               "its own draw, lowers accuracy against the unmasked model (exact McNemar) and the "
                               "control sets' accuracy minus its own is bounded above 0.05; DOES NOT HOLD = bounded "
                               "below 0.05; else INCONCLUSIVE; Bonferroni over the k values):", WIDTH))
    bullets(verdict_lines(result))
    print(f"\nfull table (per-set rows, failure decomposition):\n  {Path(out) / 'sweep_summary.csv'}")


def sweep(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh sweep``: the compact table and the verdict lines (a shard: its record count)."""
    if spec.shard is not None:
        return shard_done(spec, len(result.records), as_json)
    sweep_table(result, as_json, spec.out)
    return 0


def scan(facts: dict[str, Any], spec: Any, as_json: bool) -> int:
    """``vrh scan``: the per-head table and the score-damage correlation."""
    import pandas as pd

    from vrh_interp.experiments.head_scan import SCAN_CSV, SCAN_PNG

    out = Path(spec.out)
    if as_json:
        print(json.dumps({**facts, "csv": str(out / SCAN_CSV), "figure": str(out / SCAN_PNG)}))
        return 0
    table(pd.read_csv(out / SCAN_CSV), f"Single-head causal scan ({spec.ablation} ablation, {facts['n']} samples, "
                                       f"baseline accuracy {facts['baseline_accuracy']:.3f})")
    print(f"\nSpearman(score, accuracy drop) over {facts['heads']} heads: {facts['spearman']:.3f} "
          f"(one-sided permutation p = {facts['p_value']:.3g}); scatter: {out / SCAN_PNG}")
    return 0


def design_table(frame: pd.DataFrame, k: int, as_json: bool) -> None:
    if as_json:
        print(frame.to_json(orient="records"))
    else:
        table(frame.drop(columns=["top_heads"]), f"Design space: accuracy drop when masking top-{k}")


def design_space(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh design-space``: the variants ranked (a shard: its record count)."""
    if spec.shard is not None:
        return shard_done(spec, len(result.records), as_json)
    design_table(result, spec.k, as_json)
    return 0


def vqa_table(result: Any, as_json: bool, out: str | Path) -> None:
    """Accuracy per benchmark and condition; the full summary is ``OUT/vqa_summary.csv``."""
    if as_json:
        print(result.summary().to_json(orient="records"))
        return
    k = max(condition.k for condition in result.conditions)
    table(result.table().xs("accuracy", axis=1, level="stat").round(1).reset_index(names="condition"),
          f"VQA accuracy (%), top-{k} VRHs vs control sets of {k} heads")
    print(f"\nfull table: {Path(out) / 'vqa_summary.csv'}")


def vqa_sweep(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh vqa-sweep``: accuracy per benchmark and condition (a shard: its record count)."""
    if spec.shard is not None:
        return shard_done(spec, len(result.records), as_json)
    vqa_table(result, as_json, spec.out)
    return 0


def reproduce_tables(result: Any, data: str, as_json: bool) -> None:
    """The tables of a whole ``vrh reproduce`` run (or of its shards merged, ``vrh merge``) on the grounding
    benchmark ``data``: the k-sweep, the failure split, Table 3 and the verdicts."""
    if as_json:
        print(json.dumps({"out": str(result.out), "ks": result.ks, "vqa_k": result.vqa_k,
                          "sweep": result.sweep_summary.to_dict(orient="records"),
                          "failure_split": result.failure_split.to_dict(orient="records"),
                          "vqa": None if result.vqa_summary is None else result.vqa_summary.to_dict(orient="records"),
                          "claims": None if result.claims is None else result.claims.to_dict(orient="records")},
                         default=str))
        return
    table(result.sweep_summary.drop(columns=["key"]), f"k-sweep on {data} (ks {result.ks})")
    table(result.failure_split.drop(columns=["key"]),
          "Failure split: correct / parse failure / mislocation (boxed another object / no object)")
    if result.vqa_table is not None:
        table(result.vqa_table.xs("accuracy", axis=1, level="stat").round(1).reset_index(names="condition"),
              f"Cross-task VQA accuracy (%), top-{result.vqa_k} VRHs vs {result.vqa_k} random heads")
    if result.claims is not None:
        from vrh_interp.apps.report import claim_lines

        print("\nVerdict (evaluation.claims, Bonferroni over the k values):")
        bullets(claim_lines(result.claims))
    print(f"\nrun folder: {result.out}")


def reproduce(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh reproduce``: the k-sweep, the failure split, Table 3 and the verdicts (a shard: its k-sweep answers)."""
    if spec.shard is not None:
        per_condition = result.failure_split[result.failure_split["seed"].astype(str) != "all"]
        return shard_done(spec, int(per_condition["n"].sum()), as_json)  # this shard's k-sweep answers
    reproduce_tables(result, spec.data, as_json)
    return 0


def transfer(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh transfer``: each model's accuracy with its own, the other's and random top-k masked."""
    summary = result.summary()
    if as_json:
        print(summary.to_json(orient="records"))
        return 0
    table(summary, "Cross-masking: own, transferred and random heads masked in each model")
    print(f"\nrun folder: {spec.out} (cross_masking_summary.csv, transfer_drops.csv)")
    return 0


def patch(study: Any, spec: Any, as_json: bool) -> int:
    """``vrh patch``: one sentence per question of the study, or its facts and tables."""
    from vrh_interp.experiments.patching_study import answers

    if as_json:
        print(json.dumps({"out": spec.out, "facts": study.facts,
                          "tables": {k: v.to_dict(orient="records") for k, v in study.tables.items()}}, default=str))
        return 0
    print("\n".join(f"- {line}" for line in answers(study)))
    print(f"\nrun folder: {spec.out} (patching.md, patching.json and one CSV per table)")
    return 0


def localize(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh localize``: the attention box beside the generated box, Acc@IoU of each and the four-way table."""
    from vrh_interp.experiments.localize import CSV, JSON

    out = Path(spec.out)
    if as_json:
        print(json.dumps({"summary": json.loads(result.summary().to_json(orient="records")), "csv": str(out / CSV),
                          "json": str(out / JSON)}))
        return 0
    row = result.summary().iloc[0]
    label = row["heads"]
    print(f"Attention box of {label} ({', '.join(result.head_sets[label])}) beside the generated box, "
          f"{row['n']} items, Acc@{result.iou_threshold:g}:")
    print(f"  attention box {row['heads_acc']:.3f}   generated box {row['answer_acc']:.3f}   exact McNemar p = "
          f"{row['mcnemar_p']:.3g} ({row['heads_only']} heads-only, {row['answer_only']} answer-only)")
    print(result.four_way(label).to_string())
    print(f"\nper item: {out / CSV}; summary with provenance: {out / JSON}")
    return 0


def steer(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh steer``: the dose-response, the rank test and the patching form, then the claim's line."""
    import pandas as pd

    from vrh_interp.experiments.steer import claim_line

    if as_json:
        print(json.dumps({"out": spec.out, "verdict": result.verdict(), "claim": result.claims().iloc[0].to_dict(),
                          "dose_response": result.dose_response().to_dict(orient="records"),
                          "rank": result.rank().to_dict(orient="records"),
                          "patching": result.patching().to_dict(orient="records")}, default=str))
        return 0
    tables = [("dose-response: share of answers that move to the target / stay / break", result.dose_response()),
              (f"rank test at alpha {result.config['claim_alpha']:g}: control sets drawn per kind, how many moved as "
               "many answers as the top-k, p", result.rank()),
              ("activation patching from the target-as-referent run", result.patching())]
    for title, frame in tables:
        if not frame.empty:
            with pd.option_context("display.max_columns", 20, "display.precision", 3):
                print(f"\n{title}\n{frame.to_string(index=False, line_width=WIDTH)}")
    print()
    print(claim_line(result))
    print(f"\nrun folder: {spec.out} (records.csv, dose_response.csv, rank.csv, patching.csv, claims.csv, "
          "steer.json, dose_response.png)")
    return 0


def demo(result: Any, spec: Any, as_json: bool) -> int:
    """``vrh demo``: the report (``apps.report``, led by the verdicts), then the verdicts (``--json``: with the report's
    path, the positive control's verdict and the head census)."""
    import time

    from vrh_interp.apps.report import write_report
    from vrh_interp.evaluation.claims import claims_lines

    paths = write_report(result.out)
    elapsed, budget, summary = time.perf_counter() - result.started, result.summary["budget_seconds"], result.summary
    if as_json:
        control = summary["positive_control"]
        print(json.dumps({"verdicts": result.verdicts.to_dict(orient="records"), "report": str(paths["html"]),
                          "positive_control": None if control is None else control["verdict"],
                          "census": summary["census"], "seconds": round(elapsed, 1)}, default=str))
        return 0
    print(f"\n{claims_lines(result.verdicts, WIDTH)}")  # the reasons and numbers: in the report
    print(f"\nreport: {paths['html']}  ({elapsed:.0f} s" + (f" of a {budget:g} s cap)" if budget else ")"))
    return 0


def grid(result: Any, spec: Any, as_json: bool) -> int:
    """What ``vrh grid`` prints: the summary table and every cell's status (``as_json``: one JSON object); 0 when
    every cell is done, 1 otherwise (the failed cells' reasons are printed and kept in grid.json)."""
    import pandas as pd

    from vrh_interp.experiments.grid import HEATMAP, SUMMARY_MD

    states = [{"cell": c.id, "status": result.status[c.id]["status"], "reason": result.status[c.id].get("reason", "")}
              for c in result.cells]
    if as_json:
        extra = ({"patching": json.loads(result.patching.to_json(orient="records"))}
                 if result.patching is not None else {})
        print(json.dumps({"out": str(result.out), "cells": states,
                          "summary": json.loads(result.summary.to_json(orient="records")), **extra}))
    else:
        with pd.option_context("display.max_columns", 20, "display.precision", 3, "display.width", 120):
            if len(result.summary):
                print("\nGrid summary: accuracy (baseline, top-k VRHs masked, mean of the random / layer-matched / "
                      "live-head control sets), drop and verdict")
                print(result.summary.drop(columns=["reason"]).to_string(index=False))
            if result.patching is not None and len(result.patching):
                print("\nPatching: recovery of the studied heads, all heads, their rank among the random / "
                      "layer-matched sets, verdict")
                print(result.patching.drop(columns=["heads", "verdict"]).to_string(index=False))
            done = sum(s["status"] == "done" for s in states)
            print(f"\n{done} of {len(states)} cells done; folder {result.out} (grid.json, {SUMMARY_MD}, {HEATMAP})")
            for state in states:
                if state["status"] != "done":
                    print(f"- {state['cell']}: {state['status']} {state['reason']}".rstrip())
    return 0 if not result.failed else 1
