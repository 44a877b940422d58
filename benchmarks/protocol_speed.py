"""The demo's causal k-sweep, whole, two ways in one run: the library's pipeline vs a naive loop.

The protocol is step 3 of ``vrh demo`` on the default organism (``toy:c``): the conditions the library builds
with its sweep functions (the crossed design, ``experiments.conditions.sweep_conditions``: the unmasked
baseline, the top-k heads at every k of ``demo_ks``, and the control sets: uniform random, layer-matched and
live-head, ``--sets`` of each kind at k*, ``--curve-sets`` of each at the other k), greedy grounding of
``--items`` evaluation items (every referent of the first evaluation scenes, ``demo_plan.evaluation_items``).

* library pipeline (timed): ``experiments.sweep.run_conditions``, as the demo calls it (with layer sharing,
  ``core.execution.layer_sharing``, where it applies);
* the same without layer sharing (timed, ``layer_sharing.ENABLED = False``: the path before it), for a
  before / after in one run; its answers must equal the library's too;
* naive loop (timed): for every condition and every batch of ``--batch-size`` items, one plain HF ``generate``
  with the condition's heads zeroed by plain forward pre-hooks on each attention's ``o_proj`` (the head's slice of
  its input set to zero, as ``tests/reference.py`` does), nothing shared between conditions. Prompts are built by
  the same adapter call on both sides (``VLM.encode_grounding``, once per batch on both sides, timed on both).

Every answer of the naive loop must equal the library's (decoded answer text and parsed box, for every item and
condition): ``answers equal: yes/no``; a difference is reported, never tolerated. What the ranking and the
live-head pool come from (not timed): detection (``scoring.detect``, the ``vrh`` preset) on ``--detect-scenes``
held-out scenes and the head census (``evaluation.census``) on its first ``--census-items``, as in the demo.

The defaults are small (8 items, 2 sets of each control kind at k*, 1 at the other k: about a minute of model
time on a busy 2-core CPU); ``--full`` runs the results page's sizes (docs/results/toy-c.md: ``DEFAULT_SIZES``,
135 items of 40 scenes, 20 sets of each kind at k*, 4 at the other k, detection on 200 scenes) and takes long
(tens of minutes on a CPU: the naive loop alone runs 114 conditions x 135 items greedily).

    python benchmarks/protocol_speed.py [--model toy:c] [--items 8] [--sets 2] [--full] [--clock cpu]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.reference import zeroed_heads  # noqa: E402  (the independent plain-PyTorch hooks: the naive loop's mask)

GOAL = 5.0
ANSWER_TOKENS = 24  # the demo's
DEMO_BATCH_SIZE = 256  # the demo's default --batch-size
CUT = "; batches cut into whole images so that a pass holds its unmasked rows"
SMALL = {"items": 8, "sets": 2, "curve_sets": 1, "detect_scenes": 20}


def by_layer(heads: Any) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for head in heads:
        out.setdefault(head.layer, []).append(head.head)
    return out


def naive_loop(vlm: Any, items: Sequence[Any], conditions: Sequence[Any], batch_size: int,
               max_new_tokens: int) -> dict[tuple[str, str], tuple[str, Any]]:
    """``(sample_id, condition key) -> (answer, parsed box or None)``: one plain ``generate`` per condition and
    batch of items, the condition's heads zeroed by hooks."""
    from vrh_interp.core.description.boxes import BoxParseFailure

    batches = [list(items[i: i + batch_size]) for i in range(0, len(items), batch_size)]
    encoded = [vlm.encode_grounding([s.image for s in b], [s.expression for s in b]) for b in batches]
    answers: dict[tuple[str, str], tuple[str, Any]] = {}
    for cond in conditions:
        for part, batch in zip(batches, encoded):
            with torch.no_grad(), zeroed_heads(vlm.hf_model, by_layer(cond.heads)):
                ids = vlm.hf_model.generate(**batch.encoding, max_new_tokens=max_new_tokens, do_sample=False)
            for sample, answer, frame in zip(part, vlm.decode_answers(ids, batch.prompt_length), batch.frames):
                parsed = vlm.adapter.parse_box(answer, frame)
                box = None if isinstance(parsed, BoxParseFailure) else tuple(float(v) for v in parsed.as_tuple())
                answers[(sample.sample_id, cond.key)] = (answer, box)
    return answers


def library_answers(result: Any) -> dict[tuple[str, str], tuple[str, Any]]:
    return {(r.sample_id, r.condition): (r.answer, None if r.box is None else tuple(float(v) for v in r.box))
            for r in result.records.itertuples()}


