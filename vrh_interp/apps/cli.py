"""The ``vrh`` command line: families, detect, sweep, scan, design-space, merge, reproduce, report, demo, patch, grid.

Every long command takes ``--out`` (a run folder: rerunning the same command resumes it), shows progress
bars, prints a summary table at the end, and ``--json`` prints the machine-readable result instead.
``detect``, ``sweep``, ``design-space`` and ``reproduce`` take ``--shard i/n`` (one of n machines, its own ``--out``);
``vrh merge OUT SHARD_FOLDERS...`` joins the shards and writes what the unsharded command writes.
``detect``, ``sweep``, ``design-space`` and ``reproduce`` take ``--remote``: run the model on NDIF with nnsight's
configured host and API key (``nnsight.CONFIG``, ``NDIF_HOST`` / ``NDIF_API_KEY``); the key is never printed or stored.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Sequence

from vrh_interp.apps.argtypes import whole_number
from vrh_interp.core.runs import write_atomic

if TYPE_CHECKING:  # imported where used: `vrh --help` must not pay for pandas, torch, transformers
    import pandas as pd


def _placement(args: argparse.Namespace) -> Any:
    """Where the command runs the model (``core.model.Placement``): ``--backend`` and ``--remote`` where it has them."""
    from vrh_interp.core.model import Placement

    return Placement(getattr(args, "backend", "nnsight"), getattr(args, "remote", False))


def _load_model(spec: str, device: str | None, dtype: str | None) -> Any:
    from vrh_interp.specs import load_spec

    return load_spec(spec, device, dtype)


def _placed_model(args: argparse.Namespace) -> Any:
    """``--model`` loaded (``--device``, ``--dtype``) and placed once (``_placement``): every step reads the handle."""
    return _load_model(args.model, args.device, args.dtype).on(_placement(args))


def _check_backend(args: argparse.Namespace, *, operations: Sequence[str] = ()) -> None:
    """Refuse what ``--backend`` cannot run (``--ablation`` where the command has it, ``operations``) before the
    model loads: one line naming what is unsupported and the alternative (``backends.base.check_supported``)."""
    from vrh_interp.core.backends.base import check_supported
    from vrh_interp.core.backends.select import backend_type

    kinds = [args.ablation] if getattr(args, "ablation", None) else []
    check_supported(backend_type(args.backend), ablation_kinds=kinds, operations=operations)


def _print_table(frame: pd.DataFrame | list[dict[str, Any]], title: str) -> None:
    """A table (or its rows) that fits a 100-column terminal: wider tables wrap into column blocks and long text
    cells end in "..." (the files and ``--json`` hold them whole)."""
    import pandas as pd

    frame = frame if isinstance(frame, pd.DataFrame) else pd.DataFrame(frame)
    print(f"\n{title}")
    with pd.option_context("display.max_columns", 20, "display.precision", 3):
        print(frame.to_string(index=False, line_width=100, max_colwidth=48))


def cmd_families(args: argparse.Namespace) -> int:
    """Static tables read from the registries (data modules): no model code, torch or pandas is imported."""
    from vrh_interp.core.families.paper_models import PAPER_MODELS
    from vrh_interp.core.families.registry import FAMILIES

    if args.paper:
        rows = [{"model": m.name, "backbone": m.backbone, "checkpoint": m.checkpoint,
                 "heads": "?" if m.geometry is None else f"{m.geometry.num_layers}x{m.geometry.num_heads}",
                 "status": m.status} for m in PAPER_MODELS]
        title = "The paper's eleven models (docs/families.md says how each is verified)"
    else:
        rows = [{"family": row.name, "name": row.display_name, "model_types": ", ".join(row.model_types),
                 "box_format": row.box_format} for row in FAMILIES]
        title = "Supported VLM families"
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"\n{title}")
        print(_text_table(rows))
    return 0


def _text_table(rows: list[dict[str, Any]], width: int = 100) -> str:
    """Rows as aligned columns within ``width``; the last column wraps under itself, nothing is cut."""
    import textwrap

    columns = list(rows[0])
    widths = [max(len(column), *(len(str(row[column])) for row in rows)) for column in columns[:-1]]
    indent = sum(widths) + 2 * len(widths)
    if width - indent < 50:  # the last column on its own lines, indented, when the others leave it little room
        head = "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()
        lines = [head, f"    {columns[-1]}"]
        for row in rows:
            lines.append("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths)).rstrip())
            lines += textwrap.wrap(str(row[columns[-1]]), width, initial_indent="    ", subsequent_indent="    ",
                                   break_long_words=False)
        return "\n".join(lines)
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)) + "  " + columns[-1]]
    for row in rows:
        left = "  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths)) + "  "
        wrapped = textwrap.wrap(str(row[columns[-1]]), width - indent, break_long_words=False) or [""]
        lines += [left + wrapped[0], *(" " * indent + more for more in wrapped[1:])]
    return "\n".join(lines)


def _shard(text: str) -> Any:
    from vrh_interp.core.shards import Shard

    try:
        return Shard.parse(text)
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


_positive_int, _non_negative_int = whole_number(1), whole_number(0)


def _scene_count(minimum: int) -> Any:
    """argparse type: a number of synthetic scenes, ``minimum`` .. ``sources.MAX_SYNTHETIC_SCENES`` (scenes are
    rendered eagerly: an unbounded count would run without end)."""
    at_least = whole_number(minimum)

    def parse(text: str) -> int:
        from vrh_interp.data.sources import MAX_SYNTHETIC_SCENES

        value = at_least(text)
        if value > MAX_SYNTHETIC_SCENES:
            raise argparse.ArgumentTypeError(f"{value} scenes is above the limit of {MAX_SYNTHETIC_SCENES} "
                                             "(vrh_interp.data.sources.MAX_SYNTHETIC_SCENES)")
        return value
    return parse


def _float_in(low: float, high: float) -> Any:
    """argparse type: a finite number in [``low``, ``high``]."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
        if not low <= value <= high:  # NaN fails too
            raise argparse.ArgumentTypeError(f"{text[:40]} is outside {low:g} .. {high:g}")
        return value
    return parse


_unit_interval = _float_in(0.0, 1.0)


def _seconds(text: str) -> float:
    """argparse type: a cap in seconds, finite and > 0 (0 would mean "skip every step", not "no cap": leave the
    option out for no cap)."""
    value = _float_in(0.0, 1e9)(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]} is not a positive number of seconds (leave the option out "
                                         "for no cap)")
    return value


def _head_spec(text: str) -> str:
    """argparse type: heads as text (``L2H6,L2H7`` or ``published:MODEL/BENCHMARK``), checked, kept as text."""
    from vrh_interp.core.published import parse_heads

    try:
        parse_heads(text)
    except (KeyError, TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error).strip('"')) from None
    return text


