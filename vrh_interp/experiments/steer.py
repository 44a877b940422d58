"""``steer``: sufficiency by redirection. Pointing the top-k heads at another object should move the answer there.

Everything the masking experiments test is necessity (removing the top-k breaks grounding). Here the heads are
REDIRECTED: on scenes with at least two referable objects, each item pairs the input (an expression naming its
referent) with a TARGET, another referable object of the same image. The heads get a pre-softmax bias of strength
alpha on the keys of the target's visual tokens (``VisualLayout.positions_for_box``: tiles, thumbnails and
non-square grids included) at the rows that produce the answer (``templates.redirect.HeadRedirect``), and the
answer's box is read:

* **move**: IoU >= 0.5 with the target's box;
* **stay**: IoU >= 0.5 with the referent's box (and not a move);
* **break**: no box parsed, or a box on neither.

Conditions: alpha = 0 (the unsteered run, exactly: the template leaves a head of strength 0 untouched), then for
every alpha > 0 of the grid the top-k of the ranking and control sets redirected the same way: ``random``,
layer-``matched`` and ``live``-head sets, one per seed, drawn outside the top-k by the sweep's machinery
(``conditions.control_conditions``, the live pool from the head census, ``evaluation.census.live_pool``), plus named
sets of the caller's (on toy:planted, its declared ``planted`` heads and ``decoys``). One generation holds many
conditions: the batch is replicated per condition and each block carries its own heads and alpha.

The activation-patching form, next to it: the heads' outputs taken from a run where the target IS the referent
(the target's own expression on the same image) are patched into the item's run while it generates
(``patching.head_patching.patched_answers``), for the top-k, the named sets and the controls; same outcomes.

The claim ``sufficient`` (``evaluation.claims``, its own table: claims beyond the paper) is judged by the causal rule
(``claims.causal_test``) on NOT-moving as the outcome, at the largest alpha of the grid (declared before the run):
(a) the top-k's move rate ranks above every control set's (sequential rank test, per control kind), (b) it moves
more answers than alpha = 0 (exact McNemar, paired by item), (c) the move rate beyond the control sets' is
bounded above ``minimum`` (items and sets as the two sources of error); the kinds combine by intersection-union.

The rank test (a) is the grounding causal claim's (``experiments.designs``, module doc), at the declared alpha only:
control sets of each kind drawn in blocks (``designs.rank_blocks``: 20, 40, 80, ... up to ``rank_sets``, seeds from
``designs.SCENE_SEEDS`` on, so never a dose-response set's draw) on ``rank_items`` fixed items
(``designs.check_subset``), a kind stopped once ``designs.RANK_H`` of its sets moved at least as many answers as
the top-k (Besag-Clifford, ``designs.sequential_sets``), and each set answered item by item only until its
comparison with the top-k is decided (``designs.comparison_open`` with "not moved" as the outcome: a set that
already left more answers unmoved than the top-k cannot move as many). The p-value reaches ``1 / (rank_sets + 1)``
(0.005 at 199) where 19 fixed sets stopped at 0.05; a top-k no more special than the sets stops after a block or
two. The dose-response sets (``random_seeds``, a few per kind) draw the picture and give the effect (c).

Run folder (resumable): ``manifest.json`` (configuration, conditions and their heads, provenance),
``steer_records.jsonl`` (one record per condition and item, the log a rerun resumes from; the rank test's answers
as form ``rank``, conditions ``rank:KEY``, so a rerun resumes it block by block; a run stopped inside a block is
read on its complete blocks, ``SteerResult.rank_records``), the detection pass in
``detect/``, the census in ``census.csv``; ``steer_from_run`` reads a finished folder into a ``SteerResult``
(records, dose-response summary, claims table), whose ``write`` leaves CSV / JSON and the dose-response plot.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from vrh_interp.core._display import Card

from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.experiments.declared import experiment

STEER = experiment("steer")
ALPHAS: tuple[float, ...] = (0.0, 2.0, 4.0, 8.0, 16.0)
IOU_THRESHOLD = 0.5
OUTCOMES: tuple[str, ...] = ("move", "stay", "break")
ANSWER_TOKENS = 24
DOSE_SEEDS = range(5)
"""The dose-response control sets of each kind (the picture and the effect; the rank test draws its own)."""
RANK_SETS = 199
"""The rank test's most control sets per kind (p down to 1 / 200)."""
RANK_ITEMS = 12
"""The rank test's fixed items (``designs.check_subset``)."""
RANK_BLOCK = 20
RESULT_FILES = ("records.csv", "dose_response.csv", "rank.csv", "patching.csv", "claims.csv", "steer.json",
                "dose_response.png")


@dataclass(frozen=True)
class SteerItem:
    """An input (``sample``: its expression names its referent) and the ``target``, another referable object of the
    same image (its sample: its box, and its own expression for the patching form)."""

    sample: Any
    target: Any

    @property
    def item_id(self) -> str:
        return self.sample.sample_id


