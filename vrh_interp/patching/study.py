"""The activation-patching study: what do the detected VRHs read out and write? One call, tables out.

Questions and the measurement that answers each (all on held-out ``eval`` scenes, disjoint from the
``detect`` scenes the VRHs were scored on; random controls are head sets of the same size drawn outside
the VRHs, several seeds):

1. Do the VRHs' outputs carry the referent's LOCATION? Patch the VRH outputs clean -> corrupted on
   ``referent_moved`` pairs (same words, object elsewhere): logit-difference recovery, and the box the
   patched model then generates (IoU with the clean box). Plus linear probes of the box from the heads'
   outputs (``probes``).
2. Its ATTRIBUTES? The same on ``referent_recoloured`` pairs (the colour named now belongs to another
   object), and colour/shape probes.
3. From which POSITIONS? Key/value patching of each VRH at the referent, the distractors, the background
   and the text (``positions``), on ``referent_moved`` and ``expression_swap`` pairs.
4. How much of the effect is DIRECT? Direct vs total effect (``mediation``), VRHs vs random heads.
5. Which heads matter most by patching, and does attribution patching rank them the same? Every head
   exactly vs gradient x difference; rank correlations; overlap of the top heads with the VRHs.

``run_patching_study`` returns DataFrames; ``save`` writes them as CSV plus a JSON manifest. With
``parts_dir`` every pair kind (and the probes) is saved as it finishes, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from vrh_interp.data import grounding_samples
from vrh_interp.heads import HeadSet
from vrh_interp.model import VLM
from vrh_interp.report import markdown_table
from vrh_interp.patching.attribution import attribution_patching, compare_rankings
from vrh_interp.patching.batch import baseline, prepare_pairs
from vrh_interp.patching.head_patching import patch_each_head, patch_head_set, patched_answers
from vrh_interp.patching.mediation import mediation_table
from vrh_interp.patching.pairs import make_pairs
from vrh_interp.patching.positions import position_patching
from vrh_interp.patching.probes import comparison_head_sets, readout_probes


@dataclass
class PatchingStudy:
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def save(self, out: Path, provenance: dict[str, Any], config: dict[str, Any]) -> None:
        """CSV per table, then ``patching.json`` LAST: its presence marks a complete run."""
        out.mkdir(parents=True, exist_ok=True)
        for name, table in self.tables.items():
            table.to_csv(out / f"{name}.csv", index=False)
        (out / "patching.json").write_text(json.dumps({"config": config, "provenance": provenance, "facts": self.facts,
                                                       "tables": sorted(self.tables)}, indent=1, default=str))

    @classmethod
    def load(cls, out: Path) -> "PatchingStudy":
        manifest = json.loads((out / "patching.json").read_text())
        return cls({name: pd.read_csv(out / f"{name}.csv") for name in manifest["tables"]}, manifest["facts"])


PAIR_KINDS_STUDIED = ("referent_moved", "referent_recoloured", "expression_swap", "different_image")
PART_DONE = "done.json"  # written last in each part folder: its presence marks a finished part


def _kind_tables(vlm: VLM, kind: str, vrhs: HeadSet, with_all: dict[str, HeadSet], *, pairs_per_kind: int,
                 targets: str, progress: bool) -> dict[str, pd.DataFrame]:
    """Every measurement on one kind of pair (questions 1-5 where they apply)."""
    sets = {name: heads for name, heads in with_all.items() if name != "all"}
    pairs = prepare_pairs(vlm, make_pairs(kind, pairs_per_kind), targets=targets)
    base = baseline(vlm, pairs)
    tables = {"pairs": pd.DataFrame([{"kind": kind, "pairs": pairs.n + len(pairs.excluded), "kept": pairs.n,
                                      "excluded": len(pairs.excluded), "clean_metric": float(np.mean(base.clean)),
                                      "corrupted_metric": float(np.mean(base.corrupted))}])}
    set_rows, answer_rows = [], []
    for name, heads in with_all.items():
        patched = patch_head_set(vlm, pairs, heads, base=base)
        set_rows.append({"kind": kind, "head_set": name, **patched})
        answers = patched_answers(vlm, pairs, heads)
        answer_rows.append({"kind": kind, "head_set": name, "heads": len(heads),
                            "iou_clean_box": float(answers["iou_clean_box"].mean()),
                            "hit_clean_box": float((answers["iou_clean_box"] >= 0.5).mean()),
                            "iou_corrupted_box": float(answers["iou_corrupted_box"].mean()),
                            "same_as_clean_answer": float((answers["patched_answer"] == answers["clean_answer"]).mean()),
                            "parsed": float(answers["parsed"].mean()), "n_pairs": pairs.n})
    tables["head_set_patching"] = pd.DataFrame(set_rows)
    tables["patched_answers"] = pd.DataFrame(answer_rows)
    if kind in ("referent_moved", "expression_swap"):
        tables["position_patching"] = position_patching(vlm, pairs, list(vrhs), base=base).assign(kind=kind)
    if kind in ("referent_moved", "expression_swap", "referent_recoloured"):
        tables["mediation"] = mediation_table(vlm, pairs, sets).assign(kind=kind)
        exact = patch_each_head(vlm, pairs, base=base, progress=progress)
        estimate = attribution_patching(vlm, pairs, base=base)
        ranking = compare_rankings(exact, estimate)
        top = exact.frame.nlargest(len(vrhs), "recovery")["head"].tolist()
        tables["rankings"] = pd.DataFrame([{"kind": kind, **ranking, "top_exact_heads": " ".join(top),
                                            "top_exact_in_vrhs": len(set(top) & {str(h) for h in vrhs}) / len(vrhs)}])
        tables["each_head"] = exact.frame.merge(estimate.frame[["head", "recovery"]], on="head",
                                                suffixes=("", "_attribution")).assign(kind=kind)
    return tables


def _part(parts_dir: Path | None, name: str, compute: Any) -> dict[str, pd.DataFrame]:
    """``compute()``'s tables, or the ones a previous run saved under ``parts_dir/name`` (CSV, marker last)."""
    if parts_dir is None:
        return compute()
    folder = parts_dir / name
    if (folder / PART_DONE).exists():
        saved = json.loads((folder / PART_DONE).read_text())["tables"]
        return {table: pd.read_csv(folder / f"{table}.csv") for table in saved}
    tables = compute()
    folder.mkdir(parents=True, exist_ok=True)
    for table, frame in tables.items():
        frame.to_csv(folder / f"{table}.csv", index=False)
    (folder / PART_DONE).write_text(json.dumps({"tables": list(tables)}))
    return {table: pd.read_csv(folder / f"{table}.csv") for table in tables}  # the same values either way


