"""``vrh steer``: redirect the top-k heads onto another object and see whether the answer moves there
(``experiments.steer``: the redirection template, the control sets, the ``sufficient`` claim).

This module holds the command's options (``add_options``) and its runner (``cmd_steer``); ``apps.cli`` registers the
subcommand. It imports nothing of ``apps.cli`` (no import loop) and nothing heavy at module level: ``vrh --help``
builds every parser."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vrh_interp.experiments.spec import whole_number


def _alphas(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"alphas are numbers separated by commas, e.g. 0,2,4,8,16; got {text!r}")
    if not values or 0.0 not in values or any(v < 0 or v != v or v == float("inf") for v in values) \
            or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"alphas must be distinct finite numbers >= 0 and include 0 (the "
                                         f"unsteered run), got {text!r}")
    return values


def _seeds(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and len(p) < 19 for p in parts) or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a list of distinct seeds: write whole numbers >= 0 "
                                         "separated by commas, e.g. 0,1,2")
    return [int(p) for p in parts]


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of ``vrh steer`` on its subparser (``apps.cli`` makes it with the declaration's help line)."""
    from vrh_interp.core.execution.backends import BACKENDS  # no torch: `vrh --help` stays fast
    from vrh_interp.data.sources import MAX_SYNTHETIC_SCENES

    scenes = whole_number(1, MAX_SYNTHETIC_SCENES)
    p.add_argument("--model", default="toy:planted", help="hub id, local folder, toy:NAME or tiny:FAMILY")
    p.add_argument("--out", default="runs/steer", help="run folder (rerun to resume)")
    p.add_argument("--k", type=whole_number(1), default=3, help="how many top-scored heads are redirected")
    p.add_argument("--alphas", type=_alphas, default="0,2,4,8,16",
                   help="bias strengths (the claim is judged at the largest)")
    p.add_argument("--items", type=scenes, default=40,
                   help="evaluation items (scenes with two referable objects; the target is the other one)")
    p.add_argument("--detect", type=scenes, default=20, help="detection scenes that rank the heads")
    p.add_argument("--seeds", type=_seeds, default="0,1,2,3,4",
                   help="dose-response control seeds: one random, one layer-matched and one live-head set each, "
                        "redirected at every alpha (default 0-4; the rank test draws its own sets)")
    p.add_argument("--rank-sets", type=whole_number(0, 10_000), default=199,
                   help="the sequential rank test's most control sets per kind at the claim's alpha (drawn in "
                        "blocks of 20, 40, 80, ...; stopped early once 5 sets move as many answers as the top-k; "
                        "p reaches 1/(N+1); 0: rank the dose-response sets instead)")
    p.add_argument("--rank-items", type=scenes, default=12, help="the rank test's fixed items")
    p.add_argument("--heads", default=None,
                   help="redirect these heads (e.g. L1H4,L0H3) instead of the detected top-k: no detection pass, "
                        "k is their number (a random set here is the claim's calibration: it must not hold)")
    p.add_argument("--no-matched", action="store_true", help="leave the layer-matched control out")
    p.add_argument("--no-live", action="store_true", help="leave the live-head control out (no head census)")
    p.add_argument("--no-patching", action="store_true", help="leave the activation-patching form out")
    p.add_argument("--patch-seeds", type=whole_number(1), default=5,
                   help="control sets of each kind in the patching form (the first seeds)")
    p.add_argument("--batch-size", type=whole_number(1), default=32, help="items per batch")
    p.add_argument("--max-rows", type=whole_number(1), default=512,
                   help="rows per generation (items x conditions redirected together)")
    p.add_argument("--device", default=None, help="device or device_map, e.g. cpu, cuda, auto")
    p.add_argument("--dtype", default=None, help="torch dtype name, e.g. bfloat16")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--backend", choices=BACKENDS, default="nnsight",
                   help="what runs the model: redirection runs on nnsight only (the transformer-lens backend is "
                        "refused before the model loads)")
    p.set_defaults(func=cmd_steer)


def cmd_steer(args: argparse.Namespace) -> int:
    import pandas as pd

    from vrh_interp.core.execution.backends.base import check_supported
    from vrh_interp.core.execution.backends.select import backend_type
    from vrh_interp.core.description.model import Placement
    from vrh_interp.experiments.steer import claim_line, detect_and_steer
    from vrh_interp.specs import load_spec

    check_supported(backend_type(args.backend), operations=["steering"] + ([] if args.no_patching else ["patching"]))
    vlm = load_spec(args.model, args.device, args.dtype).on(Placement(args.backend, False))
    named = None
    if args.model == "toy:planted":  # the positive control: its planted heads and decoys, redirected too
        from vrh_interp.experiments.positive_control import declared

        planted, decoys = declared()
        named = {"planted": planted, "decoys": decoys}
    say = (lambda _: None) if args.json else (lambda line: print(line, flush=True))
    heads = vlm.geometry.validate(args.heads, "--heads") if args.heads else None
    result = detect_and_steer(vlm, Path(args.out), items=args.items, detect=args.detect, k=args.k,
                              alphas=args.alphas, random_seeds=args.seeds,
                              matched=not args.no_matched, live=not args.no_live, named=named,
                              patching=not args.no_patching, patch_seeds=args.patch_seeds,
                              rank_sets=args.rank_sets, rank_items=args.rank_items, heads=heads,
                              batch_size=args.batch_size, max_rows=args.max_rows,
                              say=say)
    written = result.write(Path(args.out))
    if args.json:
        print(json.dumps({"out": args.out, "verdict": result.verdict(), "claim": result.claims().iloc[0].to_dict(),
                          "dose_response": result.dose_response().to_dict(orient="records"),
                          "rank": result.rank().to_dict(orient="records"),
                          "patching": result.patching().to_dict(orient="records"), "files": written}, default=str))
        return 0
    tables = [("dose-response: share of answers that move to the target / stay / break", result.dose_response()),
              (f"rank test at alpha {result.config['claim_alpha']:g}: control sets drawn per kind, how many moved as "
               "many answers as the top-k, p", result.rank()),
              ("activation patching from the target-as-referent run", result.patching())]
    for title, frame in tables:
        if not frame.empty:
            with pd.option_context("display.max_columns", 20, "display.precision", 3):
                print(f"\n{title}\n{frame.to_string(index=False, line_width=100)}")
    print()
    print(claim_line(result))
    print(f"\nrun folder: {args.out} (records.csv, dose_response.csv, rank.csv, patching.csv, claims.csv, "
          "steer.json, dose_response.png)")
    return 0