def _ks_spec(text: str) -> str:
    """argparse type: a k list (``0,1,5`` or ``0,1%,2.5%``), checked for syntax, kept as text."""
    from vrh_interp.experiments.ks import parse_ks

    try:
        parse_ks(text, total_heads=1_000_000)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _seed_list(text: str) -> str:
    """argparse type: distinct whole-number seeds >= 0 separated by commas (``0,1,2``), kept as text."""
    parts = [p.strip() for p in text.split(",")]
    numbers = all(p.isascii() and p.isdigit() and len(p) < 19 for p in parts)
    if not numbers or len({int(p) for p in parts}) != len(parts):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a list of distinct seeds: write whole numbers >= 0 "
                                         "separated by commas, e.g. 0,1,2")
    return text


def _preset(text: str) -> str:
    """argparse type: a scoring preset name (checked before any model loads)."""
    from vrh_interp.scoring.design import resolve_design

    try:
        resolve_design(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _source_spec(vqa: bool) -> Callable[[str], str]:
    """argparse type: a ``--data`` (``vqa``: ``--vqa``) spec whose kind and synthetic arguments are valid (checked
    before any model loads; files are read later), kept as text."""

    def parse(text: str) -> str:
        from vrh_interp.data.sources import DataSpecError, check_spec

        try:
            check_spec(text, vqa=vqa)
        except DataSpecError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text

    return parse


_data_spec, _vqa_spec = _source_spec(vqa=False), _source_spec(vqa=True)


def _shard_done(args: argparse.Namespace, done: int) -> int:
    """What a shard run prints instead of the tables (they need every shard)."""
    if args.json:
        print(json.dumps({"shard": str(args.shard), "out": args.out, "done": done}))
    else:
        print(f"\nshard {args.shard} done: {done} units in {args.out}. When all {args.shard.count} shards are done: "
              f"vrh merge MERGED_OUT SHARD_0_OUT ... SHARD_{args.shard.count - 1}_OUT")
    return 0


def _print_scores(scores: Any, path: Path, preset: str, top: int, as_json: bool) -> None:
    top = min(top, scores.scores.size)
    if as_json:
        print(json.dumps({"scores_file": str(path), "top": scores.top(top).to_list()}))
    else:
        _print_table(scores.to_frame().head(top), f"Top {top} heads ({preset}); saved {path}")


def _print_sweep(result: Any, as_json: bool, out: str | Path) -> None:
    """A compact table (each control's distribution row stands for its per-set rows), then one verdict line per
    k (``report.verdict_lines``: the claims rules); the full summary is ``OUT/sweep_summary.csv``."""
    from vrh_interp.apps.report import compact_sweep_table, verdict_lines
    from vrh_interp.evaluation.inference import sets_for

    summary = result.summary()
    if as_json:
        print(summary.to_json(orient="records"))
        return
    _print_table(compact_sweep_table(summary), "k-sweep: top-k heads vs control head sets "
                                               "(control rows: their sets' distribution)")
    import textwrap

    pooled = summary[summary["seed"].astype(str) == "all"]
    if len(pooled):
        sets = int(pooled["sets"].min())
        family = max(1, summary["k"].nunique() - 1)
        floor = (f"p_random / p_matched / p_live: the top-k's rank among {sets} sets of each kind, so no smaller "
                 f"than 1/{sets + 1} = {1 / (sets + 1):.3f} (more --random-sets lower that floor: Bonferroni over "
                 f"{family} k values needs about {sets_for(0.05 / family)} for a HOLDS).")
        print(textwrap.fill(floor, 100))
    print("\n" + textwrap.fill("Verdict (evaluation.claims: HOLDS = the top-k ranks above the control sets including "
                               "its own draw, lowers accuracy against the unmasked model (exact McNemar) and the "
                               "control sets' accuracy minus its own is bounded above 0.05; DOES NOT HOLD = bounded "
                               "below 0.05; else INCONCLUSIVE; Bonferroni over the k values):", 100))
    _print_bullets(verdict_lines(result))
    print(f"\nfull table (per-set rows, failure decomposition):\n  {Path(out) / 'sweep_summary.csv'}")


def _print_bullets(lines: list[str]) -> None:
    import textwrap

    print("\n".join(textwrap.fill(line, 100, initial_indent="- ", subsequent_indent="  ",
                                   break_on_hyphens=False) for line in lines))


DEFAULT_KS = "0,1,3,5,10,20"


def _fitted_ks(args: argparse.Namespace, ranking: Any, geometry: Any) -> str:
    """``--ks``, or the default grid without the k whose controls cannot be drawn on this model (too few heads
    outside the top k, ``experiments.sweep.largest_usable_k``), saying so."""
    if args.ks is not None:
        return args.ks
    from vrh_interp.experiments.sweep import largest_usable_k

    usable = largest_usable_k(ranking, geometry, matched=not args.no_matched,
                              exclude_first_layer=args.exclude_first_layer)
    ks = [k for k in map(int, DEFAULT_KS.split(",")) if k <= usable]
    if len(ks) < len(DEFAULT_KS.split(",")):
        import textwrap

        print(textwrap.fill(f"note: default --ks {DEFAULT_KS} trimmed to {','.join(map(str, ks))}: on this model "
                            f"({geometry.total_heads} heads) the largest k whose random and layer-matched sets fit "
                            f"outside the top k is {usable}; pass --ks to choose", 100), file=sys.stderr)
    return ",".join(map(str, ks))


def _print_design_space(table: pd.DataFrame, k: int, as_json: bool) -> None:
    if as_json:
        print(table.to_json(orient="records"))
    else:
        _print_table(table.drop(columns=["top_heads"]), f"Design space: accuracy drop when masking top-{k}")


def cmd_detect(args: argparse.Namespace) -> int:
    from vrh_interp.scoring.design import resolve_design
    from vrh_interp.scoring.detect import collect_detection_stats, score_heads
    from vrh_interp.data.sources import load_data

    vlm = _placed_model(args)
    samples = load_data(args.data)
    out = Path(args.out)
    if args.shard is not None:
        stats = collect_detection_stats(vlm, samples, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                        output_source=resolve_design(args.preset).output_source, run_dir=out,
                                        dataset=args.data, shard=args.shard)
        return _shard_done(args, len(stats))
    scores = score_heads(vlm, samples, args.preset, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                         run_dir=out, dataset=args.data)
    _print_scores(scores, scores.save(out / f"scores-{args.preset}.json"), args.preset, args.top, args.json)
    return 0


def _control_seeds(args: argparse.Namespace) -> list[int]:
    """``--seeds`` when given, else seeds 0 .. ``--random-sets`` - 1."""
    if args.seeds:
        return [int(s) for s in args.seeds.split(",")]
    if args.random_sets < 1:
        raise ValueError(f"--random-sets must be >= 1, got {args.random_sets}")
    return list(range(args.random_sets))


def _needs_reference_values(kind: str) -> bool:
    """Whether ablation ``kind`` replaces heads by reference outputs (mean, resample) rather than zeroing them."""
    from vrh_interp.core.ablation_kinds import ablation_method

    return ablation_method(kind).needs_reference_values


def _ablation_values(args: argparse.Namespace, vlm: Any, scores: Any) -> Any:
    """``--ablation mean|resample``: the reference outputs on the detection samples the scores were computed on
    (those of ``--detect-data`` whose ids the scores file lists; all of them with ``--vrhs``, which has no scores
    file), saved as ``OUT/ablation_values.pt``; None for zero ablation."""
    if not _needs_reference_values(args.ablation):
        return None
    from vrh_interp.data.sources import load_data

    if scores is None:  # --vrhs (e.g. a published set): no detection run to take the samples from
        return _saved_ablation_values(args, vlm, load_data(args.detect_data))
    wanted = set(scores.sample_ids)
    detection = [s for s in load_data(args.detect_data) if s.sample_id in wanted]
    if not wanted or len(detection) != len(wanted):
        raise ValueError(f"--ablation {args.ablation} takes its reference outputs from the detection samples, but "
                         f"--detect-data {args.detect_data} holds {len(detection)} of the {len(wanted)} samples the "
                         f"scores file {args.scores} was computed on: pass the --data of its `vrh detect` run as "
                         "--detect-data")
    return _saved_ablation_values(args, vlm, detection)


def _saved_ablation_values(args: argparse.Namespace, vlm: Any, detection: Any) -> Any:
    from vrh_interp.evaluation.grounding import ablation_values

    values = ablation_values(vlm, detection, batch_size=args.batch_size, progress=not args.json)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    values.save(Path(args.out) / "ablation_values.pt")
    return values


def _live_pool(args: argparse.Namespace, vlm: Any, samples: Any, ranking: Any, ks: str) -> Any:
    """The live heads for the live-head control (``evaluation.census.run_census`` on the first evaluation samples,
    kept in the run folder), with the census line on stderr; None with ``--no-live``, on ``--remote`` (the census
    runs the model here) or when too few live heads lie outside the top k (each said)."""
    if args.no_live:
        return None
    if args.remote:
        print("note: no live-head control on --remote (the head census runs the model locally)", file=sys.stderr)
        return None
    from vrh_interp.evaluation.census import live_pool
    from vrh_interp.experiments.ks import parse_ks
    from vrh_interp.experiments.sweep import check_geometry, sweep_conditions

    counts = parse_ks(ks, vlm.geometry.total_heads)
    largest = max(counts, default=0)
    if largest == 0:
        return None
    try:
        check_geometry(ranking, vlm.geometry)
    except ValueError:  # heads off the model's grid: `sweep` refuses them with its own message (scores of another
        return None     # model, a published set for another grid), before any work; no census needed
    # a k whose random / matched sets cannot be drawn fails here as in `sweep`, before the census runs or writes
    sweep_conditions(ranking, vlm.geometry, counts, _control_seeds(args), matched=not args.no_matched,
                     exclude_first_layer=args.exclude_first_layer)
    return live_pool(vlm, samples, ranking, largest, args.out, max_new_tokens=args.max_new_tokens,
                     say=lambda line: print(line, file=sys.stderr))[1]


def cmd_sweep(args: argparse.Namespace) -> int:
    from vrh_interp.experiments.sweep import sweep
    from vrh_interp.core.published import parse_heads
    from vrh_interp.scoring.scores import HeadScores
    from vrh_interp.data.sources import load_data

    vrhs = parse_heads(args.vrhs) if args.vrhs else None  # a bad name fails before the model loads
    _check_backend(args)
    vlm = _placed_model(args)
    scores = HeadScores.load(args.scores) if vrhs is None else None
    samples = load_data(args.data)
    values = _ablation_values(args, vlm, scores)
    ranking = vrhs if vrhs is not None else scores
    head_ranking = vrhs if vrhs is not None else scores.ranking()
    ks = _fitted_ks(args, head_ranking, vlm.geometry)
    live = _live_pool(args, vlm, samples, head_ranking, ks)
    result = sweep(vlm, samples, ranking, ks=ks, random_seeds=_control_seeds(args), matched=not args.no_matched,
                   exclude_first_layer=args.exclude_first_layer, iou_threshold=args.iou, batch_size=args.batch_size,
                   max_new_tokens=args.max_new_tokens, run_dir=args.out, shard=args.shard,
                   ablation=args.ablation, ablation_values=values, live=live)
    if args.shard is not None:
        return _shard_done(args, len(result.records))
    write_atomic(Path(args.out) / "sweep_summary.csv", result.summary().to_csv(index=False))
    _print_sweep(result, args.json, args.out)
    return 0


def cmd_scan(args: argparse.Namespace) -> int:
    import pandas as pd

    from vrh_interp.experiments.head_scan import SCAN_CSV, SCAN_PNG, head_scan, write_head_scan
    from vrh_interp.experiments.sweep import ablation_for
    from vrh_interp.core.published import parse_heads
    from vrh_interp.scoring.scores import HeadScores
    from vrh_interp.data.sources import load_data

    _check_backend(args)
    vlm = _placed_model(args)
    scores = HeadScores.load(args.scores)
    samples = list(load_data(args.data))
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        samples = samples[: args.limit]
    out = Path(args.out)
    ablation = ablation_for(args.ablation, _ablation_values(args, vlm, scores), vlm.geometry)
    result = head_scan(vlm, samples, scores, heads=parse_heads(args.heads) if args.heads else None,
                       ablation=ablation, iou_threshold=args.iou, batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens, run_dir=out / "scan", progress=not args.json)
    facts = write_head_scan(result, out)
    if args.json:
        print(json.dumps({**facts, "csv": str(out / SCAN_CSV), "figure": str(out / SCAN_PNG)}))
        return 0
    _print_table(pd.read_csv(out / SCAN_CSV), f"Single-head causal scan ({args.ablation} ablation, {facts['n']} "
                                              f"samples, baseline accuracy {facts['baseline_accuracy']:.3f})")
    print(f"\nSpearman(score, accuracy drop) over {facts['heads']} heads: {facts['spearman']:.3f} "
          f"(one-sided permutation p = {facts['p_value']:.3g}); scatter: {out / SCAN_PNG}")
    return 0


def cmd_design_space(args: argparse.Namespace) -> int:
    from vrh_interp.experiments.sweep import run_conditions
    from vrh_interp.experiments.design_space import check_disjoint, design_space, design_space_plan
    from vrh_interp.scoring.detect import collect_detection_stats
    from vrh_interp.data.sources import load_data

    _check_backend(args)
    vlm = _placed_model(args)
    detect, evaluate = load_data(args.data), load_data(args.eval_data)
    out = Path(args.out)
    # every shard needs ALL detection statistics (they pick the heads to mask): it collects them, or resumes
    # from a merged `vrh detect --shard` folder copied to OUT/detect
    stats = collect_detection_stats(vlm, detect, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                    run_dir=out / "detect", dataset=args.data)
    values = None
    if _needs_reference_values(args.ablation):  # reference outputs from the same detection samples
        from vrh_interp.evaluation.grounding import ablation_values

        values = ablation_values(vlm, detect, batch_size=args.batch_size, progress=not args.json)
        values.save(out / "ablation_values.pt")
    if args.shard is not None:
        check_disjoint(stats, evaluate)
        plan = design_space_plan(stats, k=args.k, random_seeds=range(args.random_sets), ablation=args.ablation)
        result = run_conditions(vlm, evaluate, plan.conditions,
                                batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                run_dir=out / "design_space", shard=args.shard,
                                ablation_values=values)
        return _shard_done(args, len(result.records))
    table = design_space(vlm, stats, evaluate, k=args.k, random_seeds=range(args.random_sets),
                         batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, run_dir=out,
                         ablation=args.ablation, ablation_values=values)
    write_atomic(out / "design_space.csv", table.to_csv(index=False))
    _print_design_space(table, args.k, args.json)
    return 0


def _read_manifest(path: Path) -> dict[str, Any]:
    from vrh_interp.core.runs import read_manifest

    return read_manifest(path)


def _run_kind(folder: Path) -> str | None:
    manifest = folder / "manifest.json"
    return _read_manifest(manifest).get("kind") if manifest.exists() else None


def cmd_merge(args: argparse.Namespace) -> int:
    from vrh_interp.experiments.merge import merge_runs, merge_design_space_runs

    out, shards = Path(args.out), [Path(d) for d in args.shards]
    if all(_run_kind(d) == "reproduce" for d in shards):
        from vrh_interp.apps.reproduce import merge_reproduce_runs

        result = merge_reproduce_runs(out, shards)
        _print_reproduce(result, _read_manifest(out / "manifest.json")["data"], args.json)
        return 0
    if all((d / "design_space" / "manifest.json").exists() for d in shards):
        table = merge_design_space_runs(out, shards)
        write_atomic(out / "design_space.csv", table.to_csv(index=False))
        _print_design_space(table, int(table["k"].iloc[0]), args.json)
        return 0
    merged = merge_runs(out, shards)
    if merged.kind == "detect":
        from vrh_interp.scoring.detect import scores_from_run

        scores = scores_from_run(out, args.preset)
        _print_scores(scores, scores.save(out / f"scores-{args.preset}.json"), args.preset, args.top, args.json)
    elif merged.kind != "sweep":  # another declared mergeable experiment: its folder is what its command writes
        facts = {"out": str(out), "kind": merged.kind, "shards": merged.shards, "records": merged.records}
        print(json.dumps(facts) if args.json else f"merged {merged.shards} shards of a {merged.kind} run: "
              f"{merged.records} records in {out}")
    else:
        from vrh_interp.experiments.sweep import sweep_from_run

        merged_result = sweep_from_run(out, iou_threshold=args.iou)
        write_atomic(out / "sweep_summary.csv", merged_result.summary().to_csv(index=False))
        _print_sweep(merged_result, args.json, out)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from vrh_interp.apps.report import sweep_result, verdict_lines, write_report

    paths = write_report(Path(args.run))
    _print_bullets(verdict_lines(sweep_result(Path(args.run))))  # the k-sweep's verdict, as `vrh sweep` printed it
    print(f"report: {paths['html']}\nsummary: {paths['markdown']}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from vrh_interp.apps.reproduce import run_reproduce

    result = run_reproduce(
        args.model, args.data, args.vqa, Path(args.out), detect_count=args.detect, evaluation_count=args.eval,
        split_seed=args.split_seed, ks=[int(k) for k in args.ks.split(",")],
        random_seeds=[int(s) for s in args.seeds.split(",")], vqa_k=args.vqa_k, vqa_limit=args.vqa_limit,
        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype,
        progress=not args.json, shard=args.shard, placement=_placement(args), live=not args.no_live)
    if args.shard is not None:
        per_condition = result.failure_split[result.failure_split["seed"].astype(str) != "all"]
        return _shard_done(args, int(per_condition["n"].sum()))  # this shard's k-sweep answers
    _print_reproduce(result, args.data, args.json)
    return 0


def _print_reproduce(result: Any, data: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"out": str(result.out), "ks": result.ks, "vqa_k": result.vqa_k,
                          "sweep": result.sweep_summary.to_dict(orient="records"),
                          "failure_split": result.failure_split.to_dict(orient="records"),
                          "vqa": None if result.vqa_summary is None else result.vqa_summary.to_dict(orient="records"),
                          "claims": None if result.claims is None else result.claims.to_dict(orient="records")},
                         default=str))
        return
    _print_table(result.sweep_summary.drop(columns=["key"]), f"k-sweep on {data} (ks {result.ks})")
    _print_table(result.failure_split.drop(columns=["key"]),
                 "Failure split: correct / parse failure / mislocation (boxed another object / no object)")
    if result.vqa_table is not None:
        _print_table(result.vqa_table.xs("accuracy", axis=1, level="stat").round(1).reset_index(names="condition"),
                     f"Cross-task VQA accuracy (%), top-{result.vqa_k} VRHs vs {result.vqa_k} random heads")
    if result.claims is not None:
        from vrh_interp.apps.report import claim_lines

        print("\nVerdict (evaluation.claims, Bonferroni over the k values):")
        _print_bullets(claim_lines(result.claims))
    print(f"\nrun folder: {result.out}")