def run_patching_study(vlm: VLM, vrhs: HeadSet, *, pairs_per_kind: int = 48, probe_scenes: int = 120,
                       random_seeds: Sequence[int] = (0, 1, 2), targets: str = "greedy",
                       progress: bool = True, parts_dir: Path | None = None) -> PatchingStudy:
    """Run questions 1-5 of the module docstring on ``vlm`` with ``vrhs`` (detected on other scenes).

    With ``parts_dir``, each pair kind and the probes are saved there as they finish and read back on a rerun,
    so an interrupted study loses at most the part it was in (the caller checks the settings match).
    """
    with_all = comparison_head_sets(vrhs, vlm.geometry, random_seeds=tuple(random_seeds), include_all=True)
    parts = [_part(parts_dir, kind, lambda kind=kind: _kind_tables(
        vlm, kind, vrhs, with_all, pairs_per_kind=pairs_per_kind, targets=targets, progress=progress))
        for kind in PAIR_KINDS_STUDIED]
    samples = [s for index in range(probe_scenes) for s in grounding_samples("eval", index, difficulty=1)]
    probes = _part(parts_dir, "probes", lambda: {"probes": readout_probes(vlm, samples, vrhs,
                                                                          random_seeds=tuple(random_seeds))})
    study = PatchingStudy()
    for table in ("pairs", "head_set_patching", "patched_answers", "position_patching", "mediation", "rankings",
                  "each_head"):
        study.tables[table] = pd.concat([part[table] for part in parts if table in part], ignore_index=True)
    study.tables["probes"] = probes["probes"]
    study.facts = {"vrhs": [str(h) for h in vrhs], "pairs_per_kind": pairs_per_kind, "targets": targets,
                   "probe_samples": len(samples), "random_seeds": list(random_seeds)}
    return study


def _ci(row: Any, value: str = "recovery", low: str = "ci_low", high: str = "ci_high") -> str:
    return f"{row[value]:.3f} [{row[low]:.3f}, {row[high]:.3f}]"


def _random_mean(frame: pd.DataFrame, column: str) -> tuple[float, float, float]:
    """Mean, min and max of ``column`` over the random head sets."""
    values = frame[frame["head_set"].str.startswith("random")][column]
    return float(values.mean()), float(values.min()), float(values.max())


