"""Regenerate docs/results/localize.md: attention boxes (Localization-Heads recipe) beside the generated boxes.

    python docs/_generate_localize.py [--out runs/localize-results]

Every number on the page is measured here by ``vrh_interp.experiments.localize`` on the shipped checkpoints: on
toy:planted the planted heads (declared before training), the top-3 of the default VRH score and the two decoys; on
toy A the top-3 of the VRH score and of the ``localization_heads`` preset (one detection pass scores both). Each head
set's attention box is scored against the ground truth beside the model's own greedy box on the same items, under
three readouts. The run folders resume; the page is never edited by hand.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pandas as pd

from vrh_interp.core.bookkeeping.provenance import library_versions
from vrh_interp.data import grounding_samples
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.evaluation.attention_box import BoxReadout, attention_boxes
from vrh_interp.experiments.localize import LocalizeResult, localize
from vrh_interp.experiments.positive_control import declared, load_planted
from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats
from vrh_interp.specs import load_spec
from vrh_interp.viz.tables import markdown_table

HERE = Path(__file__).resolve().parent
EVAL_SCENES = 30  # every level-1 referent of eval scenes 0..29
DETECT_SAMPLES = 40
K = 3
READOUTS = {
    "sigma 1, mean, largest (default)": BoxReadout(),
    "sigma 0, mean, largest": BoxReadout(sigma=0.0),
    "sigma 0, answer rows": BoxReadout(sigma=0.0, query="output"),
}
COLUMNS = ["model", "heads", "readout", "n", "heads_acc", "answer_acc", "both", "heads_only", "answer_only",
           "neither", "mcnemar_p", "heads_mean_iou", "answer_mean_iou", "area_ratio"]


def _eval_items(n_scenes: int) -> list:
    return [s for i in range(n_scenes) for s in grounding_samples("eval", i, 1)]


def _runs(vlm, name: str, samples: list, sets: dict, out: Path) -> tuple[pd.DataFrame, dict[str, LocalizeResult]]:
    rows, results = [], {}
    for label, readout in READOUTS.items():
        slug = label.split(" (")[0].replace(", ", "-").replace(" ", "")
        result = localize(vlm, samples, sets, readout, batch_size=64, run_dir=out / f"{name}-{slug}", progress=False)
        results[label] = result
        items = result.items()
        ratio = [float("nan") if b is None else (b[2] - b[0]) * (b[3] - b[1]) / ((t[2] - t[0]) * (t[3] - t[1]))
                 for b, t in zip(items["heads_box"], items["truth"])]
        medians = items.assign(ratio=ratio).groupby("heads", sort=False)["ratio"].median()
        summary = result.summary()
        rows.append(summary.assign(model=name, readout=label, area_ratio=summary["heads"].map(medians)))
    return pd.concat(rows, ignore_index=True)[COLUMNS], results


def _figure(vlm, samples: list, result: LocalizeResult, heads: str, path: Path) -> str:
    """One item where the attention box is right and the generated box is not (else the first item): the image,
    the three boxes and the painted attention."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    items = result.items()
    items = items[items["heads"] == heads].reset_index(drop=True)
    chosen = items.index[items["outcome"] == "heads_only"]
    index = int(chosen[0]) if len(chosen) else 0
    sample = samples[index]
    batch = vlm.encode_grounding([sample.image], [sample.expression])
    found = attention_boxes(vlm, batch, result.head_sets[heads], result.readout)[0]
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.6))
    axes[0].imshow(sample.image)
    boxes = [(items.loc[index, "truth"], "green", "ground truth"), (items.loc[index, "answer_box"], "tab:blue",
                                                                    "generated"),
             (items.loc[index, "heads_box"], "tab:red", "attention")]
    for box, colour, name in boxes:
        if box is not None:
            x1, y1, x2, y2 = box
            axes[0].add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, color=colour, lw=2, label=name))
    axes[0].legend(loc="lower left", fontsize=7)
    axes[0].set_title(f"{sample.expression!r}", fontsize=8)
    x0, y0, x1, y1 = found.canvas.region
    axes[1].imshow(found.grid, extent=(x0, x1, y1, y0), cmap="magma")
    axes[1].set_title(f"{heads}: attention of the last prompt row", fontsize=8)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return items.loc[index, "outcome"]


