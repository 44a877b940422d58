"""The generic pass engine every condition experiment runs on: ``run_passes`` (resume from the record log, answers
shared by conditions masking the same heads, a log append per pass, the canonical record order), the planner that
packs conditions into batched passes (``condition_passes``) and the pass size (``batch_rows``,
``conditions_per_pass``: a token budget per generation).

Apart from ``experiments.sweep`` because it knows nothing of grounding: what a pass answers is the caller's
(``sweep._GroundingPasses`` for grounding, ``vqa_sweep._VQAPasses`` for VQA).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence, TypeVar

from tqdm.auto import tqdm

from vrh_interp.core.bookkeeping.runs import RecordLog
from vrh_interp.experiments.conditions import Condition, head_signature

DEFAULT_BATCH_TOKENS = 1 << 16
"""Default memory budget of one condition-batched pass: rows x (prompt + new tokens) <= 65,536 tokens."""
DEFAULT_MAX_BATCH_ROWS = 256
"""... and at most this many rows, whatever the sequence length."""

S = TypeVar("S")
A = TypeVar("A")


def batch_rows(sequence_tokens: int, max_batch_rows: int | None = None) -> int:
    """Rows one condition-batched pass may hold: ``max_batch_rows`` when given, else as many as fit
    ``DEFAULT_BATCH_TOKENS`` tokens of ``sequence_tokens`` each (prompt + new tokens), at most
    ``DEFAULT_MAX_BATCH_ROWS``."""
    if max_batch_rows is not None:
        if max_batch_rows < 1:
            raise ValueError("max_batch_rows must be >= 1")
        return max_batch_rows
    return max(1, min(DEFAULT_MAX_BATCH_ROWS, DEFAULT_BATCH_TOKENS // max(1, sequence_tokens)))


def conditions_per_pass(samples: int, sequence_tokens: int, max_batch_rows: int | None = None) -> int:
    """Conditions packed into one generation over a batch of ``samples``: ``batch_rows // samples`` (at least 1:
    a batch bigger than the budget still runs one condition at a time)."""
    return max(1, batch_rows(sequence_tokens, max_batch_rows) // max(1, samples))


def condition_passes(chunks: Iterable[Sequence[S]], conditions: Sequence[Condition], *,
                     unit: Callable[[S], Hashable], done: set[tuple[Hashable, str]],
                     known: dict[tuple[Any, ...], dict[Hashable, A]],
                     answer: Callable[[Sequence[S], Sequence[Condition]], Sequence[Sequence[A]]],
                     per_pass: Callable[[Sequence[S]], int],
                     record: Callable[[S, Condition, A], dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """The experiment planner: every (sample, condition) answer, conditions packed into batched passes.

    For each chunk of samples (a batch, in order), the conditions still lacking records there are reduced to
    their distinct head signatures (``head_signature``: conditions masking the same heads the same way are
    answered once, also across resumes through ``known``) and packed, in order, ``per_pass(samples)`` at a
    time into passes; ``answer(samples, conditions)`` answers one pass (one batched generation: rows =
    conditions x samples) and returns, per condition, one answer per sample. After each pass this yields the
    records that became complete, conditions in order (``record(sample, condition, answer)``), so a caller that
    appends each yielded list to its log in one write loses at most one pass when killed. ``done`` holds the
    (``unit(sample)``, condition key) pairs already recorded; ``known`` maps signatures to answers by unit and
    is filled in."""
    signature = {c.key: head_signature(c) for c in conditions}
    for chunk in chunks:
        todo = {c.key: [s for s in chunk if (unit(s), c.key) not in done] for c in conditions}
        pending = [c for c in conditions if todo[c.key]]
        if not pending:
            continue
        fresh: dict[tuple[Any, ...], list[S]] = {}  # signature -> samples to answer, in chunk order
        first: dict[tuple[Any, ...], Condition] = {}
        for cond in pending:
            sig = signature[cond.key]
            first.setdefault(sig, cond)
            have = known.setdefault(sig, {})
            wanted = {unit(s) for s in fresh.get(sig, [])} | {unit(s) for s in todo[cond.key] if unit(s) not in have}
            fresh[sig] = [s for s in chunk if unit(s) in wanted]
        passes: list[tuple[list[S], list[tuple[Any, ...]]]] = []
        for sig, samples in fresh.items():
            if not samples:
                continue
            same = bool(passes) and [unit(s) for s in passes[-1][0]] == [unit(s) for s in samples]
            if same and len(passes[-1][1]) < max(1, per_pass(samples)):
                passes[-1][1].append(sig)
            else:
                passes.append((samples, [sig]))
        emitted = 0

        def complete() -> list[dict[str, Any]]:
            nonlocal emitted
            out = []
            while emitted < len(pending):
                cond = pending[emitted]
                have = known[signature[cond.key]]
                if any(unit(s) not in have for s in todo[cond.key]):
                    break
                out += [record(s, cond, have[unit(s)]) for s in todo[cond.key]]
                emitted += 1
            return out

        for samples, sigs in passes:
            answers = answer(samples, [first[sig] for sig in sigs])
            for sig, block in zip(sigs, answers):
                known[sig].update({unit(s): a for s, a in zip(samples, block)})
            yield complete()
        tail = complete()
        if tail:
            yield tail
        assert emitted == len(pending), "condition_passes: a condition was left unanswered"


def canonical_log_order(log: RecordLog, key: Callable[[Mapping[str, Any]], Any]) -> None:
    """Rewrite ``log`` (atomically: a temporary file, then a rename) in the order ``key`` gives, when its records
    are not in that order already. Condition-batched runs append pass by pass (chunk, then condition); a finished
    run folder keeps the order of a one-condition-at-a-time run (condition, then sample), so folders do not
    depend on packing, interruptions or shards (``merge_runs`` writes the same bytes)."""
    records = log.read()
    ordered = sorted(records, key=key)
    if ordered == records:
        return
    tmp = log.path.with_name(log.path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(dict(r), sort_keys=True) + "\n" for r in ordered))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, log.path)


def run_passes(log: RecordLog | None, chunks: Sequence[Sequence[S]], conditions: Sequence[Condition], *,
               unit: Callable[[S], Hashable], record_unit: Callable[[Mapping[str, Any]], Hashable],
               answer_of: Callable[[Mapping[str, Any]], A], passes: Any,
               record: Callable[[S, Condition, A], dict[str, Any]],
               canonical: Callable[[Mapping[str, Any]], Any], desc: str, progress: bool,
               skip: frozenset[tuple[Hashable, str]] = frozenset()) -> list[dict[str, Any]]:
    """The loop every condition experiment runs (grounding sweeps, design space, head scan, cross-masking, the VQA
    sweep): the records already in ``log`` are kept (resume) and their answers reused by every condition masking
    the same heads (``head_signature``); the rest are answered pass by pass (``condition_passes`` with
    ``passes.answer`` / ``passes.per_pass``) and appended after each pass; the finished log and the returned
    records are in ``canonical`` order (``canonical_log_order``). ``unit`` names a sample, ``record_unit`` the
    same name read from a record, ``answer_of`` what ``record`` was made from. ``passes.split(chunk, distinct)``
    cuts a chunk into the batches its passes run on (``sweep._GroundingPasses.split``), given the number of distinct
    head sets. ``skip``: (unit, condition key) pairs the design does not ask for (a condition answered on some samples
    only: ``run_conditions``' ``items_of``)."""
    records: list[dict[str, Any]] = log.read() if log else []
    signature = {c.key: head_signature(c) for c in conditions}
    done = {(record_unit(r), r["condition"]) for r in records}
    recorded = len(done)
    done |= skip
    known: dict[tuple[Any, ...], dict[Hashable, A]] = {}
    for row in records:
        if row["condition"] in signature:
            known.setdefault(signature[row["condition"]], {})[record_unit(row)] = answer_of(row)
    bar = tqdm(total=len(conditions) * sum(map(len, chunks)) - len(skip), initial=recorded, desc=desc,
               disable=not progress, unit="answer", leave=False)  # one line while it runs, none after
    distinct = len(set(signature.values()))
    batches = (part for chunk in chunks for part in passes.split(chunk, distinct))
    for new in condition_passes(batches, conditions, unit=unit, done=done, known=known, answer=passes.answer,
                                per_pass=passes.per_pass, record=record):
        if log is not None:
            log.append(new)
        records.extend(new)
        bar.update(len(new))
    bar.close()
    if log is not None:
        canonical_log_order(log, canonical)
    return sorted(records, key=canonical)
