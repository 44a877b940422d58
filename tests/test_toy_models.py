"""Shipped toy VLMs: offline loading, recorded accuracy, query binding; trainer resume-after-kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vrh_interp.toy import checkpoint_dir, load
from vrh_interp.toy import train as trainer

SHIPPED = [name for name in ("a", "b") if (checkpoint_dir(name) / "model.safetensors").exists()]
ACCURACY_MARGIN = 0.03


@pytest.fixture(autouse=True)
def _one_thread():
    """One thread: without OMP_WAIT_POLICY=PASSIVE, 2 spinning threads on a shared CPU are ~5x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_model_a_is_shipped() -> None:
    assert "a" in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_checkpoint_is_small_and_reaches_recorded_accuracy(name: str) -> None:
    folder = checkpoint_dir(name)
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 10 * 1024 * 1024
    log = json.loads((folder / "training_log.json").read_text())
    recorded = log["test_set_level1"]

    model, processor = load(name)
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.get_text_config().vocab_size == len(processor.tokenizer)
    samples = trainer.held_out_samples(log["test_set_scenes"], difficulty=1)
    predictions = [box for _, box in trainer.predict_boxes(model, processor, name, samples)]
    measured = trainer.grounding_metrics(samples, predictions)

    assert measured["n"] == recorded["n"]
    assert measured["accuracy"] >= recorded["accuracy"] - ACCURACY_MARGIN
    assert measured["parse_failure_rate"] <= 0.05
    # the answer depends on the query: above the best any query-ignoring model can score, different
    # referents of one image get different boxes (a query-ignoring model scores 1.0 here), and the
    # box lands nearest the referent well above chance. (Model a: 0.57 vs ceiling 0.30; NOT the 0.9 target.)
    assert measured["accuracy"] >= measured["baseline_query_ignoring_ceiling"] + 0.15
    assert measured["swap_same_box_rate"] <= 0.3
    assert measured["nearest_object_is_target_rate"] >= measured["baseline_random_object"] + 0.1


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    tensors = load_file(str(run_dir / trainer.CHECKPOINT_FILE))
    return {k: v for k, v in tensors.items() if k.startswith(("model.", "heads.", "optim."))}


def test_resume_after_kill_reproduces_uninterrupted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = trainer.TrainConfig(**{**trainer.TINY_TEST_CONFIG, "vision_steps": 4, "grounding_steps": 4, "eval_every": 3})
    trainer.train(config, tmp_path / "uninterrupted", resume=False)

    real_step = trainer.training_step
    kill_at = 5  # checkpoint written after step 3; steps 3 and 4 (0-based) are lost

    def step_until_killed(cfg, model, heads, processor, optimizer, step):
        if step == kill_at:
            raise KeyboardInterrupt("simulated kill")
        return real_step(cfg, model, heads, processor, optimizer, step)

    monkeypatch.setattr(trainer, "training_step", step_until_killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(config, tmp_path / "killed", resume=False)
    assert _metadata_step(tmp_path / "killed") == 3  # the last checkpoint before the kill
    killed_at_checkpoint = _final_weights(tmp_path / "killed")
    uninterrupted = _final_weights(tmp_path / "uninterrupted")
    assert any(not torch.equal(killed_at_checkpoint[k], uninterrupted[k]) for k in uninterrupted if k.startswith("model."))
    monkeypatch.setattr(trainer, "training_step", real_step)
    trainer.train(config, tmp_path / "killed", resume=True)

    expected, resumed = _final_weights(tmp_path / "uninterrupted"), _final_weights(tmp_path / "killed")
    assert expected.keys() == resumed.keys()
    differing = [k for k in expected if not torch.equal(expected[k], resumed[k])]
    assert differing == []


def _metadata_step(run_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(run_dir / trainer.CHECKPOINT_FILE), framework="pt") as handle:
        return int(handle.metadata()["step"])