def steer_items(split: str, count: int, difficulty: int = 1, start: int = 0) -> list[SteerItem]:
    """``count`` items from synthetic scenes ``start, start+1, ...`` with at least two referable objects: scene i's
    referent ``i mod n`` (as ``data.sources.synthetic_samples`` picks it), its target the next referable object."""
    from vrh_interp.data import grounding_samples

    items, index = [], start
    while len(items) < count:
        options = grounding_samples(split, index, difficulty)  # type: ignore[arg-type]
        if len(options) >= 2:
            j = index % len(options)
            items.append(SteerItem(options[j], options[(j + 1) % len(options)]))
        index += 1
        if index - start > 50 * max(count, 1):
            raise RuntimeError(f"could not find {count} scenes with two referable objects in {index - start}")
    return items


@dataclass(frozen=True)
class SteerCondition:
    """One redirected condition: a head set (``kind``: "top", a control kind, a named set) at ``alpha``."""

    kind: str
    seed: int | None
    heads: HeadSet
    alpha: float

    @property
    def key(self) -> str:
        if not len(self.heads) or self.alpha == 0:
            return "baseline:alpha=0"
        return f"{self.kind}:alpha={self.alpha:g}" + (f":seed={self.seed}" if self.seed is not None else "")


def steer_conditions(ranking: HeadSet, geometry: Any, k: int, alphas: Sequence[float], random_seeds: Sequence[int],
                     *, matched: bool = True, live: HeadSet | None = None,
                     named: Mapping[str, HeadSet] | None = None) -> list[SteerCondition]:
    """alpha = 0 once (the unsteered run), then per alpha > 0 (ascending): the top-k, the named sets, the random,
    layer-matched and (with ``live``) live-head control sets of ``conditions.control_conditions``."""
    from vrh_interp.experiments.conditions import control_conditions

    if any(a < 0 for a in alphas) or 0 not in alphas:
        raise ValueError(f"alphas must be >= 0 and include 0 (the unsteered run), got {list(alphas)}")
    top = ranking[:k]
    controls = control_conditions(geometry, top, k, top, random_seeds, matched=matched, live=live)
    sets = [("top", None, top), *((name, None, heads) for name, heads in (named or {}).items()),
            *((c.kind, c.seed, c.heads) for c in controls)]
    conditions = [SteerCondition("baseline", None, HeadSet(), 0.0)]
    for alpha in sorted(a for a in alphas if a > 0):
        conditions += [SteerCondition(kind, seed, heads, float(alpha)) for kind, seed, heads in sets]
    return conditions


def outcome(vlm: VLM, answer: str, frame: Any, referent: Any, target: Any) -> dict[str, Any]:
    """The answer's outcome (module doc) with the parsed box and its IoUs with the target and the referent."""
    from vrh_interp.core.description.boxes import BoxParseFailure
    from vrh_interp.data.checks import as_box

    parsed = vlm.adapter.parse_box(answer, frame)
    if isinstance(parsed, BoxParseFailure):
        return {"parsed": False, "box": None, "iou_target": 0.0, "iou_referent": 0.0, "outcome": "break"}
    iou_target, iou_referent = parsed.iou(as_box(target)), parsed.iou(as_box(referent))
    result = "move" if iou_target >= IOU_THRESHOLD else "stay" if iou_referent >= IOU_THRESHOLD else "break"
    return {"parsed": True, "box": [parsed.x1, parsed.y1, parsed.x2, parsed.y2], "iou_target": float(iou_target),
            "iou_referent": float(iou_referent), "outcome": result}


def _redirected_answers(vlm: VLM, items: Sequence[SteerItem], conditions: Sequence[SteerCondition], *,
                        max_new_tokens: int) -> list[list[dict[str, Any]]]:
    """One generation of ``items`` under every condition (the batch replicated per condition, condition-major):
    per condition, one record per item."""
    from vrh_interp.core.execution import interventions as iv
    from vrh_interp.data.checks import as_box

    batch = vlm.encode_grounding([i.sample.image for i in items], [i.sample.expression for i in items])
    keys = iv.region_keys(batch, [as_box(i.target.box) for i in items])
    rows = len(items)
    heads = [c.heads if c.alpha else None for c in conditions for _ in range(rows)]
    alphas = [c.alpha for c in conditions for _ in range(rows)]
    if any(h is not None and len(h) for h in heads):
        template = iv.head_redirect(vlm, heads, alphas, keys.repeat(len(conditions), 1))
        ids = iv.run_generate(vlm, iv.replicate_encoding(batch.encoding, len(conditions)), [template],
                              max_new_tokens=max_new_tokens).ids
    else:  # nothing redirected: a loop that touches no module would never advance
        ids = iv.run_generate(vlm, iv.replicate_encoding(batch.encoding, len(conditions)),
                              max_new_tokens=max_new_tokens).ids
    answers = vlm.decode_answers(ids, batch.prompt_length)
    out = []
    for c, condition in enumerate(conditions):
        records = []
        for i, item in enumerate(items):
            answer = answers[c * rows + i]
            records.append({"form": "redirect", "condition": condition.key, "kind": condition.kind,
                            "seed": condition.seed, "alpha": condition.alpha, "sample_id": item.item_id,
                            "target_id": item.target.sample_id, "answer": answer,
                            **outcome(vlm, answer, batch.frames[i], item.sample.box, item.target.box)})
        out.append(records)
    return out


