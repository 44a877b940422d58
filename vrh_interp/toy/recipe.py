"""Each shipped toy model's training lineage as ONE resumable command.

Run: ``python -m vrh_interp.toy.recipe --model a|b --out DIR [--threads N]``, then
``python -m vrh_interp.toy.train --model a|b --ship DIR/<last stage> --checkpoint final``.

Why a recipe: the shipped checkpoints were made in stages (a from-scratch run, then warm restarts that
continue the whole model with the synthetic VQA items in the batch), each stage one recorded
``vrh_interp.toy.train`` command. A recipe declares those stages as data and runs them in order, each
in its own folder ``DIR/NN-<stage>``; stage ``k`` starts from stage ``k-1``'s FINAL weights (never a
checkpoint chosen on an evaluation set), so the recipe's only selection is the fixed step counts.

Resume: a stage whose ``final/`` folder exists is done and skipped; an unfinished stage resumes from
its trainer state (``train(..., resume=True)``: bit-exact, at most one evaluation interval lost), so a
killed recipe rerun with the same command loses at most one interval of one stage.

Honesty note: the warm-restart stages are exactly the shipped runs' settings (tested against each
checkpoint's ``training_log.json``), but stage 1 of both shipped lineages was an iterated run (see
docs/toy-models.md); the recipe's from-scratch stages are the clean version of it (the code
defaults), whose end accuracy has not been measured. Model b's recipe trains model a's from-scratch
stage first, because b's language backbone starts from a's (fine-tuned, not frozen).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch

from vrh_interp.toy.configs import ModelName
from vrh_interp.toy.train import MODEL_PRESETS, WARM_START_LEVELS, TrainConfig, export_final, train


@dataclasses.dataclass(frozen=True)
class RecipeStage:
    """One training run of a lineage.

    ``start``: "scratch" (a fresh model, stage 1 included), "backbone" (fresh model whose language
    backbone is the PREVIOUS stage's, loaded at stage 2) or "warm" (the previous stage's whole model,
    grounding only, levels 1/2). ``overrides``: ``TrainConfig`` fields on top of the model's preset.
    """

    name: str
    model: ModelName
    start: str
    overrides: dict


def _warm(name: str, model: ModelName, steps: int, lr: float, seed: int, vqa_scenes: int, vqa_query_probe: bool) -> RecipeStage:
    return RecipeStage(name, model, "warm", dict(grounding_steps=steps, grounding_lr=lr, seed=seed, eval_every=400,
                                                  vqa_batch_scenes=vqa_scenes, vqa_query_probe=vqa_query_probe))


# from-scratch stages: the clean version of the iterated stage 1 (~6,000 grounding steps, as the shipped runs had)
_A_FROM_SCRATCH = RecipeStage("a-from-scratch", "a", "scratch", dict(grounding_steps=6000, seed=0))
_B_FROM_SCRATCH = RecipeStage("b-from-scratch", "b", "backbone", dict(grounding_steps=6000, seed=0))

RECIPES: dict[str, tuple[RecipeStage, ...]] = {
    "a": (
        _A_FROM_SCRATCH,
        _warm("a-vqa-1", "a", steps=3600, lr=6e-4, seed=1, vqa_scenes=8, vqa_query_probe=True),  # run a4
        _warm("a-vqa-2", "a", steps=1600, lr=3e-4, seed=2, vqa_scenes=8, vqa_query_probe=True),  # run a5
        _warm("a-vqa-3", "a", steps=3200, lr=4e-4, seed=3, vqa_scenes=8, vqa_query_probe=True),  # run a6
        _warm("a-vqa-4", "a", steps=2000, lr=3e-4, seed=4, vqa_scenes=8, vqa_query_probe=True),  # run a7
    ),
    "b": (
        _A_FROM_SCRATCH,
        _B_FROM_SCRATCH,
        _warm("b-vqa-1", "b", steps=4000, lr=1.8e-4, seed=1, vqa_scenes=4, vqa_query_probe=False),  # run b3
        _warm("b-vqa-2", "b", steps=3600, lr=2.5e-4, seed=2, vqa_scenes=8, vqa_query_probe=True),  # run b4
        _warm("b-vqa-3", "b", steps=1600, lr=2e-4, seed=3, vqa_scenes=8, vqa_query_probe=True),  # run b5
    ),
}


def stage_config(stage: RecipeStage, previous_final: Path | None, base_overrides: dict | None = None) -> TrainConfig:
    """The ``TrainConfig`` of one stage, given the previous stage's final weights folder."""
    overrides: dict = {**MODEL_PRESETS[stage.model], **(base_overrides or {}), **stage.overrides, "model": stage.model}
    if stage.start == "scratch":
        return TrainConfig(**overrides)
    if previous_final is None:
        raise ValueError(f"recipe stage {stage.name!r} starts from the previous stage's weights, but it is the first stage")
    if stage.start == "backbone":
        return TrainConfig(**{**overrides, "init_backbone": str(previous_final)})
    if stage.start == "warm":
        return TrainConfig(**{**overrides, "warm_start": str(previous_final), "vision_steps": 0,
                              "level_schedule": WARM_START_LEVELS})
    raise ValueError(f"recipe stage {stage.name!r}: start must be 'scratch', 'backbone' or 'warm', not {stage.start!r}")


def stage_folder(out_dir: Path, index: int, stage: RecipeStage) -> Path:
    return out_dir / f"{index:02d}-{stage.name}"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(RECIPES), default="a")
    parser.add_argument("--out", type=Path, required=True, help="recipe folder (one subfolder per stage; rerun to resume)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (run with OMP_WAIT_POLICY=PASSIVE)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    last = run_recipe(RECIPES[args.model], args.out)
    print(f"done: ship with  python -m vrh_interp.toy.train --model {args.model} --ship {last} --checkpoint final")


if __name__ == "__main__":
    main()
