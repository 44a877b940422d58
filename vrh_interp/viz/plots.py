"""Figures (matplotlib, headless-safe). One convention for every plotting call: it returns a figure, and takes
``ax=`` (an Axes; several for a multi-panel figure) to draw into the caller's figure and return that figure instead.

A figure the library makes is a ``Figure`` (a matplotlib ``Figure`` with ``_repr_png_``): a notebook cell ending in
it shows the picture in a fresh kernel without ``%matplotlib inline``. It is never registered with pyplot, so
``plt.show()`` and the inline backend do not show it a second time, and a script shows nothing."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure as _MatplotlibFigure


class Figure(_MatplotlibFigure):
    """A matplotlib ``Figure`` that displays itself in a notebook as a PNG (module doc)."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()


def _figure(width: float = 6.0, height: float = 4.0, ax: Any = None) -> tuple[Any, Any, bool]:
    """(figure, axes, whether the figure is ours): ``ax`` and its figure, or a new ``Figure`` with one Axes."""
    if ax is not None:
        if not hasattr(ax, "imshow") or isinstance(ax, (list, tuple, np.ndarray)):
            raise TypeError(f"ax= takes one matplotlib Axes, got {type(ax).__name__}")
        return ax.figure, ax, False
    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.add_subplot(1, 1, 1), True


def _panels(count: int, ax: Any, width: float, height: float, **subplots: Any) -> tuple[Any, list[Any], bool]:
    """(figure, ``count`` axes, ours): the caller's axes (a sequence of ``count``), or a new constrained-layout
    ``Figure`` with ``count`` panels in a row (``subplots``: ``Figure.subplots`` options)."""
    if ax is not None:
        axes = list(np.ravel(np.asarray(ax, dtype=object)))
        if len(axes) != count or not all(hasattr(a, "imshow") for a in axes):
            raise ValueError(f"ax= takes {count} matplotlib Axes here (one per panel), got {len(axes)} object(s)")
        return axes[0].figure, axes, False
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, list(fig.subplots(1, count, squeeze=False, **subplots)[0]), True


def _done(fig: Any, own: bool) -> Any:
    """Lay out a figure we made (a caller's figure keeps its own layout) and return it."""
    if own:
        fig.tight_layout()
    return fig


def score_heatmap(scores: np.ndarray, title: str = "head scores", *, ax: Any = None) -> Any:
    """Layer x head heatmap of a score table."""
    fig, ax, own = _figure(max(4.0, scores.shape[1] * 0.35 + 2), max(3.0, scores.shape[0] * 0.35 + 1.5), ax)
    image = ax.imshow(scores, aspect="auto", cmap="viridis", origin="lower")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
    return _done(fig, own)


def score_distribution(scores: np.ndarray, thresholds: tuple[float, ...] = (1e-3, 5e-3), *, ax: Any = None) -> Any:
    """Sorted score curve with the paper's sparsity thresholds."""
    fig, ax, own = _figure(ax=ax)
    ordered = np.sort(scores.ravel())[::-1]
    ax.plot(np.arange(1, len(ordered) + 1), ordered, marker=".")
    for t in thresholds:
        ax.axhline(t, linestyle="--", linewidth=0.8, color="grey")
    ax.set_xlabel("head rank")
    ax.set_ylabel("score")
    ax.set_title("score distribution (sparsity)")
    return _done(fig, own)


CONTROL_STYLE = {"random": ("tab:blue", "random sets"), "matched": ("tab:green", "layer-matched sets")}


def _control_band(ax: Any, rows: pd.DataFrame, colour: str, alpha: float = 0.2) -> None:
    """The 5-95 % band of the control sets' accuracies (seed "all" rows); the mean's interval where a summary
    has no quantile columns (written before set-level statistics)."""
    if {"accuracy_q05", "accuracy_q95"} <= set(rows.columns):
        low, high = rows["accuracy_q05"], rows["accuracy_q95"]
    else:
        low, high = rows["accuracy_ci_low"], rows["accuracy_ci_high"]
    accuracy = rows["accuracy"].astype(float)  # the baseline row (k = 0) has no sets: the band starts at its point
    ax.fill_between(rows["k"], low.astype(float).fillna(accuracy), high.astype(float).fillna(accuracy), color=colour,
                    alpha=alpha, linewidth=0)