def cmd_demo(args: argparse.Namespace) -> int:
    from vrh_interp.apps.demo import run_demo

    return run_demo(model_spec=args.model, out=Path(args.out), detect_scenes=args.detect, eval_scenes=args.eval,
                    device=args.device, dtype=args.dtype, transfer_model=args.transfer_model, as_json=args.json,
                    random_sets=args.random_sets, check_items=args.check_items,
                    rank_sets=args.rank_sets, rank_items=args.rank_items, vqa_scenes=args.vqa_scenes,
                    control_scenes=args.control_scenes, batch_size=args.batch_size,
                    positive_control=not args.no_positive_control, budget_seconds=args.budget_seconds,
                    seed=args.seed, placement=_placement(args))


def cmd_patch(args: argparse.Namespace) -> int:
    from vrh_interp.apps.demo import demo_ks
    from vrh_interp.core.published import parse_heads
    from vrh_interp.experiments.patching_study import answers, detect_and_study

    _check_backend(args, operations=["patching"])
    vlm = _placed_model(args)
    top = args.top if args.top is not None else demo_ks(vlm.geometry.total_heads)[1]
    vrhs = parse_heads(args.vrhs) if args.vrhs else None
    study = detect_and_study(vlm, Path(args.out), detect_scenes=args.detect, top=top, vrhs=vrhs,
                             pairs_per_kind=args.pairs, probe_scenes=args.probe_scenes,
                             random_seeds=[int(s) for s in args.seeds.split(",")], targets=args.targets,
                             metric=args.metric)
    if args.json:
        print(json.dumps({"out": args.out, "facts": study.facts,
                          "tables": {k: v.to_dict(orient="records") for k, v in study.tables.items()}}, default=str))
        return 0
    print("\n".join(f"- {line}" for line in answers(study)))
    print(f"\nrun folder: {args.out} (patching.md, patching.json and one CSV per table)")
    return 0


