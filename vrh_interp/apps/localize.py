"""``vrh localize``: the attention box of a head set beside the model's own box on the same items
(``experiments.localize``).

The heads: ``--heads`` (``L2H6,L2H7`` or ``published:MODEL/BENCHMARK``), else the top ``--k`` of ``--scores`` (a
``vrh detect`` file), else the top ``--k`` of a detection run here with ``--preset`` on ``--detect-data`` (kept in
``OUT/detect``; e.g. ``--preset localization_heads`` for the Localization-Heads criteria). The parser's options are
added by ``add_options`` (the shared ones by ``apps.cli``); this module imports nothing heavy at import time
(``vrh --help`` loads no torch).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from vrh_interp.experiments.spec import whole_number

COMPONENTS = ("largest", "peak", "full")  # evaluation.attention_box.COMPONENTS (not imported: it loads torch)
BLOCKS = ("all", "grid")
QUERIES = ("last_input", "output")


def _sigma(text: str) -> float:
    """argparse type: a smoothing width in canvas cells, 0 (none) to 100."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and 0 <= value <= 100):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a smoothing width between 0 (none) and 100 cells")
    return value


def _threshold(text: str) -> str:
    """argparse type: ``mean`` or a quantile strictly between 0 and 1, kept as text."""
    if text.strip().lower() == "mean":
        return "mean"
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is neither 'mean' nor a quantile strictly between 0 and 1, "
                                         "e.g. 0.9")
    return text


def add_options(p: argparse.ArgumentParser) -> None:
    """``vrh localize``'s own options (``apps.cli._localize_parser`` adds the shared ones)."""
    p.set_defaults(data="synthetic:eval:40", out="runs/localize")
    p.add_argument("--heads", default=None,
                   help="the head set, e.g. L2H6,L2H7 or published:MODEL/BENCHMARK (default: the top --k of --scores "
                        "or of a detection run here)")
    p.add_argument("--scores", default=None, help="scores JSON written by `vrh detect`: its top --k are the heads")
    p.add_argument("--preset", default="vrh",
                   help="without --heads or --scores: the scoring preset of the detection run here (vrh, "
                        "localization_heads, ...)")
    p.add_argument("--k", type=whole_number(1), default=3, help="how many top-scored heads form the set")
    p.add_argument("--detect-data", dest="detection_data", default="synthetic:detect:40",
                   help="without --heads or --scores: the detection samples (disjoint from --data)")
    p.add_argument("--sigma", type=_sigma, default=1.0, help="Gaussian smoothing of the attention map, in cells")
    p.add_argument("--threshold", type=_threshold, default="mean",
                   help="cells above the map's mean (Localization Heads) or above this quantile, e.g. 0.9")
    p.add_argument("--component", choices=COMPONENTS, default="largest",
                   help="which cells above the threshold the box encloses: the largest 8-connected component, the "
                        "one holding the peak, or all of them")
    p.add_argument("--blocks", choices=BLOCKS, default="all",
                   help="tiled layouts: paint every block (base view and tiles) or only the whole-image grid")
    p.add_argument("--query", choices=QUERIES, default="last_input",
                   help="the attention rows read: the last prompt token's, or the mean over the model's answer rows")


def _head_sets(args: argparse.Namespace, vlm: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({label: heads}, how they were chosen)`` from ``--heads``, ``--scores`` or a detection run here."""
    from vrh_interp.core.description.published import check_geometry, parse_heads
    from vrh_interp.data.sources import load_data
    from vrh_interp.scoring.design import resolve_design
    from vrh_interp.scoring.detect import score_heads
    from vrh_interp.scoring.scores import HeadScores

    if args.heads is not None:
        return {args.heads: check_geometry(parse_heads(args.heads), vlm.geometry)}, {"heads": args.heads}
    if args.scores is not None:
        scores = HeadScores.load(args.scores)
        return {f"{scores.design.label} top-{args.k}": scores.top(args.k)}, {"scores": str(args.scores), "k": args.k}
    resolve_design(args.preset)
    detection = list(load_data(args.detection_data))
    evaluation = {s.sample_id for s in load_data(args.data)}
    overlap = sorted(evaluation & {s.sample_id for s in detection})
    if overlap:
        raise ValueError(f"{len(overlap)} --data samples are also --detect-data samples (e.g. {overlap[:3]}): the "
                         "heads must be chosen on other items than they are tested on")
    scores = score_heads(vlm, detection, args.preset, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                         run_dir=Path(args.out) / "detect", progress=not args.json)
    return ({f"{args.preset} top-{args.k}": scores.top(args.k)},
            {"preset": args.preset, "k": args.k, "detect_data": args.detection_data})


def cmd_localize(args: argparse.Namespace) -> int:
    """Run ``vrh localize`` and print the per-set summary and four-way table (or ``--json``)."""
    from vrh_interp.core.description.model import Placement
    from vrh_interp.data.sources import load_data
    from vrh_interp.evaluation.attention_box import BoxReadout
    from vrh_interp.experiments.localize import CSV, JSON, localize, write_localize
    from vrh_interp.specs import load_spec

    if args.shard is not None:
        raise ValueError("vrh localize runs unsharded: leave out --shard")
    if args.heads is not None and args.scores is not None:
        raise ValueError("give --heads or --scores, not both")
    readout = BoxReadout(sigma=args.sigma, threshold=args.threshold, component=args.component, blocks=args.blocks,
                         query=args.query)
    vlm = load_spec(args.model, args.device, args.dtype).on(Placement(args.backend, args.remote))
    sets, source = _head_sets(args, vlm)
    samples = list(load_data(args.data))
    out = Path(args.out)
    result = localize(vlm, samples, sets, readout, iou_threshold=args.iou, batch_size=args.batch_size,
                      max_new_tokens=args.max_new_tokens, run_dir=out / "localize", progress=not args.json,
                      heads_source=source)
    facts = write_localize(result, out)
    if args.json:
        print(json.dumps({"summary": facts["summary"], "csv": str(out / CSV), "json": str(out / JSON)}))
        return 0
    _print_summary(result, out)
    return 0


def _print_summary(result: Any, out: Path) -> None:
    row = result.summary().iloc[0]
    label = row["heads"]
    print(f"Attention box of {label} ({', '.join(result.head_sets[label])}) beside the generated box, "
          f"{row['n']} items, Acc@{result.iou_threshold:g}:")
    print(f"  attention box {row['heads_acc']:.3f}   generated box {row['answer_acc']:.3f}   exact McNemar p = "
          f"{row['mcnemar_p']:.3g} ({row['heads_only']} heads-only, {row['answer_only']} answer-only)")
    print(result.four_way(label).to_string())
    print(f"\nper item: {out / 'localize.csv'}; summary with provenance: {out / 'localize.json'}")