def k_sweep_curve(summary: pd.DataFrame, title: str = "grounding accuracy vs masked heads", *, ax: Any = None) -> Any:
    """Accuracy vs k: the top-k heads with their bootstrap CI band, and for each control (random, layer-matched)
    the mean accuracy of its head sets (dashed) with the band where 90 % of the sets lie (5-95 % quantiles), or, for
    the clustered design (one set per scene, no set distribution), the 95 % interval of the mean over the scenes."""
    fig, ax, own = _figure(ax=ax)
    base = summary[summary["condition"] == "baseline"]
    top = pd.concat([base, summary[summary["condition"] == "top"]]).sort_values("k")
    if len(top) >= 2:
        ax.plot(top["k"], top["accuracy"], marker="o", color="tab:red", label="top-k VRHs")
        ax.fill_between(top["k"], top["accuracy_ci_low"], top["accuracy_ci_high"], color="tab:red", alpha=0.2,
                        linewidth=0)
    for kind, (colour, label) in CONTROL_STYLE.items():
        rows = summary[(summary["condition"] == kind) & (summary["seed"].astype(str) == "all")]
        if rows.empty:
            continue
        rows = pd.concat([base, rows]).sort_values("k")
        counts = sorted({int(n) for n in rows["sets"].dropna()}) if "sets" in rows else []
        sets = "" if not counts else f" ({counts[0]} per k)" if len(counts) == 1 else \
            f" ({counts[0]}-{counts[-1]} sets per k)"
        masked = rows[rows["k"] > 0]
        clustered = "accuracy_q05" in masked and masked["accuracy_q05"].isna().all()  # one set per scene
        band = "95% interval over scenes, one set each" if clustered else "5-95% band"
        ax.plot(rows["k"], rows["accuracy"], marker="^", linestyle="--", color=colour,
                label=f"{label}: mean, {band}{sets if not clustered else ''}")
        if clustered:
            ax.fill_between(rows["k"], rows["accuracy_ci_low"].fillna(rows["accuracy"]),
                            rows["accuracy_ci_high"].fillna(rows["accuracy"]), color=colour, alpha=0.12, linewidth=0)
        else:
            _control_band(ax, rows, colour)
    ks = sorted(int(k) for k in summary["k"].unique())
    if "k_fraction" in summary and summary["k_fraction"].notna().all():
        fraction = summary.groupby("k")["k_fraction"].first()
        ax.set_xticks(ks, [f"{k}\n{fraction[k]:.1%}" for k in ks], fontsize=8)
    ax.set_xlabel("k masked heads (share of all heads)")
    ax.set_ylabel("accuracy (IoU >= 0.5)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _done(fig, own)


def failure_bars(summary: pd.DataFrame, *, ax: Any = None) -> Any:
    """Per condition at each k (control sets pooled): parse failures and mislocations, the latter split into
    boxes on another annotated object and boxes on no object where the samples list their objects."""
    fig, ax, own = _figure(7, 4, ax)
    rows = summary[(~summary["condition"].isin(tuple(CONTROL_STYLE))) | (summary["seed"].astype(str) == "all")]
    labels = [f"{c}\nk={k}" for c, k in zip(rows["condition"], rows["k"])]
    x = np.arange(len(rows))
    split = "other_object_rate" in rows and rows["other_object_rate"].notna().all()
    bottom = np.zeros(len(rows))
    parts = [("other_object_rate", "boxed another object", "tab:orange"),
             ("no_object_rate", "boxed no object", "tab:brown")] if split else [
                 ("mislocation_rate", "mislocation", "tab:orange")]
    for column, label, colour in parts + [("parse_failure_rate", "parse failure", "tab:grey")]:
        values = rows[column].to_numpy(dtype=float)
        ax.bar(x, values, bottom=bottom, label=label, color=colour)
        bottom = bottom + values
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("share of answers")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("failure decomposition")
    return _done(fig, own)


def design_space_bars(table: pd.DataFrame, *, ax: Any = None) -> Any:
    """Accuracy drop per design-space variant, as horizontal bars (smallest at the bottom)."""
    fig, ax, own = _figure(7, max(3.0, 0.3 * len(table) + 1), ax)
    ordered = table.dropna(subset=["drop"]).sort_values("drop")
    ax.barh(ordered["variant"], ordered["drop"], color="tab:purple")
    ax.set_xlabel("accuracy drop when masking the variant's top-k")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("design space")
    return _done(fig, own)


def attention_overlay(image: Any, grid: np.ndarray, region: tuple[float, float, float, float],
                      boxes: dict[str, tuple[float, float, float, float]] | None = None, title: str = "", *,
                      ax: Any = None) -> Any:
    """An attention map over a block's token grid drawn on the image region it covers, with boxes."""
    fig, ax, own = _figure(4, 4, ax)
    _draw_overlay(ax, image, grid, region, boxes, title)
    return _done(fig, own)


def _draw_overlay(ax: Any, image: Any, grid: np.ndarray, region: tuple[float, float, float, float],
                  boxes: dict[str, tuple[float, float, float, float]] | None, title: str) -> None:
    ax.imshow(image)
    x0, y0, x1, y1 = region
    ax.imshow(grid, extent=(x0, x1, y1, y0), alpha=0.55, cmap="inferno", interpolation="nearest")
    for (name, box), colour in zip((boxes or {}).items(), ("lime", "red", "cyan")):
        _draw_box(ax, box, colour, name)
    if boxes:
        ax.legend(loc="lower right", fontsize=7)
    ax.set_xlim(0, image.size[0])
    ax.set_ylim(image.size[1], 0)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)