def _separated(frame: pd.DataFrame, column: str = "recovery", low: str = "ci_low", high: str = "ci_high") -> bool:
    """The VRHs' CI lies above every random set's CI."""
    vrh = frame[frame["head_set"] == "vrh"].iloc[0]
    randoms = frame[frame["head_set"].str.startswith("random")]
    return bool((vrh[low] > randoms[high]).all())


def answers(study: PatchingStudy) -> list[str]:
    """One numeric sentence per question of the module docstring, worded by fixed rules (CI separation)."""
    t = study.tables
    sets, gen, med, pos, probes, ranks = (t["head_set_patching"], t["patched_answers"], t["mediation"],
                                          t["position_patching"], t["probes"], t["rankings"])
    lines = []

    def patch_line(kind: str, what: str) -> str:
        part = sets[sets["kind"] == kind]
        vrh = part[part["head_set"] == "vrh"].iloc[0]
        mean, lo, hi = _random_mean(part, "recovery")
        g = gen[(gen["kind"] == kind)]
        g_vrh = g[g["head_set"] == "vrh"].iloc[0]
        g_mean, _, _ = _random_mean(g, "hit_clean_box")
        verdict = "more than every random set (CIs separated)" if _separated(part) else "not separated from random heads"
        return (f"**{what}** ({kind}, {int(vrh['n_pairs'])} pairs): patching the {int(vrh['heads'])} VRHs clean -> corrupted "
                f"recovers {_ci(vrh)} of the logit difference vs {mean:.3f} (range {lo:.3f} to {hi:.3f}) for random sets "
                f"of the same size: {verdict}. In free generation the patched model then boxes the clean referent "
                f"(IoU >= 0.5) in {g_vrh['hit_clean_box']:.3f} of pairs (random sets: {g_mean:.3f}; all heads: "
                f"{g[g['head_set'] == 'all'].iloc[0]['hit_clean_box']:.3f}).")

    lines.append(patch_line("referent_moved", "Location"))
    box = probes[probes["target"].isin(["box_cx", "box_cy"])]
    if len(box):
        cells = []
        for target in ("box_cx", "box_cy"):
            part = box[box["target"] == target]
            vrh = part[part["head_set"] == "vrh"].iloc[0]
            rmean, _, _ = _random_mean(part, "metric")
            allh = part[part["head_set"] == "all"]
            all_text = f", all heads {allh.iloc[0]['metric']:.3f}" if len(allh) else ""
            cells.append(f"{target} R^2 {_ci(vrh, 'metric')} (random mean {rmean:.3f}{all_text})")
        lines.append("Linear probes of the referent's box from the heads' outputs at the last prompt position: "
                     + "; ".join(cells) + ".")
    lines.append(patch_line("referent_recoloured", "Attributes"))
    colour = probes[probes["target"] == "colour"]
    if len(colour):
        vrh = colour[colour["head_set"] == "vrh"].iloc[0]
        rmean, _, _ = _random_mean(colour, "metric")
        lines.append(f"Colour probe accuracy: VRHs {_ci(vrh, 'metric')} vs random mean {rmean:.3f}, chance "
                     f"{vrh['chance']:.3f} (the query names the colour in {vrh['named_rate']:.0%} of samples).")
    for kind in ("referent_moved", "expression_swap"):
        part = pos[pos["kind"] == kind]
        if not len(part):
            continue
        cells = []
        for head, rows in part.groupby("head", sort=False):
            whole = rows[rows["region"] == "head_output"].iloc[0]["recovery"]
            regions = rows[rows["region"] != "head_output"].set_index("region")["recovery"]
            best = regions.idxmax()
            if regions.max() >= 0.02:
                reading = f"largest: {best}"
            elif whole >= 0.05:
                reading = ("no region >= 0.02 although the whole head recovers: its effect comes through its query "
                           "(where it looks), not from changed keys/values")
            else:
                reading = "the head's own effect is small"
            cells.append(f"{head}: whole output {whole:.3f}, " + ", ".join(f"{r} {v:.3f}" for r, v in regions.items())
                         + f" ({reading})")
        lines.append(f"**Positions** ({kind}, keys+values of one head patched at one region): " + "; ".join(cells) + ".")
    for kind in med["kind"].unique():
        part = med[med["kind"] == kind]
        vrh = part[part["head_set"] == "vrh"].iloc[0]
        share = vrh["direct"] / vrh["total"] if vrh["total"] else float("nan")
        lines.append(f"**Direct vs total** ({kind}): VRHs total {vrh['total']:.3f}, direct "
                     f"{_ci(vrh, 'direct', 'direct_ci_low', 'direct_ci_high')}, indirect {vrh['indirect']:.3f} "
                     f"(direct share {share:.2f}); random sets total {_random_mean(part, 'total')[0]:.3f}, "
                     f"direct {_random_mean(part, 'direct')[0]:.3f}.")
    for row in ranks.itertuples():
        lines.append(f"**Exact vs attribution** ({row.kind}, {row.heads} heads): Spearman {row.spearman:.3f}, "
                     f"Kendall tau-b {row.kendall_tau_b:.3f}; the top heads by exact patching are {row.top_exact_heads} "
                     f"({row.top_exact_in_vrhs:.0%} of them are VRHs).")
    return lines