def cmd_grid(args: argparse.Namespace) -> int:
    from vrh_interp.experiments.grid import print_grid, run_grid

    return print_grid(run_grid(args.grid, args.out, ray=args.ray, progress=not args.json, yes=args.yes),
                      as_json=args.json)


def ablation_options(p: argparse.ArgumentParser, *, detect_data: bool = True) -> None:
    from vrh_interp.core.ablation_kinds import ABLATION_KINDS, DEFAULT_ABLATION_KIND  # no torch: --help stays fast

    p.add_argument("--ablation", choices=ABLATION_KINDS, default=DEFAULT_ABLATION_KIND,
                   help="how masked heads are removed: zero (the paper's), mean (the head's mean output per position "
                        "segment over the detection samples) or resample (another detection sample's)")
    if detect_data:
        p.add_argument("--detect-data", type=_data_spec, default="synthetic:detect:200",
                       help="mean/resample ablation: the --data of the `vrh detect` run that wrote --scores (its "
                            "samples are the reference)")


def iou_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iou", type=_unit_interval, default=0.5,
                   help="an answer is correct when its box overlaps the referent's at IoU >= this")


def backend_option(p: argparse.ArgumentParser) -> None:
    from vrh_interp.core.backends import BACKENDS  # no torch: `vrh --help` stays fast

    p.add_argument("--backend", choices=BACKENDS, default="nnsight",
                   help="what runs the model: nnsight, or a TransformerLens bridge (LLaVA-type families, zero "
                        "ablation; docs/recipes/transformer-lens.md)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help with each option's default (left out when it is None or a flag's False, or the help states it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line on stderr and exit status 2, the option and the fault (argparse's own error prints the usage, a
        dozen lines, before it)."""
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


START_HERE = """start here (a shipped toy whose retrieval heads are known; CPU, no network, 1-2 minutes each):
  vrh detect --model toy:planted --data synthetic:detect:20 --out runs/first --top 5
  vrh sweep --model toy:planted --scores runs/first/scores-vrh.json \\
      --data synthetic:eval:20 --ks 0,3 --out runs/first-sweep
  vrh report runs/first-sweep