def score_damage_scatter(table: pd.DataFrame, *, label_top: int = 5, title: str | None = None, ax: Any = None) -> Any:
    """Single-head causal scan: each head's score against the accuracy drop when it alone is masked.

    ``table`` is ``HeadScanResult.table()`` (or ``head_scan.csv`` read back: columns ``head``, ``score``,
    ``drop``, ``n``, sorted by score rank); the ``label_top`` best-scored heads are named and the title carries
    Spearman's rho of score and drop (``statistics.spearman``)."""
    from vrh_interp.evaluation.statistics import spearman

    fig, ax, own = _figure(ax=ax)
    ax.scatter(table["score"], table["drop"], s=14, color="tab:blue", alpha=0.7)
    for row in table.head(label_top).itertuples():
        ax.annotate(row.head, (row.score, row.drop), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("head score")
    ax.set_ylabel("accuracy drop when masked alone")
    rho = spearman(table["score"].to_numpy(dtype=float), table["drop"].to_numpy(dtype=float))
    ax.set_title(title or f"score vs single-head damage (Spearman {rho:.2f}, {len(table)} heads, "
                          f"n={int(table['n'].max())})", fontsize=10)
    return _done(fig, own)


def overlay_panels(result: Any, title: str = "", *, ax: Any = None) -> Any:
    """The panels of an ``overlays.OverlayResult`` side by side: each head subset's answer-row attention over
    the image, with the ground-truth (green) and predicted (red) boxes (``ax``: one Axes per panel)."""
    panels = result.overlays
    fig, axes, _ = _panels(len(panels), ax, 3.2 * len(panels), 3.6)
    boxes = {"ground truth": result.truth.as_tuple()}
    if hasattr(result.predicted, "as_tuple"):
        boxes["prediction"] = result.predicted.as_tuple()
    for ax, overlay in zip(axes, panels):
        _draw_overlay(ax, result.image, overlay.grid, overlay.block.region, boxes, overlay.name)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def score_map_comparison(a: np.ndarray, b: np.ndarray, labels: tuple[str, str] = ("A", "B"), k: int = 5, *,
                         ax: Any = None) -> Any:
    """Two models' layer x head score maps side by side, and each head's score in A against B.

    Each heatmap has its own colour scale: index transfer is about WHICH heads score high, and two models'
    scores can differ in scale. In the scatter (one point per head, same index in both grids) heads in A's
    top-k are red, in B's top-k green, in both black; the rank statistics with chance baselines are
    ``vrh_interp.experiments.transfer.compare_scores``. ``ax``: three Axes (A, B, the scatter).
    """
    if a.shape != b.shape:
        raise ValueError(f"score maps of different grids {a.shape} vs {b.shape} cannot be compared head by head")
    layers, heads = a.shape
    fig, axes, _ = _panels(3, ax, max(10.0, 2 * (heads * 0.4 + 2) + 3.5), max(3.4, layers * 0.35 + 1.8),
                           gridspec_kw={"width_ratios": [1, 1, 0.9]})
    for ax, scores, label in zip(axes[:2], (a, b), labels):
        image = ax.imshow(scores, aspect="auto", cmap="viridis", origin="lower", interpolation="nearest")
        ax.set_xticks(range(heads))
        ax.set_yticks(range(layers))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{label} scores")
        fig.colorbar(image, ax=ax)
    k = min(k, a.size)
    top_a = set(np.argsort(-a.ravel(), kind="stable")[:k])
    top_b = set(np.argsort(-b.ravel(), kind="stable")[:k])
    colours = ["black" if i in top_a and i in top_b else "tab:red" if i in top_a else "tab:green" if i in top_b
               else "lightgrey" for i in range(a.size)]
    axes[2].scatter(a.ravel(), b.ravel(), c=colours, s=18)
    axes[2].locator_params(nbins=4)
    axes[2].set_xlabel(f"{labels[0]} score")
    axes[2].set_ylabel(f"{labels[1]} score")
    axes[2].set_title(f"per head; top-{k}: {labels[0]} red, {labels[1]} green, both black", fontsize=8)
    return fig


# Transferred heads are dashed so they stay visible where they coincide with the own curve.
CROSS_STYLE = {"own": ("tab:red", "o", "-"), "transferred": ("tab:green", "s", "--"), "random": ("tab:blue", "^", "-")}


def cross_masking_curves(summary: pd.DataFrame, title: str = "cross-model masking", *, ax: Any = None) -> Any:
    """The paper's Fig. 7: one panel per model, accuracy vs k with that model's own top-k heads, the other
    model's top-k heads (transferred) and sets of k random heads masked: own and transferred with bootstrap CI
    bands, the random sets' mean with the band of their 5-95 % quantiles.

    ``summary`` is ``vrh_interp.experiments.transfer.CrossMaskingResult.summary()`` or its CSV read back. Every curve
    starts at the model's unmasked baseline (k = 0). Panels share the y axis (accuracy in [0, 1]). ``ax``: one
    Axes per model.
    """
    models = list(dict.fromkeys(summary["model"]))
    fig, axes, _ = _panels(len(models), ax, 4.2 * len(models) + 0.6, 4.0, sharey=True)
    for ax, model in zip(axes, models):
        part = summary[summary["model"] == model]
        base = part[part["condition"] == "baseline"]
        for kind, (colour, marker, line) in CROSS_STYLE.items():
            rows = part[part["condition"] == kind]
            if kind == "random":
                rows = rows[rows["seed"].astype(str) == "all"]
                label = "random sets: mean, 5-95% band"
            elif kind == "own":
                label = f"own top-k ({model})"
            else:
                sources = rows["heads_from"].dropna().unique()
                label = f"transferred top-k ({sources[0] if len(sources) else '?'})"
            rows = pd.concat([base, rows]).sort_values("k")
            if len(rows) < 2:
                continue
            ax.plot(rows["k"], rows["accuracy"], marker=marker, linestyle=line, color=colour, label=label)
            if kind == "random":
                _control_band(ax, rows, colour, alpha=0.15)
            else:
                ax.fill_between(rows["k"], rows["accuracy_ci_low"], rows["accuracy_ci_high"], color=colour, alpha=0.15)
        ax.set_title(f"heads masked in {model}")
        ax.set_xticks(sorted(int(k) for k in part["k"].unique()))
        ax.set_xlabel("k masked heads")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("accuracy (IoU >= 0.5)")
    fig.suptitle(title)
    return fig


# ------------------------------------------------------------------------------------------ activation patching
Rect = tuple[float, float, float, float]


def _draw_box(ax: Any, box: Rect, colour: str, label: str | None = None, style: str = "-") -> None:
    from matplotlib.patches import Rectangle

    x1, y1, x2, y2 = box
    ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, linewidth=2, linestyle=style,
                           label=label))


