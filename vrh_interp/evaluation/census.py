"""Census of a model's head pool: which heads measurably act, so that controls cannot be carried by dead heads.

A random control set drawn from a pool that is mostly inert heads costs nothing by construction, and "the top-k
hurts more than random heads" then says little (toy C before its rebuild: 96 of 128 heads near-inert). Per head:

* ``norm_ratio``: the Frobenius norm of the head's columns of the output projection, relative to the
  90th-percentile head's (a head writes nothing when this is small); **inert by norm** below ``NORM_FLOOR``
  (a quarter);
* ``effect``: the mean KL divergence (nats per answer token) of the model's next-token distributions on a batch
  of items when the head alone is zero-ablated, against the unmasked model, with the unmasked greedy answer
  teacher-forced (one forward per head, heads batched as conditions); **inert by effect** below
  ``EFFECT_FLOOR`` of the 90th-percentile head's effect.

Live heads are those inert by neither rule: the pool of the live-head control (``controls.live_control``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from vrh_interp.core.execution.interventions import (condition_ablation, generate_conditions, replicate_encoding,
                                                     run_forward)
from vrh_interp.core.description.model import VLM
from vrh_interp.core.bookkeeping.runs import write_atomic
from vrh_interp.core.execution.templates.ablation import ZERO_ABLATION

NORM_FLOOR = 0.25
EFFECT_FLOOR = 0.01
CENSUS_ITEMS = 6  # one small batch: the effects rank heads by orders of magnitude, not by fine differences
CENSUS_CSV = "census.csv"


def output_norms(vlm: VLM) -> np.ndarray:
    """[layers, heads] norm of each head's columns of the output projection (read off the weights)."""
    geometry = vlm.geometry
    d = geometry.head_dim
    rows = []
    for layer in range(geometry.num_layers):
        weight = vlm.adapter.output_projection(vlm.hf_model, layer).weight.detach().float()
        rows.append([float(weight[:, h * d:(h + 1) * d].norm()) for h in range(geometry.num_heads)])
    return np.array(rows)


@torch.no_grad()
def single_head_effects(vlm: VLM, samples: Sequence, *, max_new_tokens: int = 24,
                        heads_per_pass: int = 16) -> np.ndarray:
    """[layers, heads] mean KL(unmasked || head masked alone) per answer token on ``samples`` (one batch)."""
    from vrh_interp.evaluation.grounding import encode_samples

    geometry = vlm.geometry
    batch = encode_samples(vlm, samples)
    ids = generate_conditions(vlm, batch.encoding, [(None, ZERO_ABLATION)], max_new_tokens=max_new_tokens)[0]
    lengths = [max(1, n) for n in vlm.answer_lengths(ids, batch.prompt_length)]
    answers = [row[batch.prompt_length:batch.prompt_length + n].tolist() for row, n in zip(ids, lengths)]
    encoding = vlm.teacher_forced(batch, answers)
    rows = len(samples)
    start = batch.prompt_length - 1
    width = max(lengths)
    mask = torch.zeros(rows, width)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    base = torch.log_softmax(run_forward(vlm, encoding).logits[:, start:start + width].float(), dim=-1)
    base_p = base.exp()  # once, not per head
    heads = list(geometry.all_heads())
    effects = np.zeros(len(heads))
    for first in range(0, len(heads), heads_per_pass):
        chunk = heads[first:first + heads_per_pass]
        conditions = [(HeadSet([h]), ZERO_ABLATION) for h in chunk]
        template = condition_ablation(vlm, conditions, rows)
        logits = run_forward(vlm, replicate_encoding(encoding, len(chunk)), [template]).logits
        masked = torch.log_softmax(logits[:, start:start + width].float(), dim=-1).split(rows, dim=0)
        for j, part in enumerate(masked):
            kl = (base_p * (base - part)).sum(-1)  # [rows, width]
            effects[first + j] = float((kl * mask).sum() / mask.sum())
    return effects.reshape(geometry.num_layers, geometry.num_heads)


