"""Figures (matplotlib, headless-safe): every function returns the Figure; notebooks display it inline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def _figure(width: float = 6.0, height: float = 4.0) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.add_subplot(1, 1, 1)


def score_heatmap(scores: np.ndarray, title: str = "head scores") -> Any:
    """Layer x head heatmap of a score table."""
    fig, ax = _figure(max(4.0, scores.shape[1] * 0.35 + 2), max(3.0, scores.shape[0] * 0.35 + 1.5))
    image = ax.imshow(scores, aspect="auto", cmap="viridis", origin="lower")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig


def score_distribution(scores: np.ndarray, thresholds: tuple[float, ...] = (1e-3, 5e-3)) -> Any:
    """Sorted score curve with the paper's sparsity thresholds."""
    fig, ax = _figure()
    ordered = np.sort(scores.ravel())[::-1]
    ax.plot(np.arange(1, len(ordered) + 1), ordered, marker=".")
    for t in thresholds:
        ax.axhline(t, linestyle="--", linewidth=0.8, color="grey")
    ax.set_xlabel("head rank")
    ax.set_ylabel("score")
    ax.set_title("score distribution (sparsity)")
    fig.tight_layout()
    return fig


def k_sweep_curve(summary: pd.DataFrame, title: str = "grounding accuracy vs masked heads") -> Any:
    """Accuracy vs k for the top-k heads and the pooled random control, with bootstrap CI bands."""
    fig, ax = _figure()
    base = summary[summary["condition"] == "baseline"]
    for kind, colour in (("top", "tab:red"), ("random", "tab:blue")):
        part = summary[summary["condition"] == kind]
        if kind == "random":
            part = part[part["seed"].astype(str) == "all"]
        part = pd.concat([base, part]).sort_values("k")
        if len(part) < 2:
            continue
        ax.plot(part["k"], part["accuracy"], marker="o", color=colour, label="top-k VRHs" if kind == "top" else "random (pooled seeds)")
        ax.fill_between(part["k"], part["accuracy_ci_low"], part["accuracy_ci_high"], color=colour, alpha=0.2)
    ax.set_xlabel("k masked heads")
    ax.set_ylabel("accuracy (IoU >= 0.5)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def failure_bars(summary: pd.DataFrame) -> Any:
    """Parse failures vs mislocations per condition at each k (functional specificity)."""
    fig, ax = _figure(7, 4)
    rows = summary[(summary["condition"] != "random") | (summary["seed"].astype(str) == "all")]
    labels = [f"{c}\nk={k}" for c, k in zip(rows["condition"], rows["k"])]
    x = np.arange(len(rows))
    ax.bar(x, rows["mislocation_rate"], label="mislocation", color="tab:orange")
    ax.bar(x, rows["parse_failure_rate"], bottom=rows["mislocation_rate"], label="parse failure", color="tab:grey")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("share of answers")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("failure decomposition")
    fig.tight_layout()
    return fig


def design_space_bars(table: pd.DataFrame) -> Any:
    fig, ax = _figure(7, max(3.0, 0.3 * len(table) + 1))
    ordered = table.dropna(subset=["drop"]).sort_values("drop")
    ax.barh(ordered["variant"], ordered["drop"], color="tab:purple")
    ax.set_xlabel("accuracy drop when masking the variant's top-k")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("design space")
    fig.tight_layout()
    return fig


def attention_overlay(image: Any, grid: np.ndarray, region: tuple[float, float, float, float],
                      boxes: dict[str, tuple[float, float, float, float]] | None = None, title: str = "") -> Any:
    """An attention map over a block's token grid drawn on the image region it covers, with boxes."""
    from matplotlib.patches import Rectangle

    fig, ax = _figure(4, 4)
    ax.imshow(image)
    x0, y0, x1, y1 = region
    ax.imshow(grid, extent=(x0, x1, y1, y0), alpha=0.55, cmap="inferno", interpolation="nearest")
    for (name, (bx1, by1, bx2, by2)), colour in zip((boxes or {}).items(), ("lime", "red", "cyan")):
        ax.add_patch(Rectangle((bx1, by1), bx2 - bx1, by2 - by1, fill=False, edgecolor=colour, linewidth=2, label=name))
    if boxes:
        ax.legend(loc="lower right", fontsize=7)
    ax.set_xlim(0, image.size[0])
    ax.set_ylim(image.size[1], 0)
    ax.set_axis_off()
    ax.set_title(title)
    fig.tight_layout()
    return fig