def generate(out: Path) -> Path:
    planted_vlm = load_planted()
    planted, decoys = declared()
    samples = _eval_items(EVAL_SCENES)
    detect = synthetic_samples("detect", DETECT_SAMPLES)
    stats = collect_detection_stats(planted_vlm, detect, batch_size=64, run_dir=out / "planted-detect",
                                     progress=False)
    planted_top = scores_from_stats(stats, "vrh").top(K)
    planted_sets = {"planted": planted, f"vrh top-{K}": planted_top, "decoys": decoys}
    planted_table, planted_results = _runs(planted_vlm, "toy:planted", samples, planted_sets, out)
    toy_a = load_spec("toy:a")
    stats = collect_detection_stats(toy_a, detect, batch_size=64, run_dir=out / "a-detect", progress=False)
    a_sets = {f"vrh top-{K}": scores_from_stats(stats, "vrh").top(K),
              f"localization_heads top-{K}": scores_from_stats(stats, "localization_heads").top(K)}
    a_table, _ = _runs(toy_a, "toy:a", samples, a_sets, out)
    figures = HERE / "results" / "localize-figures"
    if figures.exists():
        shutil.rmtree(figures)
    shown = _figure(planted_vlm, samples, planted_results["sigma 0, mean, largest"], "planted",
                    figures / "planted_item.png")
    page = HERE / "results" / "localize.md"
    page.write_text(_page(pd.concat([planted_table, a_table], ignore_index=True), {"toy:planted": planted_sets,
                                                                                   "toy:a": a_sets},
                          len(samples), planted_results, shown), encoding="utf-8")
    return page


def _four_way(result: LocalizeResult, label: str) -> str:
    table = result.four_way(label).reset_index().rename(columns={"index": ""})
    return markdown_table(table)


def _page(table: pd.DataFrame, head_sets: dict, n: int, planted_results: dict, shown: str) -> str:
    versions = library_versions()
    shown_versions = ", ".join(f"{k} {versions[k]}" for k in ("vrh-interp", "torch", "transformers") if k in versions)
    sets_line = "; ".join(f"{model}: " + ", ".join(f"{k} = {' '.join(v.to_list())}" for k, v in sets.items())
                          for model, sets in head_sets.items())
    formatted = table.copy()
    for column in ("heads_acc", "answer_acc", "heads_mean_iou", "answer_mean_iou", "area_ratio"):
        formatted[column] = formatted[column].map(lambda v: f"{v:.3f}")
    formatted["mcnemar_p"] = formatted["mcnemar_p"].map(lambda v: f"{v:.3g}")
    default = planted_results["sigma 0, mean, largest"]
    lines = [
        "# Attention boxes beside generated boxes",
        "",
        f"Generated by `python docs/_generate_localize.py` ({shown_versions}). Localization Heads (Kang et al., CVPR "
        "2025) read a box from a few heads' attention over the image (Gaussian smoothing, sum over the heads, cells "
        "above the mean, the enclosing rectangle of a component) and report RefCOCO Acc@0.5 86.5 / 89.8 / 80.2 on "
        "LLaVA-1.5-7B without training, but never beside the same model's own generated boxes, and on a square grid "
        "only. Here both are scored on the same items (`vrh localize`, `vrh_interp.experiments.localize`; the box "
        "readout `vrh_interp.evaluation.attention_box` runs on every family's visual layout, tiled and non-square "
        "grids included). An item's attention box is right when its IoU with the referent's box is >= 0.5, and so is "
        "its generated box; `heads_only` counts the items where the heads know where the referent is and the answer "
        "says otherwise.",
        "",
        f"Items: every level-1 referent of eval scenes 0-{EVAL_SCENES - 1} ({n} items, the same for every row). "
        f"Head sets: {sets_line} (top-{K} of each score on {DETECT_SAMPLES} detection samples, disjoint from the "
        "items). Readouts: the last prompt row's attention (or the mean over the rows of the model's answer), summed "
        "over the heads, smoothed by a Gaussian of sigma cells (0: none), cells above the map's mean, the largest "
        "8-connected component. `mcnemar_p`: exact two-sided McNemar test of the two accuracies on the same items; "
        "`area_ratio`: the median area of the attention box over the referent's.",
        "",
        "## Acc@0.5 of the attention box and of the generated box",
        "",
        formatted.to_markdown(index=False, disable_numparse=True),
        "",
        "## Four-way table: toy:planted, the planted heads, sigma 0",
        "",
        _four_way(default, "planted"),
        "",
        f"![an item]({'localize-figures/planted_item.png'})",
        "",
        f"The figure shows one item ({shown.replace('_', '-')}): the ground truth (green), the generated box (blue) "
        "and the planted heads' attention box (red), and their painted attention.",
        "",
        "## Reading",
        "",
    ]
    lines += _reading(table)
    return "\n".join(lines) + "\n"


