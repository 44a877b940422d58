"""Model specs and data specs checked before torch loads (``apps.cli._check_inputs``, the demo, ``experiments.grid``):
a mistyped ``toy:NAME`` / ``tiny:FAMILY``, a toy whose checkpoint is not shipped, a local model folder that is not
one, a k beyond the model's heads (the head grid read from ``config.json`` or the tiny recipe, no weights) and
detection and evaluation samples that overlap (synthetic specs, whose sample ids follow from the spec, and parts of
one seeded split, ``data.sources.SplitPart``, that are not its two disjoint parts). A hub id
cannot be checked offline: it is left to the loader (``core.description.model_source``), which asks the hub.
Standard library only, besides the torch-free name tables it reads (``toy.names``,
``core.description.families.registry``)."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Iterable

from vrh_interp.toy import names as toys


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def tiny_names() -> list[str]:
    """Every ``tiny:NAME`` that ``core.description.tiny.build_tiny`` builds: the families' recipes and their
    variants."""
    from vrh_interp.core.description.families.registry import TINY_RECIPES

    return list(TINY_RECIPES)


def check_model(spec: str, option: str = "--model") -> None:
    """Refuse (``ValueError``, one line naming ``option``) a ``toy:`` spec that names no toy or one whose checkpoint
    is not shipped and a ``tiny:`` spec that names no fixture; a local folder is checked by
    ``core.description.model_source.check_local_model``; a hub id cannot be checked offline and is accepted here."""
    kind, _, name = spec.partition(":")
    if kind == "toy" and spec.startswith("toy:"):
        shipped = [f"toy:{n}" for n in toys.shipped_names()]
        if name not in toys.FAMILIES:
            raise ValueError(f"{option} {spec!r}: no such toy model{_suggest(spec, shipped)}: the shipped toys are "
                             f"{', '.join(shipped)}")
        if not toys.is_shipped(name):
            raise ValueError(f"{option} {spec!r}: its checkpoint is not shipped in this installation: the shipped "
                             f"toys are {', '.join(shipped)}")
        return
    if kind == "tiny" and spec.startswith("tiny:"):
        known = tiny_names()
        if name not in known:
            raise ValueError(f"{option} {spec!r}: no such tiny family{_suggest(spec, ['tiny:' + n for n in known])}: "
                             f"use one of {', '.join('tiny:' + n for n in known)}")
        return
    from vrh_interp.core.description.model_source import check_local_model

    check_local_model(spec)


def head_grid(spec: str) -> tuple[int, int] | None:
    """``(layers, heads per layer)`` of the model ``spec`` names, read without weights: a toy's or a local folder's
    ``config.json``, a tiny recipe's text config; None where it cannot be known before loading (a hub id, a
    config that does not say)."""
    kind, _, name = spec.partition(":")
    if kind == "toy":
        return toys.head_grid(name) if name in toys.FAMILIES else None
    if kind == "tiny":
        from vrh_interp.core.description.families.registry import TINY_RECIPES

        recipe = TINY_RECIPES.get(name)
        text = getattr(recipe.text_config, "kwargs", recipe.text_config) if recipe is not None else None
        return toys.config_head_grid(dict(text)) if text is not None else None
    config = Path(spec) / "config.json"
    try:
        return toys.config_head_grid(json.loads(config.read_text(encoding="utf-8"))) if config.is_file() else None
    except (OSError, ValueError):
        return None


def check_ks_fit(ks: str, spec: str, option: str = "--ks") -> None:
    """Refuse k values larger than the model's head count (known before loading: ``head_grid``)."""
    grid = head_grid(spec)
    if grid is None:
        return
    from vrh_interp.experiments.ks import parse_ks

    total = grid[0] * grid[1]
    above = [k for k in parse_ks(ks, total) if k > total]
    if above:
        raise ValueError(f"{option} {ks}: k {', '.join(map(str, above))} is more than the {total} heads of {spec} "
                         f"({grid[0]} layers x {grid[1]} heads): pass k values up to {total}")


def check_heads_fit(heads: Iterable[object], spec: str, option: str) -> None:
    """Refuse heads (``core.description.heads.Head``: ``layer``, ``head``) off the model's grid (known before
    loading)."""
    grid = head_grid(spec)
    if grid is None:
        return
    off = [h for h in heads if not (0 <= h.layer < grid[0] and 0 <= h.head < grid[1])]  # type: ignore[attr-defined]
    if off:
        verb = "is not a head" if len(off) == 1 else "are not heads"
        # a published list (``core.description.published``): say whose grid it is
        source = getattr(heads, "source", None)
        origin = (f"; {source.spec} holds heads of {source.model.name} ({source.model.grid}): published heads "
                  "transfer by index only to a model with the same language backbone"
                  if hasattr(source, "model") and hasattr(source, "spec") else "")
        raise ValueError(f"{option}: {', '.join(map(str, off[:3]))} {verb} of {spec} ({grid[0]} layers x {grid[1]} "
                         f"heads: L0H0 .. L{grid[0] - 1}H{grid[1] - 1}){origin}")


