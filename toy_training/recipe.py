"""Each shipped toy model's training lineage as ONE resumable command.

Run: ``python -m toy_training.recipe --model a|b --out DIR [--threads N]``, then
``python -m toy_training.train --model a|b --ship DIR/<last stage> --checkpoint final
--dest vrh_interp/toy/checkpoints`` (the shipped toys; any other folder to keep them unchanged).

Why a recipe: the shipped checkpoints were made in stages (a from-scratch run, then warm restarts that
continue the whole model with the synthetic VQA items in the batch), each stage one recorded
``toy_training.train`` command. A recipe declares those stages as data and runs them in order, each
in its own folder ``DIR/NN-<stage>``; stage ``k`` starts from stage ``k-1``'s FINAL weights (never a
checkpoint chosen on an evaluation set), so the recipe's only selection is the fixed step counts.

Resume: a stage whose ``final/`` folder exists is done and skipped; an unfinished stage resumes from
its trainer state (``train(..., resume=True)``: bit-exact, at most one evaluation interval lost), so a
killed recipe rerun with the same command loses at most one interval of one stage.

Measure: ``python -m toy_training.recipe --model a|b --out DIR --compare`` trains nothing; it measures
every finished stage's final weights on the shipped checkpoint's held-out scenes (level 1/2 on the 200
report scenes, level 1 on the 200 fresh scenes, the VQA items) and prints them beside the SAME stage of
the shipped lineage (``RecipeStage.shipped_table``: the key of that stage's table in the shipped
``training_log.json``), writing ``DIR/comparison-<model>.csv``. Each stage's measurement is cached in
``STAGE/final_eval.json``.

Honesty note: the warm-restart stages are exactly the shipped runs' settings (tested against each
checkpoint's ``training_log.json``), but stage 1 of both shipped lineages was an iterated run (see
docs/toy-models.md); the recipe's from-scratch stages are the clean version of it (the code
defaults), whose end accuracy has not been measured. Model b's recipe trains model a's from-scratch
stage first, because b's language backbone starts from a's (fine-tuned, not frozen).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from vrh_interp.core.bookkeeping.runs import write_json_atomic
from vrh_interp.toy import checkpoint_dir, load
from vrh_interp.toy import weights_sha256 as toy_weights_sha256
from vrh_interp.toy.configs import ModelName
from toy_training.train import (MODEL_PRESETS, REPORT_SCENES, WARM_START_LEVELS, TrainConfig, export_final,
                                  measure_held_out, train)


@dataclasses.dataclass(frozen=True)
class RecipeStage:
    """One training run of a lineage.

    ``start``: "scratch" (a fresh model, stage 1 included), "backbone" (fresh model whose language
    backbone is the PREVIOUS stage's, loaded at stage 2) or "warm" (the previous stage's whole model,
    grounding only, levels 1/2). ``overrides``: ``TrainConfig`` fields on top of the model's preset.
    ``shipped_table``: key of the held-out table of the same stage of the shipped lineage in the shipped
    checkpoint's ``training_log.json`` (``None``: no counterpart).
    """

    name: str
    model: ModelName
    start: str
    overrides: dict
    shipped_table: str | None = None


def _warm_stages(model: ModelName, rows: Sequence[tuple[int, float, int, bool, str]]) -> tuple[RecipeStage, ...]:
    """Warm restarts ``<model>-vqa-1..n`` (seed = the stage's number, evaluated every 400 steps), one row each:
    (grounding steps, peak learning rate, scenes per step whose VQA items join the batch, query probe on the
    one-object VQA rows, the shipped lineage's table of the same stage)."""
    return tuple(RecipeStage(f"{model}-vqa-{seed}", model, "warm",
                             dict(grounding_steps=steps, grounding_lr=lr, seed=seed, eval_every=400,
                                  vqa_batch_scenes=scenes, vqa_query_probe=probe), table)
                 for seed, (steps, lr, scenes, probe, table) in enumerate(rows, 1))


# from-scratch stages: the clean version of the iterated stage 1 (~6,000 grounding steps, as the shipped runs
# had); their shipped counterpart is that iterated stage 1 (kept as ``previous_held_out``)
_A_FROM_SCRATCH = RecipeStage("a-from-scratch", "a", "scratch", dict(grounding_steps=6000, seed=0), "previous_held_out")
_B_FROM_SCRATCH = RecipeStage("b-from-scratch", "b", "backbone", dict(grounding_steps=6000, seed=0),
                              "previous_held_out")

# text-only pre-training of the wide backbone (no image rows, no query probe; the vision stack is untouched)
_CD_TEXT = RecipeStage("cd-text", "c", "scratch", dict(seed=0, grounding_steps=160, grounding_batch_scenes=0,
                                                       vqa_batch_scenes=0, text_batch_scenes=8, warmup_steps=20,
                                                       query_probe_weight=0.0, eval_every=80))

RECIPES: dict[str, tuple[RecipeStage, ...]] = {
    "a": (_A_FROM_SCRATCH, *_warm_stages("a", ((3600, 6e-4, 8, True, "stage2_held_out"),  # runs a4, a5, a6, a7
                                               (1600, 3e-4, 8, True, "stage3_held_out"),
                                               (3200, 4e-4, 8, True, "stage4_held_out"),
                                               (2000, 3e-4, 8, True, "held_out")))),
    "b": (_A_FROM_SCRATCH, _B_FROM_SCRATCH,
          *_warm_stages("b", ((4000, 1.8e-4, 4, False, "stage2_held_out"),  # runs b3, b4, b5
                              (3600, 2.5e-4, 8, True, "stage3_held_out"),
                              (1600, 2e-4, 8, True, "held_out")))),
    # the positive control: a first stage from the SHIPPED toy A's weights (MODEL_PRESETS["planted"].warm_start),
    # then warm restarts with each head paying for its own leak (planted.attention_loss's leak_weight): the
    # second cuts every other head off the image (grounding falls to ~0.3 while the answer learns to read P
    # alone), the third relearns grounding from P at a higher learning rate
    "planted": (RecipeStage("planted", "planted", "scratch", dict(seed=0)),
                RecipeStage("planted-2", "planted", "warm", dict(seed=1, grounding_steps=600, grounding_lr=3e-4,
                                                                  leak_loss_weight=500.0, eval_every=200)),
                RecipeStage("planted-3", "planted", "warm", dict(seed=2, grounding_steps=600, grounding_lr=1e-3,
                                                                  leak_loss_weight=500.0, eval_every=200), "held_out")),
    # the paper's regime (MODEL_PRESETS["c"] / ["d"]): toy A embedded in the 128-head backbone, text-only
    # pre-training of that backbone, then C (A's vision stack) with grounding + VQA + text items and head
    # dropout; D is toy B embedded the same way and trained the same way. C and D share their backbone's
    # ancestry exactly as A and B do (B's backbone was fine-tuned from A's first stage). Putting B's vision stack
    # on C's text-pre-trained backbone was tried first and failed: after 200 steps D boxed no object (0.9 %)
    # and parsed 72 % of its answers (docs/toy-models.md)
    # 0.3 (issue 31): the 0.2 C's 96 inert heads revived (toy_training.grow.revive: function-preserving splits in the
    # donor layers, scaled-up heads in the inserted ones), then 500 more steps with more head dropout, in fp32
    # (bf16 autocast is ~6x slower on CPUs without native bf16). 2026-12-04: the inserted layers 1, 3, 5 still did
    # nothing on images (q / k / v a third of the donor layers'), so each takes the next layer's attention, both
    # halved (toy_training.grow.share_attention), then 400 steps with head dropout so the twins diverge.
    # 0.4 (2026-12-04): the last layer still had heads with no job on any task, so layer 7 takes layer 6's attention
    # the same way, then 800 steps. Toy C ships this recipe's training with seeds moved by SHIPPED_RESEED["c"]
    "c": (_CD_TEXT, RecipeStage("c", "c", "warm", dict(seed=1)),
          RecipeStage("c-revive", "c", "warm", dict(seed=0, grounding_steps=500, eval_every=100, bf16=False,
                                                    head_dropout=0.15, revive_floor=0.25)),
          RecipeStage("c-share", "c", "warm", dict(seed=3, grounding_steps=400, eval_every=100, bf16=False,
                                                   head_dropout=0.15, share_layers=((1, 2), (3, 4), (5, 6)))),
          RecipeStage("c-share7", "c", "warm", dict(seed=10, grounding_steps=800, eval_every=100, bf16=False,
                                                    head_dropout=0.15, share_layers=((7, 6),)),
                      "held_out")),
    # 0.4 (issue 31, item 2): toy C 0.4's language backbone (every head with a job) behind D 0.2's InternVL-class
    # vision stack (toy B's tower and projector), InternVL coordinate tokens started from the LLaVA ones, then
    # multitask steps with head dropout: the pair shares a backbone as the paper's pairs do (one language model, two
    # vision stacks, each tuned on its own), so the transfer claim can be judged on it. 0.5 (2026-12-05): D 0.4's
    # grounding (0.820 fresh) was short of issue 31's 0.90, so two more stages of the same mixture continue it
    # (d-more2's other candidate, 8 grounding scenes a step, reached 0.890 against d-more2's 0.893: not shipped).
    # Tried after 0.5, not shipped (neither met 0.90, the declared rule): a stage after d-more2 that also trains the
    # vision tower (seed 3, lr 3e-4, tower_lr_scale 0.3 / 1.0): 0.893 / 0.889 fresh (docs/toy-models.md).
    # 0.6 (2026-12-05): the errors left were colour binding (items the named colour decides: 23 % missed, the rest
    # 1 %), so d-contrast adds 8 level-1 scenes a step whose colour-decided referents join the batch: 0.928 fresh
    # (the other candidate, 4 scenes, 0.916; both met every goal, the higher ships: the rule declared before training)
    "d": (RecipeStage("d", "d", "scratch", dict(seed=2, grounding_steps=400)),
          RecipeStage("d-on-c", "d", "warm", dict(seed=0, grounding_steps=1000, eval_every=100, bf16=False,
                                                  head_dropout=0.15, language_from=str(checkpoint_dir("c")),
                                                  coordinates_from_llava=True)),
          RecipeStage("d-more", "d", "warm", dict(seed=1, grounding_steps=1000, eval_every=100, bf16=False,
                                                  head_dropout=0.15)),
          RecipeStage("d-more2", "d", "warm", dict(seed=2, grounding_steps=1000, grounding_lr=3e-4, eval_every=250,
                                                   bf16=False, head_dropout=0.15)),
          RecipeStage("d-contrast", "d", "warm", dict(seed=4, grounding_steps=1000, grounding_lr=3e-4, eval_every=250,
                                                      bf16=False, head_dropout=0.15, contrast_batch_scenes=8),
                      "held_out")),
    # the positive control's transfer partner (MODEL_PRESETS["planted-b"]: the SHIPPED toy:planted's backbone behind
    # the shipped toy B's vision stack, one stage); toy:planted-x is made from it without training
    # (``--model planted-x --relabel RUN --out RUN_X``)
    "planted-b": (RecipeStage("planted-b", "planted-b", "scratch", dict(seed=0, bf16=False), "held_out"),),
}

# The stages another training of a recipe retrains (``--reseed``): toy C's heads are decided by its last three
# stages, so its seed spread starts them from toy C 0.2 (the ``c`` stage's weights) with their seeds moved.
SPREAD_FROM: dict[str, str] = {"c": "c-revive"}
# Which training of a recipe is shipped: the seeds of the ``SPREAD_FROM`` stages moved by N (0 where absent). Toy C:
# the last three stages were trained with N = 0, 2, 3 (docs/results/seed-spread.md shows all three); N = 0 left two
# heads with no job on any task (issue 31's census goal), N = 2 met every goal of issue 31. The selection looked at
# the organism's census and grounding only, before any claim was measured on these models, and is declared here and
# in the model card (docs/toy-models.md).
SHIPPED_RESEED: dict[str, int] = {"c": 2}


def trained_stages(model: str, reseed: int | None = None) -> tuple[RecipeStage, ...]:
    """The stages of one training of ``model``'s recipe: ``reseed`` N moves the ``SPREAD_FROM`` stages' seeds by N
    (default: the shipped training's, ``SHIPPED_RESEED``)."""
    offset = SHIPPED_RESEED.get(model, 0) if reseed is None else reseed
    return reseeded(RECIPES[model], offset, SPREAD_FROM.get(model))


def stage_config(stage: RecipeStage, previous_final: Path | None, base_overrides: dict | None = None) -> TrainConfig:
    """The ``TrainConfig`` of one stage, given the previous stage's final weights folder."""
    overrides: dict = {**MODEL_PRESETS[stage.model], **(base_overrides or {}), **stage.overrides, "model": stage.model}
    if stage.start == "scratch":
        return TrainConfig(**overrides)
    if previous_final is None:
        raise ValueError(f"recipe stage {stage.name!r} starts from the previous stage's weights, "
                         "but it is the first stage")
    if stage.start == "backbone":
        return TrainConfig(**{**overrides, "init_backbone": str(previous_final)})
    if stage.start == "warm":
        return TrainConfig(**{**overrides, "warm_start": str(previous_final), "vision_steps": 0,
                              "level_schedule": WARM_START_LEVELS})
    raise ValueError(f"recipe stage {stage.name!r}: start must be 'scratch', 'backbone' or 'warm', not {stage.start!r}")


def stage_folder(out_dir: Path, index: int, stage: RecipeStage) -> Path:
    return out_dir / f"{index:02d}-{stage.name}"


def reseeded(stages: Sequence[RecipeStage], offset: int, first: str | None = None) -> tuple[RecipeStage, ...]:
    """The lineage with the seed of every stage from ``first`` on (default: all) moved by ``offset``: another
    training of the same recipe (the seed-spread runs of issue 31). Stages whose ``final/`` already exists are
    skipped by ``run_recipe`` whatever their seed, so a spread of the last stages starts from the earlier stages'
    weights placed in their folders."""
    names = [stage.name for stage in stages]
    if first is not None and first not in names:
        raise ValueError(f"no recipe stage named {first!r}; the stages are {', '.join(names)}")
    start = names.index(first) if first is not None else 0
    return tuple(stage if index < start else
                 dataclasses.replace(stage, overrides={**stage.overrides,
                                                       "seed": stage.overrides.get("seed", 0) + offset})
                 for index, stage in enumerate(stages))


def run_recipe(stages: Sequence[RecipeStage], out_dir: Path, base_overrides: dict | None = None) -> Path:
    """Run (or resume) every stage in order; returns the last stage's folder (ship it with ``--checkpoint final``)."""
    previous_final: Path | None = None
    folder = out_dir
    for index, stage in enumerate(stages):
        folder = stage_folder(out_dir, index, stage)
        if not (folder / "final").exists():
            print(f"recipe stage {index + 1}/{len(stages)}: {stage.name} -> {folder}")
            train(stage_config(stage, previous_final, base_overrides), folder, resume=True)
            export_final(folder)
        previous_final = folder / "final"
    return folder


STAGE_MEASUREMENT_FILE = "final_eval.json"
VQA_KINDS = ("attribute", "counting", "spatial")


def measure_stage(stage: RecipeStage, folder: Path, n_scenes: int = REPORT_SCENES) -> dict:
    """``measure_held_out`` of a finished stage's final weights (levels 1/2, fresh level 1, VQA).

    Cached in ``folder/final_eval.json`` with the weights file's SHA-256: re-measured if it was measured
    on another number of scenes or on other final weights (a stage retrained after its ``final/`` was deleted).
    """
    cache = folder / STAGE_MEASUREMENT_FILE
    weights_sha256 = toy_weights_sha256(stage.model, folder / "final")
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if (cached.get("n_scenes"), cached.get("weights_sha256")) == (n_scenes, weights_sha256):
            return cached
    model, processor = load(stage.model, folder=folder / "final")
    measured = {"n_scenes": n_scenes, "weights_sha256": weights_sha256,
                **measure_held_out(model, processor, stage.model, n_scenes)}
    write_json_atomic(cache, measured)
    return measured


def compare_with_shipped(stages: Sequence[RecipeStage], out_dir: Path, n_scenes: int = REPORT_SCENES) -> pd.DataFrame:
    """One row per stage: the recipe's final weights measured (``measure_stage``) beside the shipped lineage's
    same stage (its table in the shipped ``training_log.json``; quoted only when ``n_scenes`` is the number
    of scenes those tables were measured on). Unfinished stages get a row with ``finished=False``."""
    rows = []
    for index, stage in enumerate(stages):
        folder = stage_folder(out_dir, index, stage)
        row: dict = {"stage": stage.name, "model": stage.model, "finished": (folder / "final").exists(),
                     "shipped_table": stage.shipped_table}
        if row["finished"]:
            measured = measure_stage(stage, folder, n_scenes)
            level1 = measured["level1"]
            row.update(level1=level1["accuracy"], level1_ci_low=level1["accuracy_ci_low"],
                       level1_ci_high=level1["accuracy_ci_high"],
                       fresh_level1=measured["fresh_level1"]["accuracy"], level2=measured["level2"]["accuracy"],
                       **{f"level2_{kind}": measured[f"level2_{kind}"]["accuracy"]
                          for kind in ("attribute", "relational", "ordinal")},
                       **{f"vqa_{kind}": measured["vqa"][kind]["accuracy"] for kind in VQA_KINDS})
        if stage.shipped_table is not None and n_scenes == REPORT_SCENES:
            log = json.loads((checkpoint_dir(stage.model) / "training_log.json").read_text())
            shipped, shipped_vqa = log[stage.shipped_table], log.get(f"{stage.shipped_table}_vqa", {})
            row.update(shipped_level1=shipped["level1"]["accuracy"], shipped_level2=shipped["level2"]["accuracy"],
                       **{f"shipped_vqa_{kind}": shipped_vqa[kind]["accuracy"]
                          for kind in VQA_KINDS if kind in shipped_vqa})
        rows.append(row)
    table = pd.DataFrame(rows)
    if "level1" in table and "shipped_level1" in table:
        table["level1_minus_shipped"] = table["level1"] - table["shipped_level1"]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(RECIPES), default="a")
    parser.add_argument("--out", type=Path, required=True,
                        help="recipe folder (one subfolder per stage; rerun to resume)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (run with OMP_WAIT_POLICY=PASSIVE)")
    parser.add_argument("--reseed", type=int, default=None, metavar="N",
                        help="another training of the recipe: the seeds of the stages from SPREAD_FROM on (all for "
                             "a, b) + N (default: the shipped training's, SHIPPED_RESEED: 2 for c, 0 for the others)")
    parser.add_argument("--compare", action="store_true",
                        help="train nothing: measure every finished stage and print it beside "
                             "the shipped lineage's same stage")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.compare:
        if not args.out.is_dir():
            parser.error(f"--out {args.out} is not a folder: pass the folder a recipe was trained into "
                         "(--compare trains nothing)")
        table = compare_with_shipped(trained_stages(args.model), args.out)
        table.to_csv(args.out / f"comparison-{args.model}.csv", index=False)
        print(table.drop(columns=["model"]).round(3).to_string(index=False))
        return
    last = run_recipe(trained_stages(args.model, args.reseed), args.out)
    print(f"done: ship with  python -m toy_training.train --model {RECIPES[args.model][-1].model} --ship {last} "
          "--checkpoint final --dest vrh_interp/toy/checkpoints")


if __name__ == "__main__":
    main()
