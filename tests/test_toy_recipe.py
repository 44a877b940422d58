"""Toy training recipes: the declared stages are the shipped runs, chained by final weights, resumable."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from toy_training import recipe
from toy_training import train as trainer
from vrh_interp.toy import checkpoint_dir, load

TINY_STAGES = (
    recipe.RecipeStage("first", "a", "scratch", dict(vision_steps=2, grounding_steps=2, eval_every=2)),
    recipe.RecipeStage("second", "a", "warm", dict(grounding_steps=3, eval_every=2, seed=1, vqa_batch_scenes=1)),
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _portable(config: trainer.TrainConfig) -> trainer.TrainConfig:
    """Paths into the shipped checkpoints folder made independent of where the checkout lives (planted-b's preset
    starts from toy B's and toy:planted's shipped folders: its log holds the trainer's absolute paths)."""
    marker = "/vrh_interp/toy/checkpoints/"
    return dataclasses.replace(config, **{
        f.name: "<checkpoints>/" + value.split(marker, 1)[1]
        for f in dataclasses.fields(config)
        if isinstance(value := getattr(config, f.name), str) and marker in value})


@pytest.mark.parametrize("name", ["a", "b", "c", "d", "planted-b"])
def test_last_recipe_stage_is_the_shipped_run(name: str) -> None:
    log = json.loads((checkpoint_dir(name) / "training_log.json").read_text())
    shipped = trainer.config_from_json(log["config"])
    stage = recipe.stage_config(recipe.trained_stages(name)[-1],
                                Path(shipped.warm_start) if shipped.warm_start else None)
    assert _portable(stage) == _portable(shipped)


def test_b_recipe_starts_from_a_backbone_trained_in_the_same_folder(tmp_path: Path) -> None:
    a_first, b_first = recipe.RECIPES["a"][0], recipe.RECIPES["b"][0]
    assert recipe.stage_folder(tmp_path, 0, a_first) == recipe.stage_folder(tmp_path, 0, b_first)  # shared, run once
    config = recipe.stage_config(recipe.RECIPES["b"][1], tmp_path / "00-a-from-scratch" / "final")
    assert (config.model, config.init_backbone, config.warm_start) == (
        "b", str(tmp_path / "00-a-from-scratch" / "final"), None)
    with pytest.raises(ValueError, match="first stage"):
        recipe.stage_config(recipe.RECIPES["b"][1], None)


def _model_weights(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(str(folder / trainer.CHECKPOINT_FILE)).items() if k.startswith("model.")}


def test_recipe_chains_final_weights_and_resumes_after_a_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = dict(trainer.TINY_TEST_CONFIG)
    last = recipe.run_recipe(TINY_STAGES, tmp_path / "uninterrupted", base)
    assert last == tmp_path / "uninterrupted" / "01-second"
    second = trainer.config_from_json(json.loads((last / "train_config.json").read_text()))
    assert second.warm_start == str(tmp_path / "uninterrupted" / "00-first" / "final")
    assert (second.vision_steps, second.grounding_steps) == (0, 3)

    real_step = trainer.training_step

    def killed_in_second_stage(cfg, model, heads, processor, optimizer, step):
        if cfg.warm_start is not None and step == 2:
            raise KeyboardInterrupt("simulated kill")
        return real_step(cfg, model, heads, processor, optimizer, step)

    monkeypatch.setattr(trainer, "training_step", killed_in_second_stage)
    with pytest.raises(KeyboardInterrupt):
        recipe.run_recipe(TINY_STAGES, tmp_path / "killed", base)
    first_final = (tmp_path / "killed" / "00-first" / "final" / "model.safetensors").read_bytes()
    assert not (tmp_path / "killed" / "01-second" / "final").exists()

    stages_trained: list[int] = []
    real_train = trainer.train

    def counting_train(config, out_dir, resume):
        stages_trained.append(config.grounding_steps)
        return real_train(config, out_dir, resume)

    monkeypatch.setattr(trainer, "training_step", real_step)
    monkeypatch.setattr(recipe, "train", counting_train)
    recipe.run_recipe(TINY_STAGES, tmp_path / "killed", base)
    assert stages_trained == [3]  # the finished first stage is skipped, the second resumed
    assert (tmp_path / "killed" / "00-first" / "final" / "model.safetensors").read_bytes() == first_final
    expected, resumed = _model_weights(last), _model_weights(tmp_path / "killed" / "01-second")
    assert all(torch.equal(expected[k], resumed[k]) for k in expected)

    recipe.run_recipe(TINY_STAGES, tmp_path / "killed", base)  # everything done: nothing trained again
    assert stages_trained == [3]


@pytest.mark.parametrize("name", ["a", "b"])
def test_every_recipe_stage_names_its_shipped_counterpart(name: str) -> None:
    for stage in recipe.RECIPES[name]:
        log = json.loads((checkpoint_dir(stage.model) / "training_log.json").read_text())
        assert 0.0 < log[stage.shipped_table]["level1"]["accuracy"] < 1.0, stage.name
    assert recipe.RECIPES[name][-1].shipped_table == "held_out"  # the last stage is the shipped checkpoint


def test_compare_measures_finished_stages_beside_the_shipped_lineage(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # two finished stages whose final weights are the shipped checkpoints (a real, different accuracy each)
    stages = (recipe.RecipeStage("first", "a", "scratch", {}, shipped_table="held_out"),
              recipe.RecipeStage("second", "b", "warm", {}),
              recipe.RecipeStage("never-run", "a", "warm", {}))
    for index, stage in enumerate(stages[:2]):
        shutil.copytree(checkpoint_dir(stage.model), recipe.stage_folder(tmp_path, index, stage) / "final")
    monkeypatch.setattr(recipe, "REPORT_SCENES", 3)  # quote the shipped tables although only 3 scenes are measured
    table = recipe.compare_with_shipped(stages, tmp_path, n_scenes=3).set_index("stage")
    assert table["finished"].tolist() == [True, True, False]

    for stage in stages[:2]:
        model, processor = load(stage.model)
        direct = trainer.evaluate(model, processor, stage.model, 3)
        row = table.loc[stage.name]
        assert row["level1"] == direct["level1"]["accuracy"] > 0.5 and row["level2"] == direct["level2"]["accuracy"]
        assert row["level1_ci_low"] == direct["level1"]["accuracy_ci_low"]
        assert row["level2_ordinal"] == direct["level2_ordinal"]["accuracy"]
        assert row["fresh_level1"] == trainer.fresh_level1(model, processor, stage.model, 3)["accuracy"]
        assert row["vqa_counting"] == trainer.evaluate_vqa(model, processor, 3)["counting"]["accuracy"]
    assert (table.loc["first", "level1"] != table.loc["second", "level1"]
            or table.loc["first", "level2"] != table.loc["second", "level2"])
    shipped = json.loads((checkpoint_dir("a") / "training_log.json").read_text())["held_out"]
    assert table.loc["first", "shipped_level1"] == shipped["level1"]["accuracy"]
    assert table.loc["first", "level1_minus_shipped"] == pytest.approx(
        table.loc["first", "level1"] - shipped["level1"]["accuracy"])
    assert pd.isna(table.loc["second", "shipped_level1"])  # no counterpart declared

    def not_again(*args, **kwargs):
        raise AssertionError("a cached stage was measured again")

    monkeypatch.setattr(recipe, "measure_held_out", not_again)
    pd.testing.assert_frame_equal(recipe.compare_with_shipped(stages, tmp_path, n_scenes=3).set_index("stage"), table)
    with pytest.raises(AssertionError, match="measured again"):  # another number of scenes is measured anew
        recipe.compare_with_shipped(stages, tmp_path, n_scenes=4)
    first_final = recipe.stage_folder(tmp_path, 0, stages[0]) / "final"
    weights = load_file(str(first_final / "model.safetensors"))
    first_key = sorted(weights)[0]
    save_file({**weights, first_key: weights[first_key] + 1}, str(first_final / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="measured again"):  # other final weights are measured anew
        recipe.measure_stage(stages[0], first_final.parent, n_scenes=3)


def test_compare_names_a_missing_recipe_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr("sys.argv",
                        ["recipe", "--model", "a", "--out", str(tmp_path / "nowhere"), "--compare", "--threads", "1"])
    with pytest.raises(SystemExit):
        recipe.main()
    assert "nowhere is not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["train", "recipe", "regime"])
def test_trainer_commands_run_from_the_checkout(module: str) -> None:
    """``python -m toy_training.<module>`` from the repository root (the trainer is not installed with the wheel)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", f"toy_training.{module}", "--help"], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "--model" in done.stdout, done.stderr


def test_reseeded_moves_every_stage_seed_and_nothing_else() -> None:
    stages = recipe.RECIPES["c"]
    moved = recipe.reseeded(stages, 2)
    assert [s.name for s in moved] == [s.name for s in stages]
    for before, after in zip(stages, moved):
        assert after.overrides["seed"] == before.overrides.get("seed", 0) + 2
        assert {k: v for k, v in after.overrides.items() if k != "seed"} == \
            {k: v for k, v in before.overrides.items() if k != "seed"}
        assert (after.model, after.start, after.shipped_table) == (before.model, before.start, before.shipped_table)
    assert recipe.reseeded(stages, 0) == stages
    # the stage config the trainer gets carries the moved seed
    last = moved[-1]
    assert recipe.stage_config(last, Path("/nonexistent/final")).seed == stages[-1].overrides["seed"] + 2


def test_a_spread_moves_the_seeds_from_its_first_stage_on_only() -> None:
    """Toy C's trainings retrain its last stages from toy C 0.2: the earlier stages keep the seeds they were trained
    with, so ``--reseed N`` from an empty folder is the same lineage as the spread's."""
    stages = recipe.RECIPES["c"]
    first = [s.name for s in stages].index(recipe.SPREAD_FROM["c"])
    moved = recipe.trained_stages("c", 3)
    assert moved[:first] == stages[:first] and first > 0
    assert [s.overrides["seed"] for s in moved[first:]] == [s.overrides["seed"] + 3 for s in stages[first:]]
    # the shipped training: toy C's declared offset; the other recipes' own seeds
    assert recipe.trained_stages("c")[-1].overrides["seed"] == stages[-1].overrides["seed"] + recipe.SHIPPED_RESEED["c"]
    assert recipe.trained_stages("a") == recipe.RECIPES["a"]
    with pytest.raises(ValueError, match="no recipe stage named 'c-nope'"):
        recipe.reseeded(stages, 1, "c-nope")


def test_training_command_options_reach_the_config() -> None:
    """The task mixture of a warm restart is set from the command line (the text-only and text-heavy stages of
    docs/toy-models.md): each option lands in its ``TrainConfig`` field, the rest stay the preset's."""
    preset = trainer.MODEL_PRESETS["c"]
    args = trainer._parse_args(["--model", "c", "--warm-start", "CKPT", "--grounding-scenes", "2", "--text-scenes",
                                "16", "--vqa-scenes", "0", "--head-dropout", "0", "--lr", "1e-3", "--steps", "800",
                                "--fp32", "--contrast-scenes", "4"])
    config = trainer.training_config(args)
    assert (config.grounding_batch_scenes, config.text_batch_scenes, config.vqa_batch_scenes) == (2, 16, 0)
    assert config.contrast_batch_scenes == 4
    assert (config.head_dropout, config.grounding_lr, config.grounding_steps, config.bf16) == (0.0, 1e-3, 800, False)
    assert (config.warm_start, config.vision_steps, config.level_schedule) == ("CKPT", 0, trainer.WARM_START_LEVELS)
    assert config.query_probe_weight == trainer.TrainConfig().query_probe_weight > 0
    assert config.query_probe_layer == preset["query_probe_layer"]
    plain = trainer.training_config(trainer._parse_args(["--model", "c"]))
    assert (plain.grounding_batch_scenes, plain.text_batch_scenes) == (preset["grounding_batch_scenes"],
                                                                      preset["text_batch_scenes"])
    assert plain.contrast_batch_scenes == 0
    # no grounding rows: the query probe (which reads grounding rows) is off instead of averaging nothing
    text_only = trainer.training_config(trainer._parse_args(["--model", "c", "--grounding-scenes", "0"]))
    assert (text_only.grounding_batch_scenes, text_only.query_probe_weight) == (0, 0.0)


@pytest.mark.parametrize("value", ["-1", "two"])
def test_training_command_refuses_a_scene_count_that_is_not_a_count(value: str,
                                                                     capsys: pytest.CaptureFixture) -> None:
    for option in ("--text-scenes", "--contrast-scenes"):
        with pytest.raises(SystemExit):
            trainer._parse_args(["--model", "c", option, value])
        assert f"{option}: {value!r} is not a number of scenes (a whole number >= 0)" in capsys.readouterr().err


def test_share_attention_option_reaches_the_config_and_refuses_bad_pairs(capsys: pytest.CaptureFixture) -> None:
    args = trainer._parse_args(["--model", "c", "--warm-start", "CKPT", "--share-attention", "7:6, 1:2"])
    assert trainer.training_config(args).share_layers == ((7, 6), (1, 2))
    with pytest.raises(SystemExit):
        trainer._parse_args(["--model", "c", "--share-attention", "7-6"])
    assert "--share-attention: '7-6' is not LAYER:SOURCE" in capsys.readouterr().err
    for pair in ("8:6", "6:6"):
        with pytest.raises(SystemExit, match=f"--share-attention {pair}: name two different layers of the c model"):
            trainer.training_config(trainer._parse_args(["--model", "c", "--warm-start", "CKPT",
                                                         "--share-attention", pair]))
    # a growth step changes a trained model's weights: without --warm-start it used to be silently ignored
    with pytest.raises(SystemExit, match="--split-heads, --share-attention need --warm-start"):
        trainer.training_config(trainer._parse_args(["--model", "c", "--share-attention", "7:6",
                                                     "--split-heads", "L7H12"]))


def test_an_older_train_config_reads_bare_shared_layers_as_the_layer_above() -> None:
    """Run folders written before ``share_layers`` held pairs (the shipped toy:c's warm start, the seed spread's
    ``c-share`` stage: ``[1, 3, 5]``)."""
    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "toy_training/seed_spread/c-train2/train_config.json").read_text())
    assert data["share_layers"] == [1, 3, 5]
    assert trainer.config_from_json(data).share_layers == ((1, 2), (3, 4), (5, 6))



def test_tower_lr_scale_trains_the_vision_tower_in_stage_2_at_that_share_and_resumes_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--tower-lr-scale``: after stage 1 the vision tower is frozen unless this is > 0; then it has a parameter
    group of its own at that fraction of the grounding learning rate, and a killed run resumes bit-exactly."""
    args = trainer._parse_args(["--model", "d", "--warm-start", "CKPT", "--tower-lr-scale", "0.25"])
    assert trainer.training_config(args).tower_lr_scale == 0.25
    with pytest.raises(SystemExit, match="--tower-lr-scale -1.0: give a fraction >= 0"):
        trainer.training_config(trainer._parse_args(["--model", "d", "--tower-lr-scale", "-1"]))
    base = dict(trainer.TINY_TEST_CONFIG, model="a", vision_steps=2, grounding_steps=3, eval_every=1)

    def tower(out: Path) -> dict[str, torch.Tensor]:
        state = load_file(str(out / trainer.CHECKPOINT_FILE))
        return {k: v for k, v in state.items() if k.startswith("model.model.vision_tower.")}

    frozen, tuned = trainer.TrainConfig(**base), trainer.TrainConfig(**base, tower_lr_scale=0.25)
    trainer.train(dataclasses.replace(frozen, grounding_steps=0), tmp_path / "stage1", resume=False)
    after_stage1 = tower(tmp_path / "stage1")
    trainer.train(frozen, tmp_path / "frozen", resume=False)
    assert all(torch.equal(after_stage1[k], v) for k, v in tower(tmp_path / "frozen").items())
    rates: list[list[float]] = []
    real_step = trainer.training_step

    def recording(cfg, model, heads, processor, optimizer, step):
        result = real_step(cfg, model, heads, processor, optimizer, step)
        rates.append([group["lr"] for group in optimizer.param_groups])
        return result

    monkeypatch.setattr(trainer, "training_step", recording)
    trainer.train(tuned, tmp_path / "tuned", resume=False)
    moved = tower(tmp_path / "tuned")
    assert any(not torch.equal(after_stage1[k], v) for k, v in moved.items())
    grounding_rates = rates[base["vision_steps"]:]
    assert len(grounding_rates) == 3 and all(len(pair) == 2 for pair in grounding_rates)
    for step, (main, tower_rate) in enumerate(grounding_rates, base["vision_steps"]):
        assert main == trainer.learning_rate(tuned, step) and tower_rate == pytest.approx(0.25 * main, rel=1e-12)

    def killed(cfg, model, heads, processor, optimizer, step):
        if step == 4:
            raise KeyboardInterrupt("simulated kill")
        return real_step(cfg, model, heads, processor, optimizer, step)

    monkeypatch.setattr(trainer, "training_step", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(tuned, tmp_path / "killed", resume=False)
    monkeypatch.setattr(trainer, "training_step", real_step)
    trainer.train(tuned, tmp_path / "killed", resume=True)
    expected, resumed = _model_weights(tmp_path / "tuned"), _model_weights(tmp_path / "killed")
    assert all(torch.equal(expected[k], resumed[k]) for k in expected)