def _reading(table: pd.DataFrame) -> list[str]:
    def row(model: str, heads: str, readout: str) -> pd.Series:
        return table[(table["model"] == model) & (table["heads"] == heads) & (table["readout"] == readout)].iloc[0]

    smooth, sharp = row("toy:planted", "planted", list(READOUTS)[0]), row("toy:planted", "planted", list(READOUTS)[1])
    decoy = row("toy:planted", "decoys", list(READOUTS)[1])
    vrh_a, lh_a = row("toy:a", f"vrh top-{K}", list(READOUTS)[1]), row("toy:a", f"localization_heads top-{K}",
                                                                       list(READOUTS)[1])
    vrh_a_out = row("toy:a", f"vrh top-{K}", list(READOUTS)[2])
    lh_a_out = row("toy:a", f"localization_heads top-{K}", list(READOUTS)[2])
    return [
        f"- On toy:planted the planted heads' attention box reaches Acc@0.5 {sharp['heads_acc']:.3f} without "
        f"smoothing against {sharp['answer_acc']:.3f} for the model's own box ({sharp['heads_only']} items "
        f"heads-only, {sharp['answer_only']} answer-only, McNemar p = {sharp['mcnemar_p']:.3g}); the decoys, which "
        f"attend to other objects, reach {decoy['heads_acc']:.3f}.",
        f"- Smoothing with sigma = 1 cell drops it to {smooth['heads_acc']:.3f}: on these 12 x 12 grids a referent "
        "covers 2-3 cells and the planted heads' attention sits on them almost entirely, so the Gaussian spreads the "
        "map and the cells above the mean enclose more than the object. The sigma that suits a 24 x 24 grid of "
        "LLaVA-1.5 is not a constant of the method: it is in cells, and objects here are few cells wide.",
        f"- The boxes say why: with sigma = 1 the planted heads' box is {smooth['area_ratio']:.1f} times the "
        f"referent's area (median), without smoothing {sharp['area_ratio']:.1f} times.",
        f"- On toy A (no planted heads; its answers are right on {vrh_a['answer_acc']:.3f} of the items) the top-3 "
        f"heads of neither score localize from the last prompt row: Acc@0.5 {vrh_a['heads_acc']:.3f} (VRH score) and "
        f"{lh_a['heads_acc']:.3f} (localization_heads preset) without smoothing; from the answer rows "
        f"{vrh_a_out['heads_acc']:.3f} and {lh_a_out['heads_acc']:.3f}. Their boxes are {vrh_a['area_ratio']:.1f} and "
        f"{lh_a['area_ratio']:.1f} times the referent's area (median, last prompt row, no smoothing): heads that rank "
        "high on a score need not draw the referent's box on this model.",
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/localize-results"))
    print(generate(parser.parse_args().out))