then the same on your own model: --model Qwen/Qwen2.5-VL-3B-Instruct (a hub id) or a folder,
--data jsonl:PATH or refcoco:ROOT (docs/datasets.md).
The whole pipeline at fixed sizes (no clock in any verdict; ~3 minutes on a quiet 2-core
machine): vrh demo"""


def common(p: argparse.ArgumentParser, *, data: bool = True) -> None:
    """The options every model-running command shares (``data``: also ``--data``)."""
    p.add_argument("--model", default="toy:a",
                   help="hub id, local folder, toy:a / toy:b / toy:c / toy:d / toy:planted (shipped toy models) "
                        "or tiny:FAMILY (random fixture)")
    if data:
        p.add_argument("--data", type=_data_spec, default="synthetic:detect:200",
                       help="synthetic:SPLIT:N, jsonl:PATH, refcoco:ROOT[:SPLIT], lmms-refcoco:DIR, "
                            "toloka:CSV:IMAGES, ... (docs/datasets.md)")
    p.add_argument("--out", default="runs/vrh", help="run folder (rerun to resume)")
    p.add_argument("--device", default=None, help="device or device_map, e.g. cpu, cuda, auto")
    p.add_argument("--dtype", default=None, help="torch dtype name, e.g. bfloat16")
    p.add_argument("--batch-size", type=_positive_int, default=16, help="samples per forward pass")
    p.add_argument("--max-new-tokens", type=_positive_int, default=24, help="greedy answer tokens per sample")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                   help="run shard I (0-based) of N, into its own --out; join them with `vrh merge`")
    p.add_argument("--remote", action="store_true",
                   help="run the model on NDIF (nnsight's configured host and API key; docs/recipes/remote.md)")


def _families_parser(sub: Any) -> None:
    """``vrh families``."""
    p = sub.add_parser("families", help="list supported VLM families")
    p.add_argument("--paper", action="store_true",
                   help="list the paper's eleven models instead: backbone, checkpoint, head grid, support status")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_families)


def _detect_parser(sub: Any) -> None:
    """``vrh detect``."""
    p = _experiment_parser(sub, "detect")
    common(p)
    p.add_argument("--preset", type=_preset, default="vrh", help="scoring preset (vrh, retrieval_heads, qrhead, ...)")
    p.add_argument("--top", type=_positive_int, default=20,
                   help="how many of the best-scored heads to print (all are saved)")
    backend_option(p)
    p.set_defaults(func=cmd_detect)


def _sweep_parser(sub: Any) -> None:
    """``vrh sweep``."""
    p = _experiment_parser(sub, "sweep")
    common(p)
    p.set_defaults(data="synthetic:eval:200")
    ranking = p.add_mutually_exclusive_group(required=True)
    ranking.add_argument("--scores", help="scores JSON written by `vrh detect`")
    ranking.add_argument("--vrhs", type=_head_spec,
                         help="a ranking given as heads instead: L19H17,L16H0,... or a published list, "
                                        "published:MODEL/BENCHMARK, e.g. published:qwen2.5-vl-7b/refcoco")
    p.add_argument("--ks", type=_ks_spec, default=None,
                   help="k values: head counts and/or percentages of all heads, e.g. 0,1%%,2.5%%,5 (a positive "
                        f"percentage is rounded half up to at least 1 head). Default: {DEFAULT_KS} without the k "
                        "too large for this model's controls (a note names them)")
    p.add_argument("--random-sets", type=_positive_int, default=20,
                   help="control head sets per k and control kind (seeds 0 .. N-1)")
    p.add_argument("--seeds", type=_seed_list, default=None,
                   help="explicit control seeds, e.g. 0,1,2 (overrides --random-sets)")
    p.add_argument("--no-matched", action="store_true",
                   help="leave out the layer-matched control (only the uniform random sets)")
    p.add_argument("--no-live", action="store_true",
                   help="leave out the live-head control (random sets of the heads a census on the first "
                        "evaluation samples finds acting; census.csv in --out)")
    iou_option(p)
    p.add_argument("--exclude-first-layer", action="store_true", help="random controls avoid layer 0")
    ablation_options(p)
    backend_option(p)
    p.set_defaults(func=cmd_sweep)


def _scan_parser(sub: Any) -> None:
    """``vrh scan``."""
    p = _experiment_parser(sub, "scan")
    common(p)
    p.set_defaults(data="synthetic:eval:200", out="runs/scan")
    p.add_argument("--scores", required=True, help="scores JSON written by `vrh detect`")
    p.add_argument("--limit", type=_positive_int, default=100,
                   help="scan on the first N evaluation samples (a fixed subset; cost: (1 + heads) x N answers)")
    p.add_argument("--heads", type=_head_spec, default=None, help="heads to scan, e.g. L0H1,L3H5 (default: every head)")
    iou_option(p)
    ablation_options(p)
    backend_option(p)
    p.set_defaults(func=cmd_scan)


def _design_space_parser(sub: Any) -> None:
    """``vrh design-space``."""
    p = _experiment_parser(sub, "design-space")
    common(p)
    p.add_argument("--eval-data", type=_data_spec, default="synthetic:eval:200",
                   help="evaluation samples the masks are tested on (disjoint from --data, which detects)")
    p.add_argument("--k", type=_positive_int, default=20, help="heads masked per variant: each variant's top k")
    p.add_argument("--random-sets", type=_non_negative_int, default=20,
                   help="random sets of k heads (outside every variant's top-k) each variant is compared with; "
                        "0: rank the variants without a random control")
    ablation_options(p, detect_data=False)
    backend_option(p)
    p.set_defaults(func=cmd_design_space)


def _merge_parser(sub: Any) -> None:
    """``vrh merge``."""
    p = sub.add_parser("merge", help="join the --out folders of a sharded detect, sweep, design-space or reproduce run")
    p.add_argument("out", help="new folder for the merged run")
    p.add_argument("shards", nargs="+", help="the --out folders of every shard 0/N .. N-1/N")
    p.add_argument("--preset", type=_preset, default="vrh",
                   help="detect runs: scoring preset of the scores file written")
    p.add_argument("--top", type=_positive_int, default=20, help="detect runs: heads printed")
    p.add_argument("--iou", type=_unit_interval, default=0.5, help="sweep runs: correctness threshold of the summary")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_merge)


def _reproduce_parser(sub: Any) -> None:
    """``vrh reproduce``."""
    p = _experiment_parser(sub, "reproduce")
    common(p, data=False)
    p.set_defaults(out="runs/reproduce")
    p.add_argument("--data", type=_data_spec, required=True,
                   help="grounding spec: refcoco:ROOT[:SPLIT], lmms-refcoco:DIR, toloka:CSV:IMAGES, "
                        "refspatial:PATH, ...")
    p.add_argument("--vqa", type=_vqa_spec, action="append", default=[], metavar="NAME:PATH",
                   help="VQA benchmark spec, repeatable: cvbench, mmstar, countbench, mathvista, spatial457, "
                        "spatialrgpt, vaw")
    p.add_argument("--detect", type=_positive_int, default=200, help="seeded detection samples; the rest evaluate")
    p.add_argument("--eval", type=_positive_int, default=None, help="evaluation samples (default: all the rest)")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the detection / evaluation split")
    p.add_argument("--ks", type=_ks_spec, default="0,1,3,5,10,20", help="k values, capped at half the model's heads")
    p.add_argument("--seeds", type=_seed_list, default="0,1,2", help="random-control seeds")
    p.add_argument("--vqa-k", type=_positive_int, default=20, help="VRHs (and random heads) masked on the VQA suite")
    p.add_argument("--vqa-limit", type=_positive_int, default=None, help="first N questions of each VQA benchmark")
    p.add_argument("--no-live", action="store_true",
                   help="leave out the live-head control (random sets of the heads a census on the first "
                        "evaluation samples finds acting; census.csv in --out)")
    p.set_defaults(func=cmd_reproduce)


def _report_parser(sub: Any) -> None:
    """``vrh report``."""
    p = sub.add_parser("report", help="write an HTML + Markdown report for a run folder")
    p.add_argument("run", help="run folder")
    p.set_defaults(func=cmd_report)


def _demo_parser(sub: Any) -> None:
    """``vrh demo``."""
    p = _experiment_parser(sub, "demo")
    p.add_argument("--model", default=None,
                   help="main model (default: toy:c, 128 heads, where its checkpoint is shipped, else toy:a; toy:a and "
                        "toy:b stay selectable by name)")
    p.add_argument("--transfer-model", default="auto",
                   help="second model sharing the backbone (default: the main model's partner, toy:d for toy:c, "
                        "toy:b for toy:a; '' to skip)")
    p.add_argument("--out", default="runs/demo", help="run folder (rerun to resume)")
    p.add_argument("--budget-seconds", type=_seconds, default=None,
                   help="optional cap on the whole demo: steps not begun by then are skipped and their claims read "
                        "'inconclusive'. Default: no cap; the sizes are fixed, never chosen from a clock")
    p.add_argument("--seed", type=_non_negative_int, default=0,
                   help="seed of the control-set draws, the scan's head sample and the bootstrap (default 0)")
    p.add_argument("--detect-scenes", "--detect", dest="detect", type=_scene_count(1), default=None,
                   help="detection scenes (default 200)")
    p.add_argument("--eval-scenes", "--eval", dest="eval", type=_scene_count(1), default=None,
                   help="evaluation scenes (disjoint from detection); every referent is an item (default 40 "
                        "scenes, 132 items)")
    p.add_argument("--random-sets", type=_positive_int, default=None,
                   help="control head sets of each kind (uniform, layer-matched, live heads) answered on every item "
                        "in the design-space, transfer and VQA steps (default 20; the k-sweep draws one fresh set "
                        "of each kind per scene instead)")
    p.add_argument("--rank-sets", type=_non_negative_int, default=None,
                   help="the rank test's control sets of each kind at k* (default 199: 1/200 is under 0.05/8, the "
                        "paper family's Bonferroni level; drawn in blocks of 20, 40, 80, ..., stopped once 5 are as "
                        "harmful as the top-k, each set answered only until that is decided; 0: no rank test, so "
                        "the causal claim cannot hold)")
    p.add_argument("--rank-items", type=_positive_int, default=None,
                   help="items the rank test's sets are answered on (default 12, spread over the scenes)")
    p.add_argument("--check-items", type=_positive_int, default=None,
                   help="fixed evaluation items for the ablation-kind check, head scan, design space, cross-masking "
                        "(default 40)")
    p.add_argument("--vqa-scenes", type=_scene_count(0), default=None,
                   help="eval scenes whose VQA questions are asked (default 20)")
    p.add_argument("--control-scenes", type=_scene_count(0), default=None,
                   help="evaluation scenes of the positive control on toy:planted (default 30)")
    p.add_argument("--batch-size", type=_positive_int, default=256, help="rows per forward pass")
    p.add_argument("--no-positive-control", action="store_true",
                   help="skip step 1, the positive control on toy:planted")
    p.add_argument("--device", default=None, help="device or device_map, e.g. cpu, cuda, auto")
    p.add_argument("--dtype", default=None, help="torch dtype name, e.g. bfloat16")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    backend_option(p)
    p.set_defaults(func=cmd_demo)


def _patch_parser(sub: Any) -> None:
    """``vrh patch``."""
    p = _experiment_parser(sub, "patch")
    p.add_argument("--model", default="toy:a", help="hub id, local folder, toy:NAME or tiny:FAMILY")
    p.add_argument("--out", default="runs/patching", help="run folder")
    p.add_argument("--vrhs", type=_head_spec, default=None,
                   help="heads to study, e.g. L2H6,L2H7 or published:MODEL/BENCHMARK "
                                                "(default: detect them)")
    p.add_argument("--detect", type=_scene_count(1), default=200, help="detection scenes (when --vrhs is not given)")
    p.add_argument("--top", type=_positive_int, default=None,
                   help="how many top-scored heads are the VRHs (default: the demo's k*)")
    p.add_argument("--pairs", type=_scene_count(1), default=48,
                   help="clean/corrupted pairs per kind (held-out eval scenes)")
    p.add_argument("--probe-scenes", type=_scene_count(1), default=120, help="eval scenes for the linear probes")
    p.add_argument("--seeds", type=_seed_list, default=",".join(str(s) for s in range(20)),
                   help="control seeds: one random and one layer-matched set each (default 0-19)")
    p.add_argument("--targets", choices=("greedy", "ground_truth"), default="greedy",
                   help="the two answers of a pair: the model's greedy answers, or the referents' boxes")
    from vrh_interp.patching.metrics import DEFAULT_PATCH_METRIC, PATCH_METRICS  # no torch: --help stays fast

    p.add_argument("--metric", choices=tuple(PATCH_METRICS), default=DEFAULT_PATCH_METRIC,
                   help="answer: log-probability of the whole clean box vs the corrupted one (every coordinate); "
                        "first_token: logit difference at the first differing answer token only")
    p.add_argument("--device", default=None, help="device or device_map, e.g. cpu, cuda, auto")
    p.add_argument("--dtype", default=None, help="torch dtype name, e.g. bfloat16")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    backend_option(p)
    p.set_defaults(func=cmd_patch)


def _grid_parser(sub: Any) -> None:
    """``vrh grid``."""
    p = _experiment_parser(sub, "grid")
    p.add_argument("grid", help="the grid file (docs/recipes/grid.md): models, benchmarks, experiments, options")
    p.add_argument("--out", default="runs/grid", help="grid folder: a run folder per cell, grid.json, the summary "
                                                      "(rerun to resume)")
    p.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                   help="run the cells as Ray tasks: auto (this machine's cluster, or a new local one) or a cluster "
                        "address; needs pip install 'vrh-interp[ray]' (default: every cell here, in order)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--yes", action="store_true",
                   help="run a plan of more than 500 cells to run (experiments.grid.CONFIRM_ABOVE) without asking")
    p.set_defaults(func=cmd_grid)


def _localize_parser(sub: Any) -> None:
    """``vrh localize`` (its own options and runner: ``apps.localize``)."""
    from vrh_interp.apps.localize import add_options, cmd_localize  # no torch: `vrh --help` stays fast

    p = _experiment_parser(sub, "localize")
    common(p)
    iou_option(p)
    backend_option(p)
    add_options(p)
    p.set_defaults(func=cmd_localize)


def _experiment_parser(sub: Any, command: str) -> argparse.ArgumentParser:
    """The subparser of ``vrh COMMAND``, an experiment's: its help line is the declaration's
    (``experiments.declared``)."""
    from vrh_interp.experiments.declared import by_command  # data only: `vrh --help` stays fast

    declared = by_command(command)
    if declared is None:
        raise KeyError(f"no experiment declares the command {command!r}")
    return sub.add_parser(command, help=declared.help)


def _declared_command(sub: Any, declared: Any) -> None:
    """``vrh COMMAND`` of an experiment that brings its own options and runner (``add_options``, ``run``): a
    resumable one gets ``--out`` (its run folder, held under the folder's lock), every one ``--json``."""
    p = sub.add_parser(declared.command, help=declared.help)
    if declared.resumable:
        p.add_argument("--out", default=f"runs/{declared.name}", help="run folder (rerun to resume)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    declared.resolve("add_options")(p)
    p.set_defaults(func=lambda args: declared.resolve("run")(args))


def _steer_parser(sub: Any) -> None:
    """``vrh steer``: its options and runner are ``apps.steer``'s."""
    from vrh_interp.apps.steer import add_options

    add_options(_experiment_parser(sub, "steer"))


# one function per subcommand's parser; `vrh --help` lists them in this order
SUBCOMMAND_PARSERS = (_families_parser, _detect_parser, _sweep_parser, _scan_parser, _design_space_parser,
                      _merge_parser, _reproduce_parser, _report_parser, _demo_parser, _patch_parser, _grid_parser,
                      _localize_parser, _steer_parser)


def build_parser() -> argparse.ArgumentParser:
    """The ``vrh`` parser: one subparser per ``SUBCOMMAND_PARSERS`` entry."""
    parser = _Parser(prog="vrh", description="Find and test Visual Retrieval Heads in VLMs.", epilog=START_HERE)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for add in SUBCOMMAND_PARSERS:
        add(sub)
    from vrh_interp.experiments.declared import commands_with_options

    for declared in commands_with_options():  # experiments declared with a command of their own, after these
        _declared_command(sub, declared)
    return parser


def _resumable(command: str) -> bool:
    """Whether ``--out`` of ``vrh COMMAND`` is a run folder that the same command resumes (its experiment's
    declaration says so): held under the folder's lock while it runs."""
    from vrh_interp.experiments.declared import resumable_commands

    return command in resumable_commands()


# what a full disk, a read-only or foreign folder, or a failing device raises while writing
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}


def _resume_hint(args: argparse.Namespace, argv: Sequence[str]) -> str:
    """Where the work done is kept and the command that resumes it; nothing when the run folder is not there (a
    run that failed before its first result leaves none)."""
    from vrh_interp.core.runs import LOCK_FILE

    out = Path(args.out)
    if not _resumable(args.command) or not out.is_dir() or not set(os.listdir(out)) - {LOCK_FILE}:
        return ""
    return f"; what is done is kept in {args.out}: rerun the same command to resume it: vrh {shlex.join(argv)}"


def _path_options(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """Every path the command was given, as (option, path or data spec, role): ``out`` a folder it writes,
    ``file`` / ``folder`` one it reads, ``spec`` a --data-like spec (grounding), ``vqa`` a --vqa spec."""
    command, found = args.command, []
    if _resumable(command):
        found.append(("--out", args.out, "out"))
    if command == "merge":
        found += [("OUT", args.out, "out"), *(("SHARD_FOLDER", d, "folder") for d in args.shards)]
    if command == "report":
        found.append(("RUN", args.run, "folder"))
    if getattr(args, "scores", None) is not None:
        found.append(("--scores", args.scores, "file"))
    if getattr(args, "data", None) is not None and command != "patch":
        found.append(("--data", args.data, "spec"))
    if getattr(args, "eval_data", None) is not None:
        found.append(("--eval-data", args.eval_data, "spec"))
    if getattr(args, "detect_data", None) is not None and _needs_reference_values(args.ablation):  # mean, resample
        found.append(("--detect-data", args.detect_data, "spec"))
    found += [("--vqa", spec, "vqa") for spec in getattr(args, "vqa", None) or ()]
    return found


def _check_inputs(args: argparse.Namespace) -> None:
    """Everything that can be checked without a model, before anything heavy loads (a mistyped path fails in well
    under a second, not after torch and the model): every path option (``core.paths``: empty, missing, a file
    where a folder is needed and back, symlink loops, permissions), the paths in data specs, a model folder and
    the device (``meta`` at once; CUDA's presence imports torch, still before the model loads)."""
    from vrh_interp.core import paths
    from vrh_interp.core.model_source import check_device
    from vrh_interp.data.sources import check_paths
    from vrh_interp.experiments.spec_checks import check_model

    checks = {"out": paths.output_folder, "file": paths.input_file, "folder": paths.input_folder}
    for option, path, role in _path_options(args):
        if role in ("spec", "vqa"):
            check_paths(path, option, vqa=role == "vqa")
        else:
            checks[role](path, option)
    for option in ("model", "transfer_model"):
        spec = getattr(args, option, None)
        if spec is None or (option == "transfer_model" and spec in ("", "auto")):
            continue
        check_model(spec, f"--{option.replace('_', '-')}")  # toy:, tiny: by name; a folder; a hub id: not offline
    _check_plan(args)
    if getattr(args, "device", None) is not None:
        check_device(args.device)


def _check_plan(args: argparse.Namespace) -> None:
    """The plan-level faults found from the options and the model's ``config.json`` alone (``spec_checks``), before
    torch: the demo's transfer model equal to its main model, ``vrh sweep``'s k values and ``--vrhs`` heads beyond
    the model's head grid, and evaluation samples that are detection samples (synthetic specs: ``sweep --data``
    against the scores file's samples or ``--detect-data``, ``design-space --eval-data`` against ``--data``)."""
    from vrh_interp.experiments import spec_checks

    command = args.command
    if command == "demo" and args.transfer_model not in (None, "", "auto"):
        from vrh_interp.toy.names import is_shipped

        main = args.model or ("toy:c" if is_shipped("c") else "toy:a")  # apps.demo.resolve_models' default
        if args.transfer_model == main:
            raise ValueError(f"--transfer-model {main!r} is the main model: cross-masking a model with itself says "
                             "nothing about transfer: pass a second model sharing the backbone, or '' to skip "
                             "transfer")
    if command == "sweep":
        if args.ks is not None:
            spec_checks.check_ks_fit(args.ks, args.model)
        if args.vrhs is not None:
            from vrh_interp.core.published import parse_heads

            spec_checks.check_heads_fit(parse_heads(args.vrhs), args.model, f"--vrhs {args.vrhs}")
        if args.scores is not None:
            try:
                ids = json.loads(Path(args.scores).read_text(encoding="utf-8")).get("sample_ids") or []
            except (OSError, ValueError, AttributeError):  # not a scores file: HeadScores.load says so
                ids = []
            spec_checks.check_scores_disjoint(ids, args.data, f"--scores {args.scores}", "--data")
        elif _needs_reference_values(args.ablation):
            spec_checks.check_disjoint_specs(args.detect_data, args.data, "--detect-data", "--data")
    if command == "design-space":
        spec_checks.check_disjoint_specs(args.data, args.eval_data, "--data", "--eval-data")


def _option_of(filename: Any, args: argparse.Namespace) -> str:
    """``" (--scores PATH)"``: the option whose path is ``filename`` or holds it, '' when none does."""
    from vrh_interp.data.sources import parse_spec

    if not filename:
        return ""
    target = os.path.abspath(os.fsdecode(filename))
    for option, path, role in _path_options(args):
        if role in ("spec", "vqa"):
            parsed = parse_spec(path)
            candidates = [*parsed.positional, *parsed.options.values()]
        else:
            candidates = [path]
        for candidate in candidates:
            if candidate.strip() and os.path.commonpath([target, os.path.abspath(candidate)]) == \
                    os.path.abspath(candidate):
                return f" ({option} {path})"
    return ""


def _run(args: argparse.Namespace) -> int:
    """``args.func`` under the lock of its run folder; a folder this call created and left empty is removed."""
    if not _resumable(args.command):
        return int(args.func(args))
    from vrh_interp.core.runs import LOCK_FILE, lock_run_folder

    out = Path(args.out)
    created = not out.exists()
    lock = lock_run_folder(out)  # outside the try: a folder another run holds is never cleaned up by this one
    try:
        return int(args.func(args))
    finally:
        if created and os.listdir(out) == [LOCK_FILE]:  # failed before writing anything: leave no trace
            (out / LOCK_FILE).unlink()
            out.rmdir()
        del lock


def _close_progress_bars() -> None:
    """End every open progress bar, so that a failure's message starts on its own line after them."""
    tqdm_module = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm_module, "tqdm", None), "_instances", ())):
        bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Every failure ends in one line on stderr, never a traceback (``VRH_DEBUG=1`` shows it for unexpected ones):
    the library's errors (they name the problem and the fix), a full disk or unwritable folder, and Ctrl-C name
    the run folder and the command that resumes it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    name = f"vrh {args.command}"
    try:
        with warnings.catch_warnings():  # a warning is one line too (e.g. scores of another model: a transfer)
            warnings.showwarning = lambda message, *_, **__: print(f"{name}: warning: {message}", file=sys.stderr)
            _check_inputs(args)
            return _run(args)
    except KeyboardInterrupt:
        _close_progress_bars()
        print(f"{name}: interrupted{_resume_hint(args, argv)}", file=sys.stderr)
        return 130
    except OSError as error:
        _close_progress_bars()
        option = _option_of(error.filename, args)
        if error.errno in WRITE_ERRNOS:
            print(f"{name}: error: cannot write {error.filename or 'its output'}{option} ({error.strerror}): free "
                  f"space, make the folder writable or pick another --out{_resume_hint(args, argv)}", file=sys.stderr)
        elif error.strerror and error.filename:
            print(f"{name}: error: {error.filename}{option}: {error.strerror}", file=sys.stderr)
        else:
            print(f"{name}: error: {error}{option}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as error:
        _close_progress_bars()
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        if os.environ.get("VRH_DEBUG"):
            raise
        _close_progress_bars()
        print(f"{name}: unexpected {type(error).__name__}: {error}. This is a bug in vrh-interp: please report it "
              "with the command (VRH_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