def protocol(vlm: Any, args: argparse.Namespace) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """The evaluation items and the demo's k-sweep conditions (ranking from detection, live pool from the census;
    not timed)."""
    from vrh_interp.experiments.demo_plan import evaluation_items
    from vrh_interp.experiments.ks import demo_ks
    from vrh_interp.evaluation.controls import CONTROL_KINDS
    from vrh_interp.experiments.conditions import sweep_conditions
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.evaluation.census import census
    from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats

    items = evaluation_items(args.items)[:args.items]  # at least one referent per scene: enough scenes
    geometry = vlm.geometry
    ks, k_star = demo_ks(geometry.total_heads)
    detect = synthetic_samples("detect", args.detect_scenes)
    stats = collect_detection_stats(vlm, detect, batch_size=args.batch_size, max_new_tokens=ANSWER_TOKENS,
                                    progress=False)
    ranking = scores_from_stats(stats, "vrh").ranking()
    pool = census(vlm, detect[:args.census_items], max_new_tokens=ANSWER_TOKENS)
    live = pool.live
    outside = [h for h in live if h not in set(ranking[:max(ks)])]
    if len(outside) < max(ks):  # as the demo: too few live heads outside the top for a live-head control
        live = None
    first = set(range(min(args.curve_sets, args.sets)))  # every set at k*, the first curve_sets at the other k
    conditions = [c for c in sweep_conditions(ranking, geometry, ks, list(range(args.sets)), live=live)
                  if c.kind not in CONTROL_KINDS or c.k == k_star or c.seed in first]
    return items, conditions, {"ks": ks, "k_star": k_star, "live": live is not None, "census": pool.line()}


def sharing(vlm: Any, items: Sequence[Any], conditions: Sequence[Any], batch_size: int,
            max_new_tokens: int) -> tuple[list[str], int, int]:
    """What the library shares that the naive loop does not, as lines; and the generations each side runs (the
    library's planner: batches cut into whole images where layer sharing applies, ``_GroundingPasses.split``)."""
    from vrh_interp.core.execution.interventions import shared_image_prefix
    from vrh_interp.core.execution.templates.ablation import ZERO_ABLATION
    from vrh_interp.evaluation.grounding import encode_samples
    from vrh_interp.experiments.sweep import _GroundingPasses
    from vrh_interp.experiments.conditions import head_signature

    distinct = len({head_signature(c) for c in conditions})
    planner = _GroundingPasses(vlm, {"zero": ZERO_ABLATION}, max_new_tokens=max_new_tokens, max_batch_rows=None)
    batches = [list(items[i: i + batch_size]) for i in range(0, len(items), batch_size)]
    passes = rows = images = widest = cut = 0
    prefix_used = True
    for chunk in batches:
        parts = planner.split(chunk, distinct)
        cut += len(parts) > 1
        for part in parts:
            per_pass = planner.per_pass(part)
            passes += math.ceil(distinct / per_pass)
            widest = max(widest, min(per_pass, distinct))
            prefix = shared_image_prefix(vlm, encode_samples(vlm, part).encoding, unique=True)
            prefix_used = prefix_used and prefix is not None
            images += len(prefix.first) if prefix is not None else len(part)
            rows += len(part)
    naive = len(conditions) * len(batches)
    lines = [
        f"  deduplicated head sets: {distinct} distinct head sets answer {len(conditions)} conditions "
        f"(conditions masking the same heads are answered once)",
        f"  batching of conditions: {passes} batched generations (up to {widest} conditions in one generation, rows "
        f"within the 65,536-token budget{CUT if cut else ''}) vs {naive} plain generates, one per condition and batch",
        "  shared image prefix: " + (f"the image prefix runs once per image, {images} images for {rows} items per "
                                     "condition (a scene's referents share it); the vision tower once per image "
                                     "and pass" if prefix_used else "not applicable here (every item its own image, "
                                     "or the family does not allow it)")]
    return lines, passes, naive


def layer_sharing_line() -> str:
    """What layer sharing skipped in the last generation that used it (``layer_sharing.LAST_STATS``)."""
    from vrh_interp.core.execution import layer_sharing

    stats = layer_sharing.LAST_STATS
    if not stats.total:
        return "  layer sharing: not applicable here (family, ablation kind or no shared image prefix)"
    return (f"  layer sharing: layers below a condition's first masked layer taken from the unmasked rows while "
            f"its answer equals theirs: {stats.computed:,} of {stats.total:,} row-layer-token computations run "
            f"({1 - stats.computed / stats.total:.0%} skipped, last generation)")