def study_markdown(study: PatchingStudy, title: str, preamble: Sequence[str] = ()) -> str:
    """The study as Markdown: numeric answers first, then every table."""
    out = [f"# {title}", "", *preamble, "", "## Answers (numbers from the tables below)", ""]
    out += [f"- {line}" for line in answers(study)]
    for name, table in study.tables.items():
        out += ["", f"## Table: {name}", "", markdown_table(table)]
    return "\n".join(out) + "\n"


def detect_and_study(vlm: VLM, out: Path, *, detect_scenes: int = 200, top: int = 3, vrhs: HeadSet | None = None,
                     pairs_per_kind: int = 48, probe_scenes: int = 120, random_seeds: Sequence[int] = (0, 1, 2),
                     targets: str = "greedy", progress: bool = True) -> PatchingStudy:
    """Detect the VRHs on ``detect`` scenes (unless given), run the study on ``eval`` scenes, save it in ``out``.

    Rerunning with the same arguments returns the finished run from ``out``, or resumes an interrupted one
    (detection batch by batch, the study part by part from ``out/parts``); other arguments are refused.
    """
    from vrh_interp.provenance import library_versions, model_provenance
    from vrh_interp.runs import RunMismatchError
    from vrh_interp.scoring.detect import score_heads
    from vrh_interp.sources import synthetic_samples

    config = {"model": model_provenance(vlm), "detect_scenes": detect_scenes, "top": top,
              "vrhs": [str(h) for h in vrhs] if vrhs is not None else None, "pairs_per_kind": pairs_per_kind,
              "probe_scenes": probe_scenes, "random_seeds": list(random_seeds), "targets": targets}
    comparable = json.loads(json.dumps(config, default=str))
    if (out / "patching.json").exists():
        previous = json.loads((out / "patching.json").read_text()).get("config")
        if json.loads(json.dumps(previous, default=str)) != comparable:
            raise RunMismatchError(f"{out} holds a patching run with other settings; use another --out or delete it")
        return PatchingStudy.load(out)
    parts_config = out / "parts" / "config.json"
    if parts_config.exists() and json.loads(parts_config.read_text()) != comparable:
        raise RunMismatchError(f"{out} holds an unfinished patching run with other settings; use another --out or "
                               "delete it")
    parts_config.parent.mkdir(parents=True, exist_ok=True)
    parts_config.write_text(json.dumps(comparable, indent=1))
    started = time.time()
    detected = vrhs is None
    if vrhs is None:
        scores = score_heads(vlm, synthetic_samples("detect", detect_scenes), run_dir=out / "detect",
                             dataset=f"synthetic:detect:{detect_scenes}", progress=progress)
        vrhs = scores.top(top)
    study = run_patching_study(vlm, vrhs, pairs_per_kind=pairs_per_kind, probe_scenes=probe_scenes,
                               random_seeds=random_seeds, targets=targets, progress=progress, parts_dir=out / "parts")
    study.facts["seconds"] = time.time() - started
    study.facts["vrhs_from"] = f"top {top} of preset vrh on {detect_scenes} detect scenes" if detected else "given"
    provenance = {"model": model_provenance(vlm), "versions": library_versions(), "vrhs": [str(h) for h in vrhs],
                  "vrhs_from": study.facts["vrhs_from"]}
    study.save(out, provenance, config)
    (out / "patching.md").write_text(study_markdown(study, f"Activation patching: {vlm.model_id}"), encoding="utf-8")
    return study