def pair_panels(images: tuple[Any, Any], boxes: dict[str, Rect | None],
                titles: tuple[str, str] = ("clean", "corrupted"),
                answers: tuple[Rect | None, Rect | None] | None = None, *, ax: Any = None) -> Any:
    """A clean/corrupted input pair side by side, every named box drawn on both images.

    ``boxes`` maps a label (e.g. ``"clean referent"``) to a pixel box, ``None`` to skip; ``answers`` are the
    model's parsed answer boxes on each image (dashed white), ``None`` where it did not parse. ``ax``: two Axes.
    """
    fig, axes, _ = _panels(2, ax, 7.6, 4.0)
    colours = ("lime", "red", "cyan", "orange")
    for index, (ax, image, title) in enumerate(zip(axes, images, titles)):
        ax.imshow(image)
        for (label, box), colour in zip(boxes.items(), colours):
            if box is not None:
                _draw_box(ax, box, colour, label)
        if answers is not None and answers[index] is not None:
            _draw_box(ax, answers[index], "white", "answer", "--")
        ax.set_xlim(0, image.size[0])
        ax.set_ylim(image.size[1], 0)
        ax.set_axis_off()
        ax.set_title(title, fontsize=9)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return fig


def patching_heatmap(grid: np.ndarray, title: str = "recovery per head", *, ax: Any = None) -> Any:
    """Layer x head heatmap of patching recovery, centred on 0 (blue: hurts, red: recovers the clean answer).

    ``grid`` is ``HeadPatchingResult.recovery_grid(layers, heads)`` (NaN for heads not patched); small grids
    carry the value in each cell.
    """
    from matplotlib.colors import TwoSlopeNorm

    layers, heads = grid.shape
    fig, ax, own = _figure(max(4.0, heads * 0.5 + 2), max(3.0, layers * 0.45 + 1.5), ax)
    finite = grid[np.isfinite(grid)]
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    bound = bound if bound > 0 else 1.0
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="RdBu_r", origin="lower",
                      norm=TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound), interpolation="nearest")
    if grid.size <= 256:
        for layer in range(layers):
            for head in range(heads):
                if np.isfinite(grid[layer, head]):
                    value = grid[layer, head]
                    ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if abs(value) > 0.6 * bound else "black")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="recovery")
    return _done(fig, own)


