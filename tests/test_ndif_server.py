"""Remote execution against a REAL NDIF server started here (slow), plus fast checks of the remote error path.

The slow tests start the open-source NDIF stack on 127.0.0.1 in its own Python environment, where
vrh_interp is NOT importable (asserted), deploy the shipped toy VLM (model a) on a CPU actor, and check that
VRH scoring (``score_heads(vlm.on(remote=True), ...)``: one request per batch), an ablated greedy generation and the
patching entry points run on a remote handle give exactly the local results. They are skipped, with the
precise reason, when the server environment or redis is missing (see
``tests.ndif_server``); a stack that is installed but fails is a failure.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pytest
import torch
from cloudpickle import cloudpickle as cloudpickle_impl

from vrh_interp.core.execution import interventions as iv
from vrh_interp.data import grounding_samples
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.core.execution.interventions import RemoteExecutionError
from vrh_interp.core.description.model import VLM, wrap
from vrh_interp.patching.attribution import attribution_patching
from vrh_interp.patching.batch import prepare_pairs
from vrh_interp.patching.head_patching import patch_each_head, patch_head_set, patched_answers
from vrh_interp.patching.mediation import direct_and_total_effect
from vrh_interp.patching.pairs import make_pairs
from vrh_interp.patching.positions import position_patching
from vrh_interp.scoring.detect import score_heads
from tests.ndif_server import LocalNDIF, NDIFUnavailable, check_prerequisites, client_host, free_port
from vrh_interp.toy import checkpoint_dir
from vrh_interp.toy import load as load_toy

REMOTE_ID = "vrh-interp/toy-a"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_vlm(remote_id: str | None = REMOTE_ID) -> VLM:
    model, processor = load_toy("a")
    return wrap(model, processor, remote_id=remote_id)


# ------------------------------------------------------------------ fast: no server needed
def test_remote_key_names_nnsights_class_and_the_given_id_like_nnsight_would(monkeypatch: pytest.MonkeyPatch) -> None:
    from nnsight.modeling import huggingface

    ours = toy_vlm().nn.to_model_key()
    # nnsight's own minting for the same id (its hub lookup primed, as it caches it after one call)
    plain = toy_vlm(remote_id=None).nn
    plain.repo_id = REMOTE_ID
    monkeypatch.setitem(huggingface._ID_CACHE, REMOTE_ID, REMOTE_ID)
    assert ours == plain.to_model_key()
    cls, suffix = ours.split(":", 1)
    assert cls == "nnsight.modeling.transformers.TransformersModel"
    assert json.loads(suffix) == {"repo_id": REMOTE_ID, "revision": None, "task": "image-text-to-text"}


def test_server_down_is_a_clear_error_naming_the_host() -> None:
    vlm = toy_vlm()
    batch = vlm.encode_grounding([grounding_samples("detect", 0)[0].image], ["the red circle"])
    host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with client_host(host), pytest.raises(RemoteExecutionError, match="could not reach an NDIF server at " + host):
        iv.run_forward(vlm.on(remote=True), batch.encoding)


def test_model_loaded_from_a_folder_without_remote_id_says_to_pass_one() -> None:
    vlm = toy_vlm(remote_id=None)  # a local folder: nnsight would ask the hub for its id
    batch = vlm.encode_grounding([grounding_samples("detect", 0)[0].image], ["the red circle"])
    with client_host(f"http://127.0.0.1:{free_port()}"), pytest.raises(RemoteExecutionError, match="remote_id"):
        iv.run_forward(vlm.on(remote=True), batch.encoding)


# ------------------------------------------------------------------ slow: a real server
@pytest.fixture(scope="module")
def ndif() -> Iterator[LocalNDIF]:
    try:
        python = check_prerequisites()
    except NDIFUnavailable as err:
        pytest.skip(f"local NDIF server not available: {err}")
    server = LocalNDIF(python=python)
    try:
        server.start()
        server.deploy(toy_vlm().nn.to_model_key(), checkpoint_dir("a"))
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def count_local_forwards(vlm: VLM) -> Iterator[list[int]]:
    """Count forwards of the LOCAL model: a remote run must make none (nothing silently runs locally)."""
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    handle = vlm.hf_model.register_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def assert_same(local: Any, remote: Any, where: str = "result") -> None:
    """Exact equality of nested results (tensors, arrays, lists, dicts, scalars)."""
    if isinstance(local, torch.Tensor):
        assert isinstance(remote, torch.Tensor) and local.dtype == remote.dtype, where
        assert torch.equal(local, remote), f"{where}: max |diff| {(local.double() - remote.double()).abs().max()}"
    elif isinstance(local, np.ndarray):
        np.testing.assert_array_equal(remote, local, err_msg=where)
    elif isinstance(local, dict):
        assert local.keys() == remote.keys(), where
        for k in local:
            assert_same(local[k], remote[k], f"{where}[{k!r}]")
    elif isinstance(local, (list, tuple)):
        assert len(local) == len(remote), where
        for i, (a, b) in enumerate(zip(local, remote)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert local == remote, where


@pytest.mark.slow
def test_remote_scoring_and_ablated_generation_equal_local_on_a_real_server(
        ndif: LocalNDIF, monkeypatch: pytest.MonkeyPatch) -> None:
    requests: list[bool | str] = []
    original_generate = iv.run_generate

    def counted_generate(*args: Any, **kwargs: Any) -> Any:
        requests.append(args[0].remote)  # the handle holds where it runs
        return original_generate(*args, **kwargs)

    monkeypatch.setattr(iv, "run_generate", counted_generate)  # counts requests; the handle says where each goes
    vlm = toy_vlm()
    samples = [grounding_samples("detect", i)[0] for i in range(3)]
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])

    with count_local_forwards(vlm) as local_calls:
        local_scores = score_heads(vlm, samples, batch_size=2, max_new_tokens=12, progress=False)
        heads = local_scores.top(3)
        ablation = iv.head_ablation(vlm, heads)
        local_generate = iv.run_generate(vlm, batch.encoding, [ablation], max_new_tokens=10)
        local_forward = iv.run_forward(vlm, batch.encoding, [ablation])
        plain_forward = iv.run_forward(vlm, batch.encoding)
    assert local_calls[0] > 0
    assert np.ptp(local_scores.scores) > 0, "scores must not be trivially constant"
    assert local_generate.ids.shape[1] > batch.prompt_length
    assert not torch.equal(local_forward.logits, plain_forward.logits), "the ablation must change the output"

    probe = ndif.probe()
    assert probe["vrh_interp_importable"] is False, probe
    assert probe["executable"].startswith(str(ndif.python.parent.parent)), probe

    requests.clear()
    with client_host(ndif.host), count_local_forwards(vlm) as remote_local_calls:
        remote_scores = score_heads(vlm.on(remote=True), samples, batch_size=2, max_new_tokens=12, progress=False)
        assert requests == [True, True]  # 3 samples in batches of 2: one request per batch
        remote_generate = iv.run_generate(vlm.on(remote=True), batch.encoding, [ablation], max_new_tokens=10)
        remote_forward = iv.run_forward(vlm.on(remote=True), batch.encoding, [ablation])
    assert remote_local_calls[0] == 0, "a remote run must not run the local model"

    assert_same(local_scores.scores, remote_scores.scores, "scores")
    assert_same(local_scores.per_position, remote_scores.per_position, "per_position")
    assert remote_scores.sample_ids == local_scores.sample_ids
    assert remote_scores.provenance["grounding_accuracy_at_detection"] == \
        local_scores.provenance["grounding_accuracy_at_detection"]
    assert (local_scores.provenance["remote"], remote_scores.provenance["remote"]) == (False, True)
    assert_same(local_generate.ids, remote_generate.ids, "generated ids")
    assert_same(local_generate.steps, remote_generate.steps, "generate steps")
    assert_same(local_forward.logits, remote_forward.logits, "ablated logits")


@pytest.mark.slow
def test_patching_entry_points_equal_local_on_a_real_server(ndif: LocalNDIF) -> None:
    """Patching on a remote handle (``vlm.on(remote=True)``) equals the local run. The server freezes the weights
    (``requires_grad_(False)``), which attribution patching must handle, and ships only what each trace references."""
    vlm = toy_vlm()
    pairs = prepare_pairs(vlm, make_pairs("referent_moved", 3), targets="ground_truth")
    heads = HeadSet(["L0H1", "L1H2"])
    runs = {
        "patch_each_head": lambda remote: patch_each_head(vlm.on(remote=remote), pairs, heads=heads,
                                                          progress=False).frame,
        "patch_head_set": lambda remote: patch_head_set(vlm.on(remote=remote), pairs, heads),
        "patched_answers": lambda remote: patched_answers(vlm.on(remote=remote), pairs, heads, max_new_tokens=6),
        "attribution_patching": lambda remote: attribution_patching(vlm.on(remote=remote), pairs).per_pair,
        "position_patching": lambda remote: position_patching(vlm.on(remote=remote), pairs, [Head(1, 2)],
                                                              regions=("clean_referent",)),
        "direct_and_total_effect": lambda remote: direct_and_total_effect(vlm.on(remote=remote), pairs, heads),
    }
    local = {name: run(False) for name, run in runs.items()}
    assert np.abs(local["attribution_patching"]).max() > 0
    with client_host(ndif.host), count_local_forwards(vlm) as local_calls:
        remote = {name: run(True) for name, run in runs.items()}
    assert local_calls[0] == 0, "a remote run must not run the local model"
    for name in runs:
        if isinstance(local[name], pd.DataFrame):
            pd.testing.assert_frame_equal(remote[name], local[name], check_exact=True, obj=name)
        else:
            assert_same(local[name], remote[name], name)


@pytest.mark.slow
def test_templates_reach_the_server_only_because_vrh_interp_registers_itself(
        ndif: LocalNDIF, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: without ``nnsight.register("vrh_interp")`` the server cannot unpickle a template
    (it has no vrh_interp), and the failure comes back as a clear ``RemoteExecutionError``."""
    vlm = toy_vlm()
    batch = vlm.encode_grounding([grounding_samples("detect", 0)[0].image], ["the red circle"])
    ablation = iv.head_ablation(vlm, HeadSet(["L0H0"]))
    monkeypatch.setattr(iv, "prepare_remote", lambda vlm: None)
    monkeypatch.setattr(cloudpickle_impl, "_PICKLE_BY_VALUE_MODULES",
                        cloudpickle_impl._PICKLE_BY_VALUE_MODULES - {"vrh_interp"})
    with client_host(ndif.host), pytest.raises(RemoteExecutionError) as raised:
        iv.run_forward(vlm.on(remote=True), batch.encoding, [ablation])
    message = str(raised.value)
    assert "No module named 'vrh_interp'" in message and "nnsight.register" in message, message


@pytest.mark.slow
def test_a_model_the_server_does_not_serve_is_a_clear_error(ndif: LocalNDIF) -> None:
    vlm = toy_vlm(remote_id="vrh-interp/not-deployed")
    batch = vlm.encode_grounding([grounding_samples("detect", 0)[0].image], ["the red circle"])
    with client_host(ndif.host), pytest.raises(RemoteExecutionError) as raised:
        iv.run_forward(vlm.on(remote=True), batch.encoding)
    message = str(raised.value)
    assert "vrh-interp/not-deployed" in message and "remote_id" in message, message