def warm_up(vlm: Any, items: Sequence[Any], conditions: Sequence[Any]) -> None:
    """First-call costs (nnsight's source instrumentation, kernel selection) on two items, two tokens."""
    from vrh_interp.experiments.sweep import run_conditions

    run_conditions(vlm, list(items[:2]), list(conditions[:2]), batch_size=2, max_new_tokens=2, progress=False)
    naive_loop(vlm, items[:2], conditions[:2], 2, 2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy:c", help="a model spec (default: toy:c, the demo's organism)")
    parser.add_argument("--items", type=int, help=f"evaluation items (default {SMALL['items']})")
    parser.add_argument("--sets", type=int, help=f"control sets of each kind at k* (default {SMALL['sets']})")
    parser.add_argument("--curve-sets", type=int, help="control sets of each kind at the other k "
                                                       f"(default {SMALL['curve_sets']})")
    parser.add_argument("--detect-scenes", type=int, help="detection scenes for the ranking (not timed; default "
                                                          f"{SMALL['detect_scenes']})")
    parser.add_argument("--census-items", type=int, help="census items for the live-head pool (not timed)")
    parser.add_argument("--full", action="store_true",
                        help="the results page's sizes (DEFAULT_SIZES: 135 items, 20 / 4 sets, 200 detection "
                             "scenes); takes long (tens of minutes on a CPU)")
    parser.add_argument("--batch-size", type=int, default=DEMO_BATCH_SIZE, help="items per batch, both sides "
                                                                                 "(the demo's 256)")
    parser.add_argument("--max-new-tokens", type=int, default=ANSWER_TOKENS)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time (steadier on a shared machine)")
    parser.add_argument("--dtype", help="e.g. bfloat16 (default: the model's)")
    args = parser.parse_args(argv)
    from vrh_interp.experiments.demo_plan import DEFAULT_SIZES, evaluation_items

    full = {"items": len(evaluation_items(DEFAULT_SIZES.eval_scenes)), "sets": DEFAULT_SIZES.random_sets,
            "curve_sets": 4, "detect_scenes": DEFAULT_SIZES.detect_scenes}
    for key, value in (full if args.full else SMALL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.census_items is None:
        args.census_items = DEFAULT_SIZES.census_items
    for name in ("items", "sets", "curve_sets", "detect_scenes", "census_items", "batch_size", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from vrh_interp.experiments.sweep import run_conditions
    from vrh_interp.specs import load_spec

    vlm = load_spec(args.model, None, args.dtype)
    geometry = vlm.geometry
    items, conditions, facts = protocol(vlm, args)
    kinds = {kind: sum(c.kind == kind for c in conditions) for kind in dict.fromkeys(c.kind for c in conditions)}
    scenes = len({s.sample_id.rsplit("-", 2)[0] for s in items})
    print(f"model {args.model}: {geometry.num_layers} layers x {geometry.num_heads} heads; ks {facts['ks']} "
          f"(k*={facts['k_star']}); {facts['census']}" + ("" if facts["live"] else "; no live-head control"))
    print(f"conditions: {len(conditions)} (" + ", ".join(f"{kind} {n}" for kind, n in kinds.items())
          + f"; {args.sets} sets of each control kind at k*, {min(args.curve_sets, args.sets)} at the other k)")
    print(f"items: {len(items)} (every referent of {scenes} evaluation scenes), batch size {args.batch_size}, "
          f"{args.max_new_tokens} new tokens at most (greedy, stops at EOS); ranking from {args.detect_scenes} "
          f"detection scenes, census on {args.census_items} items (not timed)", flush=True)
    lines, passes, generates = sharing(vlm, items, conditions, args.batch_size, args.max_new_tokens)
    print("what the library shares that the naive loop does not:")
    print("\n".join(lines), flush=True)

    from vrh_interp.core.execution import layer_sharing

    warm_up(vlm, items, conditions)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    layer_sharing.ENABLED = False
    start = clock()
    before = run_conditions(vlm, items, conditions, batch_size=args.batch_size,
                            max_new_tokens=args.max_new_tokens, progress=False)
    before_s = clock() - start
    layer_sharing.ENABLED = True
    print(f"library pipeline without layer sharing seconds: {before_s:.2f}", flush=True)
    start = clock()
    result = run_conditions(vlm, items, conditions, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                            progress=False)
    library_s = clock() - start
    print(layer_sharing_line())
    print(f"library pipeline seconds: {library_s:.2f} ({passes} batched generations)", flush=True)
    start = clock()
    naive = naive_loop(vlm, items, conditions, args.batch_size, args.max_new_tokens)
    naive_s = clock() - start
    print(f"naive loop seconds: {naive_s:.2f} ({generates} plain generates)", flush=True)

    ours = library_answers(result)
    differ = sorted(key for key in set(ours) | set(naive) if ours.get(key) != naive.get(key))
    unshared = library_answers(before)
    differ += sorted(key for key in set(unshared) | set(naive) if unshared.get(key) != naive.get(key)
                     and key not in differ)
    print(f"answers equal: {'no' if differ else 'yes'} ({len(naive)} answers: {len(items)} items x "
          f"{len(conditions)} conditions, the library with and without layer sharing"
          f"{f'; {len(differ)} differ' if differ else ''})")
    for key in differ[:5]:
        print(f"  {key[0]} under {key[1]}: library {ours.get(key)!r}, without layer sharing "
              f"{unshared.get(key)!r}, naive {naive.get(key)!r}")
    speed_up = naive_s / library_s
    print(f"protocol speed-up over naive loop: {speed_up:.2f}x (goal >= {GOAL:g}x: "
          f"{'met' if speed_up >= GOAL else 'missed'}; {args.clock} clock; without layer sharing "
          f"{naive_s / before_s:.2f}x)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