@dataclass
class Census:
    """Per head: output norm (and ratio to the 90th-percentile head), single-head effect, and the two rules."""

    table: pd.DataFrame  # columns head, layer, index, norm, norm_ratio, effect, effect_ratio, inert_norm,
    # inert_effect, live
    items: int

    @property
    def live(self) -> HeadSet:
        return HeadSet(Head.parse(h) for h in self.table.loc[self.table["live"], "head"])

    @property
    def inert(self) -> HeadSet:
        return HeadSet(Head.parse(h) for h in self.table.loc[~self.table["live"], "head"])

    def summary(self) -> dict:
        t = self.table
        return {"heads": len(t), "items": self.items, "live": int(t["live"].sum()),
                "inert_by_norm": int(t["inert_norm"].sum()), "inert_by_effect": int(t["inert_effect"].sum()),
                "inert": [h for h in t.loc[~t["live"], "head"]],
                "norm_floor": NORM_FLOOR, "effect_floor": EFFECT_FLOOR}

    def control_pool(self, detected: HeadSet, k: int) -> HeadSet | None:
        """The live heads, when at least ``k`` of them lie outside ``detected`` (a live-head control of size k can
        be drawn); else None."""
        outside = [h for h in self.live if h not in set(detected)]
        return self.live if len(outside) >= k else None

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.table.assign(items=self.items).to_csv(index=False))

    @classmethod
    def load(cls, path: str | Path, model: int | HeadGeometry) -> "Census":
        """A census saved by ``save``, checked like an input: refused (``ValueError`` naming the file) when it is
        damaged (a flag column not exactly True/False, a head named twice) or does not describe the model (``model``:
        its ``HeadGeometry``, whose heads must be exactly the file's, or its head count)."""
        def flags(column: pd.Series, name: str) -> pd.Series:
            text = column.astype(str).str.strip()
            if not text.isin(("True", "False")).all():
                bad = column[~text.isin(("True", "False"))].iloc[0]
                raise ValueError(f"column {name!r} holds {bad!r} where True or False belongs")
            return text == "True"

        try:
            table = pd.read_csv(path, keep_default_na=False)
            items = int(table.pop("items").iloc[0])
            for name in ("live", "inert_norm", "inert_effect"):
                table[name] = flags(table[name], name)
            heads = [Head.parse(h) for h in table["head"]]
            if len(set(heads)) != len(heads):
                raise ValueError("a head is listed twice")
        except (OSError, ValueError, KeyError, IndexError, pd.errors.ParserError) as error:
            raise ValueError(f"{path}: not a head census written by vrh-interp ({error}); remove it to measure "
                             "the census again") from None
        total = model if isinstance(model, int) else model.total_heads
        if len(table) != total:
            raise ValueError(f"{path}: a census of {len(table)} heads, but the model has {total}: this run "
                             "folder belongs to another model (use another --out)")
        if not isinstance(model, int):
            foreign = sorted(set(heads) - set(model.all_heads()))
            if foreign:
                raise ValueError(f"{path}: names {', '.join(map(str, foreign[:3]))}, which the model "
                                 f"({model.num_layers} layers x {model.num_heads} heads) does not have: remove the "
                                 "file to measure the census again")
        return cls(table, items)

    def line(self) -> str:
        s = self.summary()
        return (f"head census: {s['live']} of {s['heads']} heads live; inert by output norm (< {NORM_FLOOR:g} of the "
                f"90th-percentile head's) {s['inert_by_norm']}, by single-head effect (< {EFFECT_FLOOR:g} of the "
                f"90th-percentile head's KL on {s['items']} items) {s['inert_by_effect']}")


def census(vlm: VLM, samples: Sequence, *, max_new_tokens: int = 24) -> Census:
    """The head census of ``vlm`` on ``samples`` (module doc; a small batch is enough: use ~8 items)."""
    norms = output_norms(vlm)
    effects = single_head_effects(vlm, samples, max_new_tokens=max_new_tokens)
    norm_ratio = norms / max(float(np.percentile(norms, 90)), 1e-12)
    effect_ratio = effects / max(float(np.percentile(effects, 90)), 1e-12)
    geometry = vlm.geometry
    rows = []
    for layer in range(geometry.num_layers):
        for h in range(geometry.num_heads):
            inert_norm = bool(norm_ratio[layer, h] < NORM_FLOOR)
            inert_effect = bool(effect_ratio[layer, h] < EFFECT_FLOOR)
            rows.append({"head": str(Head(layer, h)), "layer": layer, "index": h, "norm": float(norms[layer, h]),
                         "norm_ratio": float(norm_ratio[layer, h]), "effect": float(effects[layer, h]),
                         "effect_ratio": float(effect_ratio[layer, h]), "inert_norm": inert_norm,
                         "inert_effect": inert_effect, "live": not (inert_norm or inert_effect)})
    return Census(pd.DataFrame(rows), len(samples))


def run_census(vlm: VLM, samples: Sequence, run_dir: str | Path | None = None, *, items: int = CENSUS_ITEMS,
               max_new_tokens: int = 24) -> Census:
    """The census of a run on its first ``items`` samples, kept in ``run_dir/census.csv``: a rerun reads it back
    instead of measuring again, so a resumed run draws its live-head controls from the same pool on any machine
    (a head near a floor could otherwise flip with float rounding and change the run's conditions)."""
    path = Path(run_dir) / CENSUS_CSV if run_dir is not None else None
    if path is not None and path.exists():
        return Census.load(path, vlm.geometry)
    pool = census(vlm, list(samples)[:items], max_new_tokens=max_new_tokens)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        pool.save(path)
    return pool


def live_pool(vlm: VLM, samples: Sequence, ranking: HeadSet, largest: int, run_dir: str | Path | None = None, *,
              items: int = CENSUS_ITEMS, max_new_tokens: int = 24,
              say: Callable[[str], None] = lambda _: None) -> tuple[Census | None, HeadSet | None]:
    """The census of a run (``run_census``) and the pool its live-head controls of up to ``largest`` heads are drawn
    from, outside ``ranking[:largest]`` (``Census.control_pool``; None when too few live heads lie there). The
    census line and that shortfall go to ``say``. ``(None, None)`` when ``largest`` is 0 (no control to draw)."""
    if largest == 0:
        return None, None
    pool = run_census(vlm, samples, run_dir, items=items, max_new_tokens=max_new_tokens)
    say(pool.line())
    live = pool.control_pool(ranking[:largest], largest)
    if live is None:
        say(f"note: too few live heads outside the top {largest}: no live-head control")
    return pool, live
