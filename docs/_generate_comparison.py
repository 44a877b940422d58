"""Regenerate docs/results/a-vs-c.md: what changes when the toy has spare capacity (toy A: 32 heads; toy C: 128).

    python docs/_generate_comparison.py --demo-a DIR_A --demo-c DIR_C [--regime-a FILE]

Reads two finished ``vrh demo`` folders (``docs/_generate_results.py --model a|c`` makes them) and the regime
measurements (``python -m toy_training.regime``: C's is shipped as ``checkpoints/c/regime.json``; A's is
measured here if not given), and writes the page and its figures: the single-head damage distributions, the
score-vs-damage correlation, the random-set spread at k*, and every claim's verdict side by side. Nothing on
the page is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # toy_training (the regime measurement) is dev tooling, not installed
    sys.path.insert(0, str(HERE.parent))


def _regime(name: str, given: Path | None) -> dict:
    from toy_training import regime
    from vrh_interp.toy import checkpoint_dir, load

    if given is not None and given.exists():
        return json.loads(given.read_text())
    shipped = checkpoint_dir(name) / regime.REGIME_FILE
    if shipped.exists():
        return json.loads(shipped.read_text())
    model, processor = load(name)
    measured = regime.measure(model, processor, name)
    if given is not None:
        given.write_text(json.dumps(measured, indent=1))
    return measured


def _random_spread(demo_dir: Path, k_star: int) -> dict:
    summary = pd.read_csv(demo_dir / "sweep_summary.csv")
    at_k = summary[(summary["k"] == k_star) & (summary["seed"].astype(str) == "all")]
    out = {}
    for kind in ("random", "matched"):
        row = at_k[at_k["condition"] == kind]
        if len(row):
            row = row.iloc[0]
            out[kind] = (f"mean {row['accuracy']:.3f}, 5-95 % of sets "
                         f"[{row['accuracy_q05']:.3f}, {row['accuracy_q95']:.3f}]")
    top = summary[(summary["k"] == k_star) & (summary["condition"] == "top")]
    base = summary[summary["condition"] == "baseline"]
    out["top"] = f"{top.iloc[0]['accuracy']:.3f}" if len(top) else "-"
    out["baseline"] = f"{base.iloc[0]['accuracy']:.3f}" if len(base) else "-"
    return out


def damage_figure(regimes: dict[str, dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    bins = np.linspace(-0.1, max(0.3, max(max(r["single_head_damage"].values()) for r in regimes.values())) + 0.02, 30)
    for label, measured in regimes.items():
        damage = np.array(list(measured["single_head_damage"].values()))
        ax.hist(damage, bins=bins, alpha=0.55, density=True,
                label=f"{label}: {measured['heads']} heads, median {np.median(damage):.3f}, max {damage.max():.3f}")
    ax.axvline(0.15, color="k", ls="--", lw=1)
    ax.text(0.152, ax.get_ylim()[1] * 0.9, "15 points", fontsize=8)
    ax.set_xlabel("accuracy lost when this head alone is zeroed")
    ax.set_ylabel("density of heads")
    ax.set_title("Single-head damage: spare capacity means most heads cost nothing")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def generate(demo_a: Path, demo_c: Path, regime_a: Path | None = None) -> Path:
    demos = {"A": json.loads((demo_a / "demo.json").read_text()), "C": json.loads((demo_c / "demo.json").read_text())}
    regimes = {"A": _regime("a", regime_a), "C": _regime("c", None)}
    target = HERE / "results"
    figure = damage_figure(regimes, target / "a-vs-c-figures" / "single_head_damage.png")
    spread = {"A": _random_spread(demo_a, demos["A"]["k_star"]), "C": _random_spread(demo_c, demos["C"]["k_star"])}
    rows = []
    for label in ("A", "C"):
        r, d = regimes[label], demos[label]
        scan = next((v for v in d["verdicts"] if v.get("id") == "score_damage"), {})  # the single-head scan's claim
        rows.append({
            "model": label, "heads": r["heads"], "grounding (fresh level 1)": f"{r['accuracy']:.3f}",
            "query-ignoring ceiling": f"{r['query_ignoring_ceiling']:.3f}",
            "'the' / swapped expression": f"{r['the_accuracy']:.3f} / {r['swap_moves_box']:.3f}",
            "single-head cost: median / max": f"{r['single_head_damage_median']:.3f} / "
                                              f"{r['single_head_damage_max']:.3f}",
            "heads costing >= 5 / 10 / 20 points": f"{r['single_heads_costing_5_points']} / "
                                                   f"{r['single_heads_costing_10_points']} / "
                                                   f"{r['single_heads_costing_20_points']}",
            "random sets of 2.5 % of heads: mean / worst cost": f"{r['random_set_cost_mean']:.3f} / "
                                                                f"{r['random_set_cost_max']:.3f} "
                                                                f"({r['random_set_size']} heads)",
            "in the paper's regime": "yes" if r["in_regime"] else "no",
            "k*": d["k_star"],
            "top-k* / random / matched at k*": f"{spread[label]['top']} / {spread[label].get('random', '-')} / "
                                               f"{spread[label].get('matched', '-')}",
            "Spearman(score, single-head damage)": f"{scan.get('estimate', float('nan')):.2f} (p = "
                                                   f"{scan.get('p', float('nan')):.3f}, {scan.get('n', '-')} heads)",
        })
    table = pd.DataFrame(rows).set_index("model").T
    claims = {}
    for label in ("A", "C"):
        for v in demos[label]["verdicts"]:
            claims.setdefault(v["claim"], {})[label] = v["verdict"]
    verdicts = pd.DataFrame([{"claim": c, "A": v.get("A", "-"), "C": v.get("C", "-")} for c, v in claims.items()])
    changed = [c for c, v in claims.items() if v.get("A") != v.get("C")]
    lines = [
        "# Toy A vs toy C: what spare capacity changes",
        "",
        "Generated by `python docs/_generate_comparison.py` from the two results pages' demo runs "
        f"([toy A](toy-a.md), {demos['A']['evaluation_items']} evaluation items; [toy C](toy-c.md), "
        f"{demos['C']['evaluation_items']} items) and the regime measurements (`python -m toy_training.regime`, "
        "zero ablation through plain hooks, fresh level-1 scenes "
        f"{regimes['C']['scenes'][0]}-{regimes['C']['scenes'][1]}, "
        f"{regimes['C']['n']} items; every single head and {len(regimes['C']['random_sets'])} random sets of 2.5 % of "
        f"the heads on {regimes['C']['damage_n']} of them).",
        "",
        f"![single-head damage]({figure.relative_to(target)})",
        "",
        "## The regime, measured",
        "",
        table.to_markdown(),
        "",
        "## Each claim's verdict",
        "",
        verdicts.to_markdown(index=False),
        "",
        ("Verdicts that change between A and C: " + "; ".join(changed) + ".") if changed
        else "No verdict changes between A and C.",
        "",
    ]
    page = target / "a-vs-c.md"
    page.write_text("\n".join(lines))
    return page


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--demo-a", type=Path, required=True)
    parser.add_argument("--demo-c", type=Path, required=True)
    parser.add_argument("--regime-a", type=Path, default=None,
                        help="A's regime JSON (measured and written here if absent)")
    args = parser.parse_args()
    print(generate(args.demo_a, args.demo_c, args.regime_a))