def attribution_scatter(exact: pd.DataFrame, estimate: pd.DataFrame, stats: dict[str, float] | None = None,
                        label_top: int = 3, *, ax: Any = None) -> Any:
    """Attribution-patching estimate against exact patching recovery, one point per head, with y = x.

    ``exact`` / ``estimate`` are the ``frame`` of ``patch_each_head`` / ``attribution_patching`` (joined on
    ``head``); ``stats`` is ``compare_rankings(...)`` (its rank correlations go into the title); the
    ``label_top`` heads of the exact ranking are named.
    """
    merged = exact.merge(estimate, on="head", suffixes=("_exact", "_attribution"))
    fig, ax, own = _figure(4.6, 4.2, ax)
    x, y = merged["recovery_exact"].to_numpy(), merged["recovery_attribution"].to_numpy()
    ax.scatter(x, y, s=16, color="tab:blue")
    low, high = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
    ax.plot([low, high], [low, high], linestyle="--", color="grey", linewidth=0.8)
    for row in merged.nlargest(label_top, "recovery_exact").itertuples():
        ax.annotate(row.head, (row.recovery_exact, row.recovery_attribution), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("exact patching recovery")
    ax.set_ylabel("attribution estimate")
    title = "attribution vs exact patching"
    if stats:
        title += f"\nSpearman {stats['spearman']:.2f}, Kendall tau-b {stats['kendall_tau_b']:.2f}"
    ax.set_title(title, fontsize=9)
    return _done(fig, own)


REGION_COLOURS = {"head_output": "tab:grey", "clean_referent": "tab:green", "corrupted_referent": "tab:red",
                  "distractors": "tab:cyan", "background": "tab:olive", "text": "tab:purple"}


def position_patching_map(frame: pd.DataFrame, *, image: Any = None, boxes: dict[str, Rect | None] | None = None,
                          title: str = "key/value patching by region", ax: Any = None) -> Any:
    """Recovery per region from ``position_patching`` as bars with bootstrap CIs, one group per head.

    The whole-head ceiling (``head_output``) is the grey bar and a dashed line. With ``image`` and ``boxes``
    (region name -> a pixel box, e.g. ``{"clean_referent": pair.clean.box, "corrupted_referent":
    pair.corrupted_box}``) a second panel draws the regions on the image, each labelled with its recovery for
    the first head. ``ax``: one Axes, two with ``image``.
    """
    heads = list(dict.fromkeys(frame["head"]))
    regions = list(dict.fromkeys(frame["region"]))
    panels = 2 if image is not None else 1
    fig, axes, _ = _panels(panels, ax, max(5.0, 0.6 * len(regions) * len(heads) + 1.5) + 3.6 * (panels - 1), 3.8,
                           gridspec_kw={"width_ratios": [2.2, 1][:panels]})
    ax = axes[0]
    width = 0.8 / len(regions)
    for h, head in enumerate(heads):
        part = frame[frame["head"] == head].set_index("region")
        for r, region in enumerate(regions):
            if region not in part.index:
                continue
            row = part.loc[region]
            x = h + (r - (len(regions) - 1) / 2) * width
            error = [[max(row["recovery"] - row["ci_low"], 0.0)], [max(row["ci_high"] - row["recovery"], 0.0)]]
            ax.bar(x, row["recovery"], width, yerr=error, capsize=2, color=REGION_COLOURS.get(region, "tab:blue"),
                   label=region if h == 0 else None)
        if "head_output" in part.index:
            ceiling = float(part.loc["head_output", "recovery"])
            ax.hlines(ceiling, h - 0.45, h + 0.45, linestyles="--", colors="grey", linewidth=0.8)
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(heads)), heads)
    ax.set_ylabel("recovery")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    if image is not None:
        first = frame[frame["head"] == heads[0]].set_index("region")["recovery"]
        overlay = axes[1]
        overlay.imshow(image)
        for region, box in (boxes or {}).items():
            if box is None:
                continue
            _draw_box(overlay, box, REGION_COLOURS.get(region, "tab:blue"))
            if region in first.index:
                x1, y1, _, _ = box  # a Box or a 4-tuple
                overlay.text(x1, y1 - 1, f"{first[region]:.2f}", fontsize=8, va="bottom",
                             color=REGION_COLOURS.get(region, "tab:blue"), fontweight="bold")
        overlay.set_xlim(0, image.size[0])
        overlay.set_ylim(image.size[1], 0)
        overlay.set_axis_off()
        overlay.set_title(f"{heads[0]}: recovery per region", fontsize=9)
    return fig