def _scores_json(path: str) -> dict:
    """A scores file (``scoring.scores.HeadScores.save``) read as JSON without torch; {} for a file that is not one
    (``HeadScores.load`` says so when the run reads it)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def scores_sample_ids(path: str) -> list[str]:
    """The detection sample ids a scores file lists."""
    ids = _scores_json(path).get("sample_ids")
    return [str(i) for i in ids] if isinstance(ids, list) else []


def scores_grid(path: str) -> tuple[int, int, str] | None:
    """``(layers, heads per layer, model id)`` of a scores file (its ``scores`` matrix and provenance); None for a
    file that does not say."""
    data = _scores_json(path)
    matrix = data.get("scores")
    if not (isinstance(matrix, list) and matrix and isinstance(matrix[0], list)):
        return None
    model = data.get("provenance", {}).get("model") if isinstance(data.get("provenance"), dict) else None
    name = model.get("model_id") if isinstance(model, dict) else None
    return len(matrix), len(matrix[0]), str(name or "a model the scores file does not name")


def check_scores_fit(path: str, spec: str, option: str) -> None:
    """Refuse a scores file of a head grid larger than the model's (both known before loading): its ranking names
    heads the model does not have, which ``HeadScores.transfer_to`` would refuse only after the model loads (the same
    words). A grid the model contains is another model's scores by index (a transfer, said when they load)."""
    grid, scored = head_grid(spec), scores_grid(path)
    if grid is not None and scored is not None and (scored[0] > grid[0] or scored[1] > grid[1]):
        layers, heads, name = scored
        raise ValueError(f"{option} {path}: the scores were computed on {name} ({layers} layers x {heads} heads), but "
                         f"this model ({spec}) has {grid[0]} layers x {grid[1]} heads: heads up to "
                         f"L{layers - 1}H{heads - 1} do not exist in it. Use scores computed on this model (vrh "
                         "detect), or on one whose head grid it contains")


_SYNTHETIC_ID = re.compile(r"^([a-z]+)-(\d+)-L(\d+)-o\d+$")


def synthetic_scenes(spec: str) -> tuple[str, int, int] | None:
    """``(split, scenes, level)`` of a ``synthetic:SPLIT:N[:LEVEL]`` spec; None for any other spec."""
    from vrh_interp.data.sources import DataSpecError, _synthetic_args, parse_spec

    try:
        parsed = parse_spec(spec)
        return _synthetic_args(parsed) if parsed.kind == "synthetic" else None
    except DataSpecError:
        return None


def check_disjoint_parts(detect: str, evaluate: str, detect_option: str, eval_option: str) -> None:
    """Refuse two specs of the same data whose split options (``data.sources.SplitPart``) do not make them
    disjoint: the detection and the evaluation part of one split (the same ``split_seed=``, the evaluation's
    ``detect=`` at least the detection's) are; a part and the whole data, two parts of one role or of other seeds
    are not."""
    from vrh_interp.data.sources import DataSpecError, data_part

    try:
        (first, one), (second, other) = data_part(detect), data_part(evaluate)
    except DataSpecError:
        return  # the spec's own check says what is wrong with it
    if first != second or (one is None and other is None):
        return
    if one is not None and other is not None and one.role != other.role and one.seed == other.seed:
        detection, evaluation = (one, other) if one.role == "detection" else (other, one)
        if evaluation.detect >= detection.detect:
            return
    raise ValueError(f"{eval_option} {evaluate} overlaps {detect_option} {detect}: both read {first} and their "
                     "split options do not keep them apart: give both the same detect= and split_seed=, the first "
                     "role=detection, the second role=evaluation")


def check_disjoint_specs(detect: str, evaluate: str, detect_option: str, eval_option: str) -> None:
    """Refuse two synthetic specs whose samples overlap (the same split and level: both start at scene 0), and
    two parts of one data spec that overlap (``check_disjoint_parts``)."""
    check_disjoint_parts(detect, evaluate, detect_option, eval_option)
    first, second = synthetic_scenes(detect), synthetic_scenes(evaluate)
    if first is None or second is None or (first[0], first[2]) != (second[0], second[2]):
        return
    shared = min(first[1], second[1])
    raise ValueError(f"{eval_option} {evaluate} overlaps {detect_option} {detect}: both are scenes 0..{shared - 1} of "
                     f"the {first[0]!r} split: evaluate on samples the heads were not detected on (detection "
                     "synthetic:detect:N, evaluation synthetic:eval:N)")


def check_scores_disjoint(sample_ids: Iterable[str], evaluate: str, scores_option: str, eval_option: str) -> None:
    """Refuse a synthetic evaluation spec that holds samples the scores were detected on (``sample_ids`` of a
    head-scores file)."""
    scenes = synthetic_scenes(evaluate)
    if scenes is None:
        return
    split, count, level = scenes
    shared = sorted(m[0] for m in (_SYNTHETIC_ID.match(s) for s in sample_ids if isinstance(s, str))
                    if m and m[1] == split and int(m[3]) == level and int(m[2]) < count)
    if shared:
        raise ValueError(f"{eval_option} {evaluate} overlaps the samples the {scores_option} heads were detected on "
                         f"({len(shared)} shared, e.g. {shared[0]}; detection and evaluation samples must be "
                         "disjoint): evaluate on samples of another split, e.g. "
                         f"synthetic:{'eval' if split != 'eval' else 'train'}:{count}")
