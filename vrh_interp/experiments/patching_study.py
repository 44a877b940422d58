"""The activation-patching study: what do the detected VRHs read out and write? One call, tables out.

Metric: by default the whole answer (``log P(clean box) - log P(corrupted box)``, every box token
teacher-forced, split per coordinate); ``metric="first_token"`` measures the first differing token only
(``vrh_interp.patching.batch``). Every table carries the metric it used.

Questions and the measurement that answers each (all on held-out ``eval`` scenes, disjoint from the
``detect`` scenes the VRHs were scored on; controls are head sets of the same size drawn outside the VRHs,
``vrh_interp.patching.controls``: 20 random and 20 layer-matched sets by default, and every same-size set
where the head count allows, exactly or from single-head values with a measured additivity check):

1. Do the VRHs' outputs carry the referent's LOCATION? Patch the VRH outputs clean -> corrupted on
   ``referent_moved`` pairs (same words, object elsewhere): recovery, per coordinate, its rank and tail
   probability among the controls, and the box the patched model then generates (IoU with the clean box).
   Plus linear probes of the box from the heads' outputs (``probes``), against the same kinds of sets.
2. Its ATTRIBUTES? The same on ``referent_recoloured`` pairs (the colour named now belongs to another
   object), and colour/shape probes.
3. From which POSITIONS? Key/value patching of each VRH at the referent, the distractors, the background
   and the text (``positions``), on ``referent_moved`` and ``expression_swap`` pairs.
4. How much of the effect is DIRECT? Direct vs total effect (``mediation``), VRHs vs the control sets.
5. Which heads matter most by patching, and can attribution patching stand in for it? Every head exactly
   vs gradient and integrated-gradients attribution, compared on the heads exact patching ranks first
   (``attribution.compare_attribution``); overlap of the top heads with the VRHs.

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
from vrh_interp.evaluation.statistics import empirical_p_value
from vrh_interp.evaluation.controls import DEFAULT_RANDOM_SEEDS
from vrh_interp.core.execution.backends.base import backend_config, check_supported
from vrh_interp.core.execution.backends.select import backend_for, backend_type
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.viz.tables import markdown_table
from vrh_interp.patching.attribution import ATTRIBUTION_METHODS, attribution_patching, compare_attribution
from vrh_interp.patching.batch import GROUPS, METRIC_LABELS, baseline, prepare_pairs
from vrh_interp.patching.controls import compare_with_controls
from vrh_interp.patching.head_patching import patch_each_head, patch_head_set, patched_answers
from vrh_interp.patching.mediation import mediation_table
from vrh_interp.patching.pairs import make_pairs
from vrh_interp.patching.positions import position_patching
from vrh_interp.patching.probes import comparison_head_sets, readout_probes, summarise_random


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
ANSWER_SEEDS = 3  # free generation (patched_answers) for the VRHs, all heads and this many random sets: it is slow
MEDIATION_SEEDS = 10  # direct effects for the VRHs and this many random and layer-matched sets each


def _kind_tables(vlm: VLM, kind: str, vrhs: HeadSet, *, pairs_per_kind: int, targets: str, metric: str,
                 random_seeds: Sequence[int], progress: bool) -> dict[str, pd.DataFrame]:
    """Every measurement on one kind of pair (questions 1-5 where they apply)."""
    pairs = prepare_pairs(vlm, make_pairs(kind, pairs_per_kind), targets=targets, metric=metric)
    base = baseline(vlm, pairs)
    gaps = (base.clean_parts - base.corrupted_parts).mean(axis=0)
    tables = {"pairs": pd.DataFrame([{"kind": kind, "metric": pairs.metric, "pairs": pairs.n + len(pairs.excluded),
                                      "kept": pairs.n, "excluded": len(pairs.excluded),
                                      "clean_metric": float(np.mean(base.clean)),
                                      "corrupted_metric": float(np.mean(base.corrupted)),
                                      **{f"gap_{name}": float(gap) for name, gap in zip(GROUPS, gaps)}}])}
    exact = patch_each_head(vlm, pairs, base=base, progress=progress)
    comparison = compare_with_controls(vlm, pairs, vrhs, random_seeds=random_seeds, single=exact, base=base,
                                       progress=progress)
    every = {"head_set": "all", "set_kind": "all", "heads": "all",
             **patch_head_set(vlm, pairs, vlm.geometry.all_heads(), base=base)}
    tables["head_set_patching"] = pd.concat([comparison.sets.rename(columns={"kind": "set_kind"}),
                                             pd.DataFrame([every])], ignore_index=True).assign(kind=kind)
    tables["set_distribution"] = comparison.summary.assign(
        kind=kind, metric=pairs.metric, additivity_sets=comparison.additivity.get("sets_checked", 0),
        additivity_max_abs_error=comparison.additivity.get("max_abs_error", float("nan")),
        additivity_pearson=comparison.additivity.get("pearson", float("nan")))
    sets = comparison_head_sets(vrhs, vlm.geometry, random_seeds=tuple(random_seeds), include_all=True, matched=True)
    answer_rows = []
    for name in ["vrh", "all"] + [f"random:seed={seed}" for seed in list(random_seeds)[:ANSWER_SEEDS]]:
        answers = patched_answers(vlm, pairs, sets[name])
        answer_rows.append({"kind": kind, "head_set": name, "heads": len(sets[name]),
                            "iou_clean_box": float(answers["iou_clean_box"].mean()),
                            "hit_clean_box": float((answers["iou_clean_box"] >= 0.5).mean()),
                            "iou_corrupted_box": float(answers["iou_corrupted_box"].mean()),
                            "same_as_clean_answer": float((answers["patched_answer"]
                                                           == answers["clean_answer"]).mean()),
                            "parsed": float(answers["parsed"].mean()), "n_pairs": pairs.n})
    tables["patched_answers"] = pd.DataFrame(answer_rows)
    if kind in ("referent_moved", "expression_swap"):
        tables["position_patching"] = position_patching(vlm, pairs, list(vrhs), base=base).assign(kind=kind,
                                                                                                   metric=pairs.metric)
    if kind in ("referent_moved", "expression_swap", "referent_recoloured"):
        chosen = ["vrh"] + [f"{k}:seed={seed}" for k in ("random", "matched")
                            for seed in list(random_seeds)[:MEDIATION_SEEDS]]
        tables["mediation"] = mediation_table(vlm, pairs, {name: sets[name] for name in chosen}).assign(kind=kind)
    rankings, each = [], exact.frame.assign(kind=kind)
    top = exact.frame.nlargest(len(vrhs), "recovery")["head"].tolist()
    for method in ATTRIBUTION_METHODS:
        estimate = attribution_patching(vlm, pairs, base=base, method=method)
        rankings.append({"kind": kind, **compare_attribution(exact, estimate), "top_exact_heads": " ".join(top),
                         "top_exact_in_vrhs": len(set(top) & {str(h) for h in vrhs}) / len(vrhs)})
        each = each.merge(estimate.frame[["head", "recovery"]].rename(columns={"recovery": f"recovery_{method}"}),
                          on="head")
    tables["rankings"] = pd.DataFrame(rankings)
    tables["each_head"] = each
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
                       random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, targets: str = "greedy",
                       metric: str = "answer", progress: bool = True, parts_dir: Path | None = None) -> PatchingStudy:
    """Run questions 1-5 of the module docstring on ``vlm`` with ``vrhs`` (detected on other scenes).

    With ``parts_dir``, each pair kind and the probes are saved there as they finish and read back on a rerun,
    so an interrupted study loses at most the part it was in (the caller checks the settings match).
    """
    parts = [_part(parts_dir, kind, lambda kind=kind: _kind_tables(
        vlm, kind, vrhs, pairs_per_kind=pairs_per_kind, targets=targets, metric=metric,
        random_seeds=random_seeds, progress=progress)) for kind in PAIR_KINDS_STUDIED]
    samples = [s for index in range(probe_scenes) for s in grounding_samples("eval", index, difficulty=1)]
    probes = _part(parts_dir, "probes", lambda: {"probes": readout_probes(vlm, samples, vrhs, matched=True,
                                                                          random_seeds=tuple(random_seeds))})
    study = PatchingStudy()
    for table in ("pairs", "head_set_patching", "set_distribution", "patched_answers", "position_patching",
                  "mediation", "rankings", "each_head"):
        study.tables[table] = pd.concat([part[table] for part in parts if table in part], ignore_index=True)
    study.tables["probes"] = probes["probes"]
    study.tables["probe_summary"] = summarise_random(probes["probes"])
    study.facts = {"vrhs": [str(h) for h in vrhs], "pairs_per_kind": pairs_per_kind, "targets": targets,
                   "metric": metric, "metric_label": METRIC_LABELS[metric], "probe_samples": len(samples),
                   "random_seeds": list(random_seeds)}
    return study


def _ci(row: Any, value: str = "recovery", low: str = "ci_low", high: str = "ci_high") -> str:
    return f"{row[value]:.3f} [{row[low]:.3f}, {row[high]:.3f}]"


def _random_mean(frame: pd.DataFrame, column: str) -> tuple[float, float, float]:
    """Mean, min and max of ``column`` over the random head sets."""
    values = frame[frame["head_set"].str.startswith("random")][column]
    return float(values.mean()), float(values.min()), float(values.max())


TAIL_ALPHA = 0.05  # the VRH set "exceeds" a population when at most this share of it recovers as much


def _population_text(row: Any) -> str:
    if row["method"] == "not enumerated":
        return f"{row['population']}: too many to enumerate"
    if row["population"].startswith("all "):
        bounds = (f" (bounds from the additivity error: {row['tail_low']:.4f} to {row['tail_high']:.4f})"
                  if row["method"] == "additive" else "")
        return (f"{row['population']} of the non-VRH heads ({row['method']}): {row['tail_p']:.4f} of them recover "
                f"at least as much{bounds}, VRH rank {int(row['rank'])}, max {row['max']:.3f}")
    return (f"{int(row['sets'])} {row['population']} sets: mean {row['mean']:.3f}, 95% quantile {row['q95']:.3f}, "
            f"max {row['max']:.3f}, VRH rank {int(row['rank'])} of {int(row['sets']) + 1}, p = {row['tail_p']:.3f}")


def _exceeds(summary: pd.DataFrame) -> str:
    """Fixed rule: the VRHs exceed the controls when every population's tail (the additive census: its upper
    bound) is <= ``TAIL_ALPHA``."""
    failing = []
    for row in summary.itertuples():
        if row.method == "not enumerated":
            continue
        tail = row.tail_high if row.method == "additive" else row.tail_p
        if not tail <= TAIL_ALPHA:
            failing.append(f"{row.population} (tail {tail:.3f})")
    return ("more than the controls (every population's tail <= 0.05)" if not failing
            else "NOT more than the controls: " + "; ".join(failing))


def headline(study: PatchingStudy) -> pd.DataFrame:
    """One row per pair kind, numbers of the study's own tables: the VRH set's recovery and its CI, all heads'
    recovery, the random and layer-matched populations' mean, the VRHs' rank among them (1 + sets recovering at
    least as much, of ``sets``) and tail p, and the verdict of the fixed rule of ``answers``."""
    sets, dist = study.tables["head_set_patching"], study.tables["set_distribution"]
    rows = []
    for kind in sets["kind"].unique():
        part = sets[sets["kind"] == kind]
        vrh, every = part[part["head_set"] == "vrh"].iloc[0], part[part["head_set"] == "all"].iloc[0]
        populations = dist[dist["kind"] == kind]
        row = {"kind": kind, "metric": vrh["metric"], "heads": vrh["heads"], "n_pairs": int(vrh["n_pairs"]),
               "recovery": float(vrh["recovery"]), "ci_low": float(vrh["ci_low"]), "ci_high": float(vrh["ci_high"]),
               "all_heads": float(every["recovery"])}
        for control in ("random", "matched"):
            found = populations[populations["population"] == control]
            population = found.iloc[0] if len(found) else None
            row[f"{control}_mean"] = float(population["mean"]) if population is not None else float("nan")
            row[f"{control}_rank"] = int(population["rank"]) if population is not None else None
            row[f"{control}_sets"] = int(population["sets"]) if population is not None else 0
            row[f"{control}_p"] = float(population["tail_p"]) if population is not None else float("nan")
        row["verdict"] = _exceeds(populations)
        rows.append(row)
    return pd.DataFrame(rows)


def answers(study: PatchingStudy) -> list[str]:
    """One numeric sentence per question of the module docstring, worded by fixed rules (tail probabilities
    against the control populations, attribution's agreement on the top exact heads)."""
    t = study.tables
    sets, dist, gen, med, pos, ranks = (t["head_set_patching"], t["set_distribution"], t["patched_answers"],
                                        t["mediation"], t["position_patching"], t["rankings"])
    summary = t["probe_summary"]
    metric = study.facts.get("metric", "answer")
    lines = [f"Metric: {METRIC_LABELS[metric]}."]

    def patch_line(kind: str, what: str) -> str:
        part = sets[sets["kind"] == kind]
        vrh = part[part["head_set"] == "vrh"].iloc[0]
        every = part[part["head_set"] == "all"].iloc[0]
        populations = dist[dist["kind"] == kind]
        coordinates = ", ".join(f"{name} {vrh[f'recovery_{name}']:.3f}" for name in GROUPS[:4])
        shares = ", ".join(f"{name} {vrh[f'share_{name}']:.3f}" for name in GROUPS)
        check = populations.iloc[0]
        additivity = (f" Additivity check on {int(check['additivity_sets'])} sets patched exactly: max |exact - sum of "
                      f"single heads| {check['additivity_max_abs_error']:.3f}, Pearson "
                      f"{check['additivity_pearson']:.3f}." if check["additivity_sets"] else "")
        g = gen[gen["kind"] == kind]
        g_vrh = g[g["head_set"] == "vrh"].iloc[0]
        g_mean, _, _ = _random_mean(g, "hit_clean_box")
        return (f"**{what}** ({kind}, {int(vrh['n_pairs'])} pairs): patching the {len(str(vrh['heads']).split())} VRHs "
                f"clean -> corrupted recovers {_ci(vrh)} (all heads {every['recovery']:.3f}); per coordinate "
                f"(own recovery) {coordinates}; share of the whole gap {shares}. Against same-size sets: "
                + "; ".join(_population_text(row) for _, row in populations.iterrows())
                + f". Verdict: {_exceeds(populations)}.{additivity} In free generation the patched model then boxes "
                f"the clean referent (IoU >= 0.5) in {g_vrh['hit_clean_box']:.3f} of pairs "
                f"({int(g['head_set'].str.startswith('random').sum())} random sets: {g_mean:.3f}; "
                f"all heads: {g[g['head_set'] == 'all'].iloc[0]['hit_clean_box']:.3f}).")

    def probe_line(targets: Sequence[str]) -> str:
        cells = []
        for target in targets:
            row = summary[summary["target"] == target]
            if not len(row):
                continue
            row = row.iloc[0]
            cells.append(f"{target} {row['metric_name']} VRHs {row['vrh']:.3f} vs {int(row['random_sets'])} random "
                         f"sets mean {row['random_mean']:.3f} (max {row['random_max']:.3f}, "
                         f"p = {row['p_vs_random']:.3f}), "
                         f"{int(row['matched_sets'])} layer-matched mean {row['matched_mean']:.3f} "
                         f"(p = {row['p_vs_matched']:.3f}), all heads {row['all']:.3f}, chance {row['chance']:.3f}")
        return "; ".join(cells)

    lines.append(patch_line("referent_moved", "Location"))
    lines.append("Linear probes of the referent's box from the heads' outputs at the last prompt position: "
                 + probe_line(("box_cx", "box_cy")) + ".")
    lines.append(patch_line("referent_recoloured", "Attributes"))
    named = t["probes"][(t["probes"]["target"] == "colour") & (t["probes"]["head_set"] == "vrh")]
    named_text = f" (the query names the colour in {named.iloc[0]['named_rate']:.0%} of samples)" if len(named) else ""
    lines.append("Colour and shape probes: " + probe_line(("colour", "shape")) + named_text + ".")
    for kind in ("expression_swap", "different_image"):
        if (sets["kind"] == kind).any():
            lines.append(patch_line(kind, "Which object" if kind == "expression_swap" else "Another image"))
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
        lines.append(f"**Positions** ({kind}, keys+values of one head patched at one region): "
                     + "; ".join(cells) + ".")
    for kind in med["kind"].unique():
        part = med[med["kind"] == kind]
        vrh = part[part["head_set"] == "vrh"].iloc[0]
        share = vrh["direct"] / vrh["total"] if vrh["total"] else float("nan")
        cells = []
        for control in ("random", "matched"):
            values = part[part["head_set"].str.startswith(control + ":")]["direct"].to_numpy(dtype=float)
            if len(values):
                cells.append(f"{len(values)} {control} sets direct mean {values.mean():.3f}, max {values.max():.3f}, "
                             f"p = {empirical_p_value(-vrh['direct'], -values):.3f}")
        lines.append(f"**Direct vs total** ({kind}): VRHs total {vrh['total']:.3f}, direct "
                     f"{_ci(vrh, 'direct', 'direct_ci_low', 'direct_ci_high')}, indirect {vrh['indirect']:.3f} "
                     f"(direct share {share:.2f}); " + "; ".join(cells) + ".")
    for row in ranks.itertuples():
        name = "gradient" if row.method == "gradient" else "integrated-gradients"
        lines.append(f"**Exact vs {name} attribution** ({row.kind}): on the top {row.top_k} heads by exact recovery "
                     f"({row.top_k_heads}) Spearman {row.top_k_spearman:.3f}, top-{row.top_k} overlap "
                     f"{row.top_k_overlap:.2f}, estimate/exact ratio median {row.ratio_median:.2f} (range "
                     f"{row.ratio_min:.2f} to {row.ratio_max:.2f}); the top exact head {row.best_exact_head} is ranked "
                     f"{row.best_exact_rank_by_estimate} by the estimate; over all {row.heads} heads Spearman "
                     f"{row.spearman:.3f}. Safe substitute for exact patching: {row.safe_substitute}. The top "
                     f"{len(str(row.top_exact_heads).split())} heads by exact patching are {row.top_exact_heads} "
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
                     pairs_per_kind: int = 48, probe_scenes: int = 120,
                     random_seeds: Sequence[int] = DEFAULT_RANDOM_SEEDS, targets: str = "greedy",
                     metric: str = "answer", progress: bool = True) -> PatchingStudy:
    """Detect the VRHs on ``detect`` scenes (unless given), run the study on ``eval`` scenes, save it in ``out``.

    The handle's backend (``vlm.on(backend=...)``) must run the whole study (``OPERATIONS["patching"]``: the
    row-pair patches, mediation, attribution gradients and probes are nnsight templates): one that cannot is refused
    before any work (``check_supported``), so no study mixes backends. ``facts["backend"]`` names it.

    Rerunning with the same arguments returns the finished run from ``out``, or resumes an interrupted one
    (detection batch by batch, the study part by part from ``out/parts``); other arguments are refused.
    """
    from vrh_interp.core.bookkeeping.provenance import library_versions, model_provenance
    from vrh_interp.core.description.published import PublishedHeadSet, check_geometry
    from vrh_interp.core.bookkeeping.runs import RunMismatchError
    from vrh_interp.scoring.detect import score_heads
    from vrh_interp.data.sources import synthetic_samples

    check_supported(backend_type(vlm), operations=["patching"])
    runner = backend_for(vlm)
    if vrhs is not None:  # a published set that does not fit fails here, naming both grids
        check_geometry(vrhs, vlm.geometry)
    config = {"model": model_provenance(vlm), "detect_scenes": detect_scenes, "top": top,
              "vrhs": [str(h) for h in vrhs] if vrhs is not None else None, "pairs_per_kind": pairs_per_kind,
              "probe_scenes": probe_scenes, "random_seeds": list(random_seeds), "targets": targets, "metric": metric,
              **backend_config(runner)}  # nnsight runs keep the configurations they had before backends existed
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
                               random_seeds=random_seeds, targets=targets, metric=metric, progress=progress,
                               parts_dir=out / "parts")
    study.facts["seconds"] = time.time() - started
    study.facts["backend"] = runner.name
    study.facts["vrhs_from"] = (f"top {top} of preset vrh on {detect_scenes} detect scenes" if detected else
                                f"transferred: {vrhs.source.spec}, {vrhs.source.describe()}"
                                if isinstance(vrhs, PublishedHeadSet) else "given")
    provenance = {"model": model_provenance(vlm), "versions": library_versions(), "vrhs": [str(h) for h in vrhs],
                  "vrhs_from": study.facts["vrhs_from"]}
    study.save(out, provenance, config)
    (out / "patching.md").write_text(study_markdown(study, f"Activation patching: {vlm.model_id}"), encoding="utf-8")
    return study


def run(spec: Any, vlm: VLM, folder: Path) -> PatchingStudy:
    """``vrh patch`` / a grid's patching cell (``builtin_specs.PatchSpec``): ``detect_and_study`` on the given heads,
    the top ``top`` of the scores file, or heads detected here (``top`` defaults to the demo's k*)."""
    from vrh_interp.core.description.published import parse_heads
    from vrh_interp.experiments.ks import demo_ks
    from vrh_interp.scoring.scores import HeadScores

    top = spec.top if spec.top is not None else demo_ks(vlm.geometry.total_heads)[1]
    heads = parse_heads(spec.vrhs) if spec.vrhs else (HeadScores.load(spec.scores).top(top) if spec.scores else None)
    return detect_and_study(vlm, folder, detect_scenes=spec.detect, top=top, vrhs=heads, pairs_per_kind=spec.pairs,
                            probe_scenes=spec.probe_scenes, random_seeds=spec.control_seeds(), targets=spec.targets,
                            metric=spec.metric, progress=spec.progress)