def _patched_records(vlm: VLM, items: Sequence[SteerItem], kind: str, seed: int | None, heads: HeadSet, *,
                     max_new_tokens: int) -> list[dict[str, Any]]:
    """The activation-patching form for one head set: ``heads``' outputs from the run where the target is the
    referent (its own expression, same image) patched into each item's run (``patched_answers``)."""
    from vrh_interp.patching.batch import prepare_pairs
    from vrh_interp.patching.head_patching import patched_answers
    from vrh_interp.patching.pairs import PatchingPair

    pairs = [PatchingPair(f"{i.item_id}-steer", "expression_swap", i.target, i.sample, tuple(i.sample.box))
             for i in items]
    prepared = prepare_pairs(vlm, pairs, targets="ground_truth", max_new_tokens=max_new_tokens)
    frame = patched_answers(vlm, prepared, heads, max_new_tokens=max_new_tokens)
    by_pair = {p.pair_id: p for p in pairs}
    key = f"patch:{kind}" + (f":seed={seed}" if seed is not None else "")
    records = []
    for row in frame.to_dict(orient="records"):
        pair = by_pair[row["pair_id"]]
        iou_target, iou_referent = float(row["iou_clean_box"]), float(np.nan_to_num(row["iou_corrupted_box"]))
        result = ("break" if not row["parsed"] else "move" if iou_target >= IOU_THRESHOLD
                  else "stay" if iou_referent >= IOU_THRESHOLD else "break")
        records.append({"form": "patch", "condition": key, "kind": kind, "seed": seed, "alpha": None,
                        "sample_id": pair.corrupted.sample_id, "target_id": pair.clean.sample_id,
                        "answer": row["patched_answer"], "parsed": bool(row["parsed"]), "box": None,
                        "iou_target": iou_target, "iou_referent": iou_referent, "outcome": result})
    return records


RANK_FORM = "rank"


def rank_sweep(records: pd.DataFrame, k: int) -> Any:
    """The rank test's answers (rows with ``kind``, ``seed``, ``sample_id``, ``outcome``: the top-k and the control
    sets at the declared alpha) as the ``sweep.SweepResult`` that ``verdicts.rank_data`` and
    ``designs.sequential_sets`` read, NOT moving as the "correct" outcome (a set at least as harmful as the top-k
    moved at least as many answers); None without records."""
    from vrh_interp.experiments.conditions import Condition
    from vrh_interp.experiments.sweep import SweepResult

    if records is None or records.empty:
        return None
    conditions: dict[str, Condition] = {}
    keys = []
    for kind, seed in zip(records["kind"], records["seed"]):
        condition = Condition(str(kind), k, None if kind == "top" else int(seed), HeadSet())
        conditions.setdefault(condition.key, condition)
        keys.append(condition.key)
    frame = pd.DataFrame({"condition": keys, "sample_id": records["sample_id"].to_list(),
                          "correct": (records["outcome"] != "move").to_numpy(dtype=float)})
    frame = frame.drop_duplicates(["condition", "sample_id"]).reset_index(drop=True)
    return SweepResult(frame, list(conditions.values()), IOU_THRESHOLD, None)


Answer = Callable[[Sequence[str], Sequence["SteerCondition"]], list[dict[str, Any]]]


def curtailed_moves(ids: Sequence[str], stays: int, sets: Sequence["SteerCondition"],
                    answer: Answer) -> list[dict[str, Any]]:
    """The rank test's ``sets`` answered with curtailment (``designs.curtailed_rank``'s order and rule) against a
    top-k that left ``stays`` of the items ``ids`` unmoved: item by item, the sets whose comparison with it is still
    open (``designs.comparison_open`` on the answers NOT moved). ``answer(ids, conditions)``: one record per
    condition and item (``kind``, ``seed``, ``sample_id``, ``outcome``). A set's records stop where its comparison
    was decided."""
    from vrh_interp.experiments.designs import comparison_open

    records: list[dict[str, Any]] = []
    counts = {c.key: 0 for c in sets}
    open_sets = list(sets)
    for j, item in enumerate(ids):
        if not open_sets:
            break
        got = answer([item], open_sets)
        records += got
        by_key = {(c.kind, c.seed): c.key for c in open_sets}
        for r in got:
            counts[by_key[(r["kind"], r["seed"])]] += int(r["outcome"] != "move")
        left = len(ids) - j - 1
        open_sets = [c for c in open_sets if comparison_open(counts[c.key], stays, left)]
    return records