def grid_drop_heatmap(drops: pd.DataFrame, verdicts: pd.DataFrame | None = None,
                      title: str = "grounding drop with the top-k VRHs masked", *, ax: Any = None) -> Any:
    """Model x benchmark heatmap of the accuracy drop (baseline - VRH-k) of a grid (``experiments.grid``); each
    cell carries its value and, from ``verdicts`` (same shape), its verdict; cells without a result are blank."""
    values = drops.to_numpy(dtype=float)
    fig, ax, own = _figure(max(4.0, values.shape[1] * 1.4 + 2.5), max(2.5, values.shape[0] * 0.6 + 1.5), ax)
    finite = values[np.isfinite(values)]
    bound = max(float(np.abs(finite).max()) if finite.size else 1.0, 1e-6)
    image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", cmap="Reds", vmin=min(0.0, float(finite.min(
        initial=0.0))), vmax=bound, interpolation="nearest")
    for row in range(values.shape[0]):
        for column in range(values.shape[1]):
            if np.isfinite(values[row, column]):
                verdict = "" if verdicts is None else f"\n{verdicts.iat[row, column]}"
                ax.text(column, row, f"{values[row, column]:.2f}{verdict}", ha="center", va="center", fontsize=7,
                        color="white" if values[row, column] > 0.6 * bound else "black")
    ax.set_xticks(range(values.shape[1]), [str(c) for c in drops.columns], rotation=30, ha="right")
    ax.set_yticks(range(values.shape[0]), [str(i) for i in drops.index])
    ax.set_xlabel("benchmark")
    ax.set_ylabel("model")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="accuracy drop")
    return _done(fig, own)