def steer_rank_test(ids: Sequence[str], target: "SteerCondition",
                    draw: Callable[[list[int], set[str]], list["SteerCondition"]], kinds: Sequence[str],
                    answer: Answer, *, total: int = RANK_SETS, first_seed: int | None = None,
                    block: int = RANK_BLOCK, h: int | None = None, folder: Path = Path(".")) -> pd.DataFrame:
    """The sequential rank test of the redirected top-k (module doc): ``designs.sequential_sets`` over the control
    ``kinds``, each block's sets ``draw(seeds, running kinds)`` answered by ``curtailed_moves`` on ``ids``. Returns
    every answer it read (``answer`` resumes from the run's log, so a rerun draws the same blocks)."""
    from vrh_interp.experiments.designs import RANK_H, SCENE_SEEDS, sequential_sets

    k = len(target.heads)
    records = list(answer(list(ids), [target]))  # the top-k on every item first
    stays = sum(r["outcome"] != "move" for r in records)

    def answer_block(seeds: list[int], running: set[str], _folder: Path) -> dict[str, Any]:
        records.extend(curtailed_moves(ids, stays, draw(seeds, running), answer))
        return {"steer": rank_sweep(pd.DataFrame(records), k)}

    sequential_sets([("steer", kind) for kind in kinds], answer_block, folder, k=k, target="top", total=total,
                    first=SCENE_SEEDS if first_seed is None else first_seed, block=block,
                    h=RANK_H if h is None else h)
    return pd.DataFrame(records).drop_duplicates(["condition", "sample_id"]).reset_index(drop=True)