STEER_STYLE = {"top": ("tab:red", "o", "-"), "planted": ("tab:purple", "D", "-"), "decoys": ("tab:orange", "v", ":"),
               "random": ("tab:blue", "^", "--"), "matched": ("tab:green", "s", "--"), "live": ("tab:grey", "x", "--")}


def plot_dose_response(table: pd.DataFrame, path: Any = None, *, k: int | None = None,
                       claim_alpha: float | None = None, sets: pd.DataFrame | None = None,
                       title: str = "redirecting heads onto another object", ax: Any = None) -> Any:
    """Dose-response of redirection (``experiments.steer``): per head-set kind, the share of answers that MOVE to
    the target (left) and that BREAK (right) against the bias alpha; a control kind's line is the mean over its sets,
    its band (with ``sets``: per-set rates, columns kind / seed / alpha / move_rate / break_rate) where 90 % of its
    sets lie (5-95 %). ``claim_alpha`` is marked (the alpha the claim is judged at). Saved to ``path`` if given."""
    fig, axes, own = _panels(2, ax, 10.0, 4.0)
    for panel, (column, label) in zip(axes, (("move_rate", "moved to the target"), ("break_rate", "broke"))):
        for kind in dict.fromkeys(table["kind"]):
            colour, marker, style = STEER_STYLE.get(kind, ("black", ".", "-."))
            rows = table[table["kind"] == kind].sort_values("alpha")
            count = int(rows["sets"].max()) if "sets" in rows else 1
            name = f"top-{k}" if kind == "top" and k else kind
            ax_label = f"{name} ({count} sets)" if count > 1 else name
            width = 4.0 if kind == "top" else 1.5  # thick: a named set equal to the top-k stays visible over it
            panel.plot(rows["alpha"], rows[column], marker=marker, linestyle=style, color=colour, label=ax_label,
                       linewidth=width, alpha=0.55 if kind == "top" else 1.0)
            if sets is not None and count > 1:
                per = sets[sets["kind"] == kind].groupby("alpha")[column]
                low, high = per.quantile(0.05), per.quantile(0.95)
                alphas = [a for a in rows["alpha"] if a in low.index]
                base = rows.set_index("alpha")[column]
                panel.fill_between([0.0, *alphas], [base.get(0.0, np.nan), *low[alphas]],
                                   [base.get(0.0, np.nan), *high[alphas]], color=colour, alpha=0.15, linewidth=0)
        if claim_alpha is not None:
            panel.axvline(claim_alpha, color="grey", linewidth=0.8, linestyle=":")
        panel.set_xlabel("alpha (pre-softmax bias on the target's visual tokens)")
        panel.set_ylabel(f"share of answers that {label}")
        panel.set_ylim(-0.02, 1.02)
        alphas = sorted(float(a) for a in table["alpha"].unique())
        panel.set_xticks(alphas, [f"{a:g}" for a in alphas])
    axes[0].set_title(title, fontsize=10)
    axes[1].set_title("answers that break (no box, or a box on neither object)", fontsize=10)
    axes[0].legend(fontsize=8)
    if path is not None:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    return fig