def run_steer(vlm: VLM, items: Sequence[SteerItem], ranking: HeadSet, out: str | Path, *, k: int = 3,
              alphas: Sequence[float] = ALPHAS, random_seeds: Sequence[int] = DOSE_SEEDS, matched: bool = True,
              live: HeadSet | None = None, named: Mapping[str, HeadSet] | None = None, patching: bool = True,
              patch_seeds: int = 5, rank_sets: int = RANK_SETS, rank_items: int = RANK_ITEMS, batch_size: int = 32,
              max_rows: int = 512, max_new_tokens: int = ANSWER_TOKENS, extra_config: Mapping[str, Any] | None = None,
              say: Callable[[str], None] = lambda _: None) -> "SteerResult":
    """Run (or resume) the redirection experiment into ``out`` (module doc) and read it back. ``random_seeds``: the
    dose-response control sets of each kind; ``rank_sets`` / ``rank_items``: the sequential rank test's most sets
    per kind and its items (``rank_sets=0``: none, the rank test then reads the dose-response sets).
    ``patch_seeds``: the patching form runs the top-k, the named sets and the control sets of the first
    ``patch_seeds`` seeds (it is shown beside the claim, not judged)."""
    from vrh_interp.core.execution.backends.base import check_supported
    from vrh_interp.core.execution.backends.select import backend_type
    from vrh_interp.core.bookkeeping.provenance import model_provenance
    from vrh_interp.core.bookkeeping.runs import RunFolder
    from vrh_interp.experiments.designs import RANK_H, SCENE_SEEDS, check_subset

    check_supported(backend_type(vlm), operations=["steering"] + (["patching"] if patching else []))
    if not items:
        raise ValueError("steer needs at least one item")
    if not 0 < k <= len(ranking):
        raise ValueError(f"k={k}: the ranking has {len(ranking)} heads")
    conditions = steer_conditions(ranking, vlm.geometry, k, alphas, random_seeds, matched=matched, live=live,
                                  named=named)
    sets = {"top": (None, ranking[:k]), **{name: (None, heads) for name, heads in (named or {}).items()}}
    sets.update({f"{c.kind}:seed={c.seed}": (c.seed, c.heads) for c in conditions
                 if c.seed is not None and c.seed in list(random_seeds)[:patch_seeds]})
    config = {"kind": STEER.name, "model": model_provenance(vlm), "k": k, "alphas": [float(a) for a in alphas],
              "claim_alpha": float(max(alphas)), "iou_threshold": IOU_THRESHOLD, "max_new_tokens": max_new_tokens,
              "sample_ids": [i.item_id for i in items], "target_ids": [i.target.sample_id for i in items],
              "conditions": {c.key: c.heads.to_list() for c in conditions}, "patching": patching,
              "patch_seeds": patch_seeds if patching else 0,
              "named_sets": {name: heads.to_list() for name, heads in (named or {}).items()},
              "rank": {"sets": rank_sets, "block": RANK_BLOCK, "h": RANK_H, "first_seed": SCENE_SEEDS,
                       "sample_ids": [i.item_id for i in check_subset(items, rank_items)] if rank_sets else []},
              **dict(extra_config or {})}
    folder = RunFolder(out, config)
    log = STEER.open_log(folder)
    stored = log.read()
    done = {(r["condition"], r["sample_id"]) for r in stored}
    started = time.perf_counter()
    per_pass = max(1, max_rows // max(1, min(batch_size, len(items))))
    for start in range(0, len(items), batch_size):
        chunk = list(items[start:start + batch_size])
        todo = [c for c in conditions if any((c.key, i.item_id) not in done for i in chunk)]
        for first in range(0, len(todo), per_pass):
            part = todo[first:first + per_pass]
            for records in _redirected_answers(vlm, chunk, part, max_new_tokens=max_new_tokens):
                log.append(r for r in records if (r["condition"], r["sample_id"]) not in done)
        say(f"redirected items {start + 1}-{start + len(chunk)} of {len(items)} under {len(conditions)} conditions "
            f"({time.perf_counter() - started:.0f} s)")
    if rank_sets > 0:
        _rank_step(vlm, items, ranking[:k], float(max(alphas)), config["rank"]["sample_ids"], log,
                   [r for r in stored if r.get("form") == RANK_FORM], total=rank_sets, matched=matched, live=live,
                   max_rows=max_rows, max_new_tokens=max_new_tokens, folder=Path(out))
        say(f"rank test at alpha {max(alphas):g} on {len(config['rank']['sample_ids'])} items "
            f"({time.perf_counter() - started:.0f} s)")
    if patching:
        for name, (seed, heads) in sets.items():
            kind = name.split(":", 1)[0]
            key = f"patch:{kind}" + (f":seed={seed}" if seed is not None else "")
            missing = [i for i in items if (key, i.item_id) not in done]
            for start in range(0, len(missing), batch_size):
                log.append(_patched_records(vlm, missing[start:start + batch_size], kind, seed, heads,
                                            max_new_tokens=max_new_tokens))
        say(f"patched the {len(sets)} head sets from the target-as-referent runs "
            f"({time.perf_counter() - started:.0f} s)")
    return steer_from_run(out)


def _rank_step(vlm: VLM, items: Sequence[SteerItem], top: HeadSet, alpha: float, ids: Sequence[str], log: Any,
               stored: Sequence[dict[str, Any]], *, total: int, matched: bool, live: HeadSet | None, max_rows: int,
               max_new_tokens: int, folder: Path) -> pd.DataFrame:
    """``steer_rank_test`` with the model: the top-k and the control sets (``conditions.control_conditions``, drawn
    outside the top-k as the dose-response sets are) redirected at ``alpha`` on the items ``ids``, answers read from
    the ``log`` where there (``stored``) and generated (one pass per item and chunk of ``max_rows`` sets) where not."""
    from vrh_interp.experiments.conditions import control_conditions

    known = {(r["condition"], r["sample_id"]): r for r in stored}
    by_id = {i.item_id: i for i in items}
    k = len(top)

    def answer(wanted: Sequence[str], conditions: Sequence[SteerCondition]) -> list[dict[str, Any]]:
        todo = [c for c in conditions if any((f"{RANK_FORM}:{c.key}", i) not in known for i in wanted)]
        chunk = [by_id[i] for i in wanted]
        per_pass = max(1, max_rows // len(chunk))
        for first in range(0, len(todo), per_pass):
            new = []
            for records in _redirected_answers(vlm, chunk, todo[first:first + per_pass], max_new_tokens=max_new_tokens):
                for r in records:
                    key = (f"{RANK_FORM}:{r['condition']}", r["sample_id"])
                    if key not in known:
                        known[key] = {**r, "form": RANK_FORM, "condition": key[0]}
                        new.append(known[key])
            log.append(new)
        return [known[(f"{RANK_FORM}:{c.key}", i)] for c in conditions for i in wanted]

    def draw(seeds: list[int], running: set[str]) -> list[SteerCondition]:
        found = control_conditions(vlm.geometry, top, k, top, seeds, matched="matched" in running,
                                   live=live if "live" in running else None)
        return [SteerCondition(c.kind, c.seed, c.heads, alpha) for c in found if c.kind in running]

    kinds = ["random", *(["matched"] if matched else []), *(["live"] if live is not None else [])]
    return steer_rank_test(list(ids), SteerCondition("top", None, top, alpha), draw, kinds, answer, total=total,
                           folder=folder)


# ----------------------------------------------------------------------------------------------- reading a run
@dataclass(repr=False)
class SteerResult(Card):
    """A finished steer run: its ``records`` (one row per form, condition and item), the ``config`` (manifest)."""

    records: pd.DataFrame
    config: dict[str, Any]
    _claims: pd.DataFrame | None = field(default=None, repr=False)

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        """The verdict, then per head-set kind its move rate at each alpha (not the records frame)."""
        dose = self.dose_response()
        rows = [(str(kind), ", ".join(f"alpha {a:g}: {m:.2f}" for a, m in zip(part["alpha"], part["move_rate"])))
                for kind, part in dose.groupby("kind", sort=False)]
        items = self.records["sample_id"].nunique()
        return (f"SteerResult: top-{self.config.get('k')} redirected, {items} items, sufficient: "
                f"{self.verdict().upper()} (move rates below; dose_response(), rank(), claims(), plot())", rows[:8])

    def dose_response(self) -> pd.DataFrame:
        """Per (head-set kind, alpha): move / stay / break rates over items, pooled over the kind's sets, with the
        number of sets and items (alpha = 0, the unsteered run, is repeated under every kind)."""
        red = self.records[self.records["form"] == "redirect"]
        base = red[red["condition"] == "baseline:alpha=0"]
        rows = []
        kinds = sorted((k for k in dict.fromkeys(red["kind"]) if k != "baseline"), key=_kind_order)
        for kind in kinds:
            rows.append(_rates(base, kind, 0.0))
            part = red[red["kind"] == kind]
            for alpha, at in part.groupby("alpha", sort=True):
                rows.append(_rates(at, kind, float(alpha)))
        return pd.DataFrame(rows)

    def set_rates(self) -> pd.DataFrame:
        """Per redirected condition (kind, seed, alpha): its move / stay / break rates over the items."""
        red = self.records[self.records["form"] == "redirect"]
        rows = []
        for _, part in red.groupby("condition", sort=False):
            first = part.iloc[0]
            rows.append({**_rates(part, str(first["kind"]), float(first["alpha"])), "seed": first["seed"],
                         "condition": first["condition"]})
        return pd.DataFrame(rows)

    def patching(self) -> pd.DataFrame:
        """Per head-set kind of the patching form: move / stay / break rates, pooled over the kind's sets."""
        part = self.records[self.records["form"] == "patch"]
        kinds = sorted(dict.fromkeys(part["kind"]), key=_kind_order)
        return pd.DataFrame([{k: v for k, v in _rates(part[part["kind"] == kind], kind, 0.0).items() if k != "alpha"}
                             for kind in kinds])

    def rank_records(self) -> pd.DataFrame:
        """The rank test's answers in its complete blocks: a run stopped inside a block (a set whose comparison with
        the top-k is still open, ``designs.comparison_open``) leaves that block and later ones out, since an
        unanswered item would read as not moved (``verdicts.rank_data``); a rerun resumes them."""
        from vrh_interp.experiments.designs import comparison_open, rank_blocks

        rank = self.records[self.records["form"] == RANK_FORM]
        setup = self.config.get("rank") or {}
        if rank.empty or not setup:
            return rank
        items = len(setup["sample_ids"])
        top = rank[rank["kind"] == "top"]
        if top["sample_id"].nunique() < items:
            return rank.iloc[0:0]
        stays = int((top["outcome"] != "move").sum())
        sets = rank[rank["kind"] != "top"]
        offsets = [int(seed) - int(setup["first_seed"]) for (_, seed), part in sets.groupby(["kind", "seed"])
                   if comparison_open(int((part["outcome"] != "move").sum()), stays, items - len(part))]
        if not offsets:
            return rank
        cut = next(start for start, stop in rank_blocks(int(setup["sets"]), int(setup["block"]))
                   if start <= min(offsets) < stop)
        return rank[(rank["kind"] == "top") | (rank["seed"].astype(float) < int(setup["first_seed"]) + cut)]

    def rank(self) -> pd.DataFrame:
        """Per control kind of the sequential rank test (module doc): the sets drawn, how many moved at least as
        many answers as the top-k, its p-value and the items; empty without a rank test."""
        from vrh_interp.evaluation.inference import sequential_rank_p
        from vrh_interp.experiments.designs import RANK_H
        from vrh_interp.experiments.verdicts import rank_data

        rows, sweep = [], rank_sweep(self.rank_records(), int(self.config["k"]))
        h = int(self.config.get("rank", {}).get("h", RANK_H))
        for kind in ("random", "matched", "live"):
            ranked = rank_data(sweep, int(self.config["k"]), kind, "zero", "top", IOU_THRESHOLD)
            if ranked is None:
                continue
            p, used = sequential_rank_p(*ranked, h=h)
            rows.append({"kind": kind, "sets": len(ranked[1]), "used": used,
                         "as_many_moved": int(np.sum(ranked[1][:used] <= ranked[0])), "p": p,
                         "items": int(sweep.records["sample_id"].nunique()), "top_move_rate": 1 - ranked[0]})
        return pd.DataFrame(rows)

    def evidence(self) -> Any:
        """Evidence for ``sufficient`` at the declared alpha (module doc); None without control sets."""
        from vrh_interp.evaluation.claims import CLAIMS, causal_test, intersection
        from vrh_interp.experiments.designs import RANK_H
        from vrh_interp.experiments.verdicts import rank_data

        alpha = float(self.config["claim_alpha"])
        red = self.records[self.records["form"] == "redirect"]
        ids = list(self.config["sample_ids"])

        def not_moved(part: pd.DataFrame) -> np.ndarray:
            moved = part.set_index("sample_id")["outcome"].reindex(ids) == "move"
            return 1.0 - moved.to_numpy(dtype=float)

        base = not_moved(red[red["condition"] == "baseline:alpha=0"])
        at = red[red["alpha"] == alpha]
        top = not_moved(at[at["kind"] == "top"])
        k = int(self.config["k"])
        sweep = rank_sweep(self.rank_records(), k)
        h = int(self.config.get("rank", {}).get("h", RANK_H))
        parts, moved, ranks = {}, {}, []
        for kind in ("random", "matched", "live"):
            sets = at[at["kind"] == kind]
            if sets.empty:
                continue
            controls = np.stack([not_moved(s) for _, s in sets.groupby("seed", sort=True)])
            ranked = rank_data(sweep, k, kind, "zero", "top", IOU_THRESHOLD)
            parts[kind] = causal_test(base, top, controls, minimum=CLAIMS["sufficient"].minimum, rank=ranked,
                                      rank_h=h)
            moved[kind] = 1 - float(controls.mean())
            drawn = len(ranked[1]) if ranked is not None else len(controls)
            ranks.append(f"{kind} {parts[kind].parts['special']:.2g} ({drawn} sets)")
        if not parts:
            return None
        rates = "; ".join(f"{kind} {rate:.3f}" for kind, rate in moved.items())
        where = (f"sequential, on {sweep.records['sample_id'].nunique()} items" if sweep is not None
                 else "on the dose-response sets")
        numbers = (f"alpha {alpha:g}, {len(ids)} items: moved to the target: top-{k} "
                   f"{1 - float(top.mean()):.3f} vs alpha 0 {1 - float(base.mean()):.3f}; control sets (mean) {rates}; "
                   f"rank p ({where}) {'; '.join(ranks)}")
        return intersection(parts, numbers)

    def claims(self) -> pd.DataFrame:
        """The claims table of this run (``sufficient`` only), judged by ``claims.judge``."""
        if self._claims is None:
            from vrh_interp.evaluation.claims import CLAIMS, judge

            self._claims = judge({"sufficient": self.evidence()}, specs={"sufficient": CLAIMS["sufficient"]})
        return self._claims

    def verdict(self) -> str:
        return str(self.claims().iloc[0]["verdict"])

    def plot(self, path: str | Path | None = None) -> Any:
        from vrh_interp.viz.plots import plot_dose_response

        return plot_dose_response(self.dose_response(), path, k=int(self.config["k"]),
                                  claim_alpha=float(self.config["claim_alpha"]), sets=self.set_rates())

    def write(self, folder: str | Path) -> dict[str, str]:
        """Records, dose-response, patching and claims as CSV, a JSON summary with the run's provenance, and the
        dose-response plot, into ``folder``; returns ``{name: path}``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written = {}
        for name, frame in (("records.csv", self.records), ("dose_response.csv", self.dose_response()),
                            ("rank.csv", self.rank()), ("patching.csv", self.patching()),
                            ("claims.csv", self.claims())):
            frame.to_csv(folder / name, index=False)
            written[name] = str(folder / name)
        from vrh_interp.core.bookkeeping.provenance import library_versions, now_utc

        summary = {"verdict": self.verdict(), "claim": self.claims().iloc[0].to_dict(),
                   "provenance": {"model": self.config.get("model"), "versions": library_versions(),
                                  "written": now_utc()},
                   "dose_response": self.dose_response().to_dict(orient="records"),
                   "rank": self.rank().to_dict(orient="records"),
                   "patching": self.patching().to_dict(orient="records"),
                   "config": {k: v for k, v in self.config.items() if k not in ("sample_ids", "target_ids")}}
        (folder / "steer.json").write_text(json.dumps(summary, indent=1, default=_json_value) + "\n")
        written["steer.json"] = str(folder / "steer.json")
        self.plot(folder / "dose_response.png")
        written["dose_response.png"] = str(folder / "dose_response.png")
        return written


def _json_value(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return str(value)


KIND_ORDER = ("top", "planted", "decoys", "random", "matched", "live")


def _kind_order(kind: str) -> tuple[int, str]:
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind)


def _rates(part: pd.DataFrame, kind: str, alpha: float) -> dict[str, Any]:
    counts = part["outcome"].value_counts()
    n = max(1, len(part))
    return {"kind": kind, "alpha": alpha, "sets": int(part["condition"].nunique()),
            "items": int(part["sample_id"].nunique()),
            **{f"{name}_rate": float(counts.get(name, 0)) / n for name in OUTCOMES}}


def steer_from_run(run_dir: str | Path) -> SteerResult:
    """A finished (or partial) steer run folder as a ``SteerResult`` (no model needed)."""
    from vrh_interp.core.bookkeeping.runs import whole_run_manifest

    config = whole_run_manifest(Path(run_dir), STEER.name, "a steer run")
    records = pd.DataFrame(STEER.read_log(run_dir).read())
    if records.empty:
        raise ValueError(f"{run_dir} holds no steer records yet")
    order = {key: i for i, key in enumerate(config["conditions"])}
    records["_order"] = records["condition"].map(lambda key: order.get(key, len(order)))
    records["_form"] = (records["form"] == "patch").astype(int)
    records = records.sort_values(["_form", "_order"], kind="stable").drop(columns=["_order", "_form"])
    return SteerResult(records.reset_index(drop=True), config)


def detect_and_steer(vlm: VLM, out: str | Path, *, items: int = 40, detect: int = 20, k: int = 3,
                     alphas: Sequence[float] = ALPHAS, random_seeds: Sequence[int] = DOSE_SEEDS, matched: bool = True,
                     live: bool = True, named: Mapping[str, HeadSet] | None = None, patching: bool = True,
                     patch_seeds: int = 5, rank_sets: int = RANK_SETS, rank_items: int = RANK_ITEMS,
                     heads: HeadSet | None = None, split: str = "eval", difficulty: int = 1, batch_size: int = 32,
                     max_rows: int = 512,
                     say: Callable[[str], None] = lambda _: None) -> SteerResult:
    """The whole experiment on synthetic scenes: score every head on ``detect`` detection scenes (the library's
    default design; kept in ``out/detect``), take the top ``k``, draw the controls (the live pool from the head
    census, kept in ``out/census.csv``) and run ``run_steer`` on ``items`` evaluation items. ``heads``: redirect
    these instead of the detected top-k (no detection pass; k is their number): the calibration, a random set in
    the top-k's place, must not read "holds"."""
    from vrh_interp.core.bookkeeping.provenance import model_provenance
    from vrh_interp.core.bookkeeping.runs import lock_run_folder
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.evaluation.census import live_pool
    from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats

    out = Path(out)
    lock = lock_run_folder(out)  # a run folder from the start: the census may write into it before the manifest
    if heads is not None:
        ranking = vlm.geometry.validate(heads)
        k, source = len(ranking), "given"
        say(f"redirecting the given heads {', '.join(ranking.to_list())} in the top-k's place")
    else:
        detection = synthetic_samples("detect", detect)
        stats = collect_detection_stats(vlm, detection, batch_size=batch_size, max_new_tokens=ANSWER_TOKENS,
                                        run_dir=out / "detect", dataset=f"synthetic:detect:{detect}", progress=False)
        scores = scores_from_stats(stats, "vrh", {"model": model_provenance(vlm),
                                                  "sample_ids": [s.sample_id for s in detection]})
        ranking, source = scores.ranking(), f"synthetic:detect:{detect}"
        say(f"top-{k} by the VRH score on {len(detection)} detection scenes: {', '.join(ranking[:k].to_list())}")
    chosen = steer_items(split, items, difficulty)
    pool = live_pool(vlm, [i.sample for i in chosen], ranking, k, out, say=say)[1] if live else None
    result = run_steer(vlm, chosen, ranking, out, k=k, alphas=alphas, random_seeds=random_seeds, matched=matched,
                       live=pool, named=named, patching=patching, patch_seeds=patch_seeds, rank_sets=rank_sets,
                       rank_items=rank_items, batch_size=batch_size, max_rows=max_rows,
                       extra_config={"detect": source, "data": f"synthetic:{split}:{difficulty}",
                                     "live_pool": None if pool is None else pool.to_list()}, say=say)
    del lock
    return result


def claim_line(result: SteerResult) -> str:
    """``sufficient: HOLDS (reason)``: the claim's verdict in one line."""
    row = result.claims().iloc[0]
    return f"sufficient: {str(row['verdict']).upper()} ({row['reason']})"


def run(spec: Any, vlm: VLM, folder: Path) -> SteerResult:
    """``vrh steer`` / a grid's cell (``builtin_specs.SteerSpec``): ``detect_and_steer`` into ``folder`` and its
    files written. On ``toy:planted`` its planted heads and decoys are redirected too (the positive control)."""
    named = None
    if spec.model == "toy:planted":
        from vrh_interp.experiments.positive_control import declared

        planted, decoys = declared()
        named = {"planted": planted, "decoys": decoys}
    heads = vlm.geometry.validate(spec.heads, "--heads") if spec.heads else None
    result = detect_and_steer(vlm, folder, items=spec.items, detect=spec.detect, k=spec.k, alphas=spec.alphas,
                              random_seeds=list(spec.seeds), matched=spec.matched, live=spec.live, named=named,
                              patching=spec.patching, patch_seeds=spec.patch_seeds, rank_sets=spec.rank_sets,
                              rank_items=spec.rank_items, heads=heads, batch_size=spec.batch_size,
                              max_rows=spec.max_rows,
                              say=(lambda line: print(line, flush=True)) if spec.progress else (lambda _: None))
    result.write(folder)
    return result
