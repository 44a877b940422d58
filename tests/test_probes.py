"""Read-out probes: the solver and the statistics on planted signals, the features against a plain hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_vlm
from tests.reference import captured_o_proj_inputs
from vrh_interp.data import grounding_samples
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.data.checks import as_box
from vrh_interp.patching.probes import (
    BOX_TARGETS,
    Split,
    collect_head_features,
    comparison_head_sets,
    grouped_split,
    probe_head_sets,
    probe_targets,
    ridge_classification_probe,
    ridge_regression_probe,
    summarise_random,
)

N = 240


def _planted(seed: int = 0):
    """Features = W x + noise for a 4-d latent x; pairs of samples share an image (group)."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(N, 4))
    features = latent @ rng.normal(size=(4, 48)) + 0.05 * rng.normal(size=(N, 48))
    groups = [f"img{i // 2}" for i in range(N)]
    return rng, latent, features, groups


def test_ridge_recovers_a_planted_linear_target():
    rng, latent, x, groups = _planted()
    split = grouped_split(groups, seed=0)
    y = latent @ np.array([1.0, -2.0, 0.5, 0.0]) + 3.0
    score = ridge_regression_probe(x, y, split, groups=groups)
    assert score.metric > 0.99 and score.ci_low > 0.98 and score.ci_high <= 1.0
    assert (score.n_train, score.n_test) == (len(split.train), len(split.test)) and score.n_train + score.n_test == N


def test_ridge_classifier_recovers_planted_classes_against_majority_chance():
    rng = np.random.default_rng(1)
    labels = rng.choice(["red", "green", "blue"], size=N, p=[0.5, 0.3, 0.2])
    onehot = (labels[:, None] == np.array(["red", "green", "blue"])[None, :]).astype(float)
    x = onehot @ rng.normal(size=(3, 32)) + 0.1 * rng.normal(size=(N, 32))
    groups = [f"img{i // 2}" for i in range(N)]
    split = grouped_split(groups, seed=0)
    score = ridge_classification_probe(x, labels, split, groups=groups)
    assert score.metric == 1.0 and score.ci_low == 1.0
    assert score.chance == pytest.approx(float((labels[split.test] == "red").mean()))  # the train majority


def test_shuffled_targets_score_chance():
    rng, latent, x, groups = _planted()
    split = grouped_split(groups, seed=0)
    y = rng.permutation(latent[:, 0])
    r2 = ridge_regression_probe(x, y, split, groups=groups)
    assert r2.metric <= 0.02 and r2.ci_low < 0.0
    labels = rng.choice(["a", "b", "c"], size=N, p=[0.6, 0.25, 0.15])
    acc = ridge_classification_probe(x, labels, split, groups=groups)
    assert abs(acc.metric - acc.chance) <= 0.12 and acc.ci_low <= acc.chance


def test_ridge_predictions_equal_the_closed_form():
    """The SVD solver equals (Z'Z + alpha I)^-1 Z'(y - mean) on train-z-scored features, at the chosen alpha."""
    rng, latent, x, groups = _planted(2)
    split = grouped_split(groups, seed=3)
    y = latent[:, 1] + 0.3 * rng.normal(size=N)
    alpha = 10.0
    score = ridge_regression_probe(x, y, split, groups=groups, alphas=(alpha,))
    xt, yt = x[split.train], y[split.train]
    mean, std = xt.mean(axis=0), xt.std(axis=0)
    z = (xt - mean) / std
    w = np.linalg.solve(z.T @ z + alpha * np.eye(z.shape[1]), z.T @ (yt - yt.mean()))
    predicted = ((x[split.test] - mean) / std) @ w + yt.mean()
    truth = y[split.test]
    want = 1 - ((truth - predicted) ** 2).sum() / ((truth - truth.mean()) ** 2).sum()
    assert score.alpha == alpha and score.metric == pytest.approx(want, abs=1e-10)


def test_alpha_is_chosen_without_the_test_split():
    rng, latent, x, groups = _planted(4)
    split = grouped_split(groups, seed=0)
    y = latent[:, 0] + 2.0 * rng.normal(size=N)
    corrupted = y.copy()
    corrupted[split.test] = rng.normal(scale=100.0, size=len(split.test))
    a = ridge_regression_probe(x, y, split, groups=groups)
    b = ridge_regression_probe(x, corrupted, split, groups=groups)
    assert a.alpha == b.alpha and a.metric > 0.0 > b.metric


def test_grouped_split_keeps_images_whole_and_is_seeded():
    groups = [f"img{i // 3}" for i in range(60)]
    split = grouped_split(groups, test_fraction=0.25, seed=7)
    train = {groups[i] for i in split.train}
    test = {groups[i] for i in split.test}
    assert not train & test and len(test) == 5 and len(split.train) + len(split.test) == 60
    again = grouped_split(groups, test_fraction=0.25, seed=7)
    assert np.array_equal(split.test, again.test)
    assert not np.array_equal(split.test, grouped_split(groups, test_fraction=0.25, seed=8).test)
    with pytest.raises(ValueError, match="2 distinct images"):
        grouped_split(["one"] * 5)


def test_single_class_train_split_is_refused():
    x = np.random.default_rng(0).normal(size=(10, 3))
    with pytest.raises(ValueError, match="single class"):
        ridge_classification_probe(x, ["a"] * 8 + ["b"] * 2, Split(np.arange(8), np.arange(8, 10)))


# --------------------------------------------------------------------------------------------- on models
def _scene_samples(count: int):
    """Several referents per image (so the grouped split matters), level 0 scenes."""
    out = []
    index = 0
    while len(out) < count:
        out.extend(grounding_samples("eval", index, difficulty=0))
        index += 1
    return out[:count]


def test_targets_are_normalised_boxes_and_scene_attributes():
    samples = _scene_samples(6)
    targets = probe_targets(samples)
    s = samples[0]
    x1, y1, x2, y2 = s.box
    w, h = s.image.size
    np.testing.assert_allclose(targets.box[0], [(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h])
    colour, shape, size = s.meta["object_attributes"][s.meta["target_index"]]
    assert (targets.attributes["colour"][0], targets.attributes["shape"][0], targets.attributes["size"][0]) == (
        colour, shape, size)
    assert targets.groups[0] == targets.groups[1] == str(s.meta["seed"])  # same scene, same group
    assert targets.named["shape"].all()  # level-0 queries always name the shape


def test_prompt_end_features_equal_pre_hook_capture_across_batches():
    vlm = tiny_vlm("llava")
    samples = _scene_samples(3)
    features = collect_head_features(vlm, samples, batch_size=2)
    g = vlm.geometry
    assert features.values.shape == (3, g.num_layers, g.num_heads, g.head_dim)
    for start, stop in ((0, 2), (2, 3)):
        chunk = samples[start:stop]
        batch = vlm.encode_grounding([s.image for s in chunk], [s.expression for s in chunk])
        reference = captured_o_proj_inputs(vlm.hf_model, dict(batch.encoding))
        for layer in range(g.num_layers):
            torch.testing.assert_close(features.values[start:stop, layer], reference[layer][:, -1], rtol=0, atol=0)
    heads = HeadSet([Head(1, 2), Head(0, 0)])
    matrix = features.matrix(heads)
    np.testing.assert_array_equal(matrix[:, :g.head_dim], features.values[:, 1, 2].double().numpy())
    np.testing.assert_array_equal(matrix[:, g.head_dim:], features.values[:, 0, 0].double().numpy())


def test_answer_mean_features_average_the_answer_predicting_positions():
    """Greedy answers from plain ``generate``, appended by hand, hooked by hand: same means."""
    vlm = tiny_vlm("qwen2_vl")
    samples = _scene_samples(2)
    features = collect_head_features(vlm, samples, position="answer_mean", max_new_tokens=4)
    assert features.position == "answer_mean:greedy"
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    with torch.no_grad():
        generated = vlm.hf_model.generate(**batch.encoding, max_new_tokens=4, do_sample=False)
    prompt = batch.prompt_length
    lengths = vlm.answer_lengths(generated, prompt)
    full = dict(batch.encoding)
    full["input_ids"] = generated[:, :prompt + max(lengths)]
    answer_mask = torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths])
    full["attention_mask"] = torch.cat([batch.encoding["attention_mask"], answer_mask], dim=1)
    full["mm_token_type_ids"] = torch.cat([batch.encoding["mm_token_type_ids"], 0 * answer_mask], dim=1)  # text
    reference = captured_o_proj_inputs(vlm.hf_model, full)
    for row, n in enumerate(lengths):
        for layer in range(vlm.geometry.num_layers):
            want = reference[layer][row, prompt - 1:prompt - 1 + max(n, 1)].mean(dim=0)
            torch.testing.assert_close(features.values[row, layer], want, rtol=0, atol=1e-6)
    assert max(lengths) > 1, "the answers must span several positions for this test to mean anything"


def test_features_through_serialised_remote_path_are_identical():
    vlm = tiny_vlm("llava")
    samples = _scene_samples(2)
    local = collect_head_features(vlm, samples, layers=[1])
    remote = collect_head_features(vlm.on(remote="local"), samples, layers=[1])
    assert remote.layers == (1,)
    torch.testing.assert_close(remote.values, local.values, rtol=0, atol=0)


def test_head_set_comparison_table():
    vlm = tiny_vlm("llava")
    samples = _scene_samples(24)
    vrhs = HeadSet([Head(1, 0), Head(1, 3)])
    sets = comparison_head_sets(vrhs, vlm.geometry, random_seeds=(0, 1))
    assert list(sets) == ["vrh", "random:seed=0", "random:seed=1", "all"]
    assert all(len(sets[k]) == 2 and not set(sets[k]) & set(vrhs) for k in ("random:seed=0", "random:seed=1"))
    features = collect_head_features(vlm, samples, batch_size=12)
    frame = probe_head_sets(features, probe_targets(samples), sets, folds=3, resamples=200)
    targets = list(BOX_TARGETS) + ["colour", "shape", "size"]
    assert len(frame) == len(sets) * len(targets)
    assert frame.groupby("head_set")["target"].apply(list).to_dict() == {k: targets for k in sets}
    assert (frame["n_train"] + frame["n_test"] == 24).all() and frame["n_test"].nunique() == 1
    assert (frame["ci_low"] <= frame["metric"]).all() and (frame["metric"] <= frame["ci_high"]).all()
    assert (frame.loc[frame["metric_name"] == "r2", "chance"] == 0).all()
    assert frame.loc[frame["metric_name"] == "r2", "named_rate"].isna().all()
    acc = frame[frame["metric_name"] == "accuracy"]
    assert acc["chance"].between(0, 1).all() and acc.groupby("target")["chance"].nunique().eq(1).all()
    assert frame.loc[frame["head_set"] == "all", "n_heads"].iloc[0] == vlm.geometry.total_heads
    with pytest.raises(ValueError, match="not available"):
        probe_head_sets(features, probe_targets(samples), sets, target_names=["material"])


def test_bootstrap_of_a_statistic_matches_the_mean_bootstrap_for_the_mean():
    from vrh_interp.evaluation.statistics import bootstrap_ci, bootstrap_statistic_ci

    values = np.random.default_rng(5).random(37)
    assert bootstrap_statistic_ci(lambda idx: float(values[idx].mean()), len(values), seed=3) == bootstrap_ci(
        values, seed=3)
    assert bootstrap_statistic_ci(lambda idx: float("nan"), 5) != bootstrap_statistic_ci(lambda idx: 1.0, 5)
    assert bootstrap_statistic_ci(lambda idx: 1.0, 0) != bootstrap_statistic_ci(lambda idx: 1.0, 0)  # NaNs


def test_gold_teacher_forcing_appends_the_native_box_text():
    vlm = tiny_vlm("llava")
    samples = _scene_samples(2)
    features = collect_head_features(vlm, samples, position="answer_mean", answer="gold", layers=[0])
    assert features.position == "answer_mean:gold" and features.layers == (0,)
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    gold = [vlm.tokenizer(vlm.adapter.format_box(as_box(s.box), f), add_special_tokens=False)["input_ids"]
            for s, f in zip(samples, batch.frames)]
    width = max(len(ids) for ids in gold)
    pad = vlm.tokenizer.pad_token_id
    full = dict(batch.encoding)
    full["input_ids"] = torch.cat([batch.encoding["input_ids"],
                                   torch.tensor([ids + [pad] * (width - len(ids)) for ids in gold])], dim=1)
    answer_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in gold])
    full["attention_mask"] = torch.cat([batch.encoding["attention_mask"], answer_mask], dim=1)
    reference = captured_o_proj_inputs(vlm.hf_model, full)[0]
    prompt = batch.prompt_length
    for row, ids in enumerate(gold):
        assert len(ids) > 1
        want = reference[row, prompt - 1:prompt - 1 + len(ids)].mean(dim=0)
        torch.testing.assert_close(features.values[row, 0], want, rtol=0, atol=1e-6)


def test_random_heads_are_summarised_as_a_distribution_with_the_vrh_p_value():
    """Matched sets hold as many heads per layer as the VRHs; the summary's p-values count sets by hand."""
    vlm = tiny_vlm("llava")
    samples = _scene_samples(24)
    vrhs = HeadSet([Head(1, 0), Head(1, 3)])
    sets = comparison_head_sets(vrhs, vlm.geometry, random_seeds=range(5), matched=True)
    matched = [heads for name, heads in sets.items() if name.startswith("matched:")]
    assert len(matched) == 5 and all(sorted(h.layer for h in heads) == [1, 1] for heads in matched)
    assert all(not set(heads) & set(vrhs) for heads in matched)
    features = collect_head_features(vlm, samples, batch_size=12)
    frame = probe_head_sets(features, probe_targets(samples), sets, target_names=["box_cx", "colour"], folds=3,
                            resamples=50)
    summary = summarise_random(frame).set_index("target")
    for target in ("box_cx", "colour"):
        part = frame[frame["target"] == target].set_index("head_set")["metric"]
        vrh = part["vrh"]
        for kind in ("random", "matched"):
            values = part[[f"{kind}:seed={s}" for s in range(5)]].to_numpy()
            assert summary.loc[target, f"{kind}_sets"] == 5
            assert summary.loc[target, f"{kind}_mean"] == pytest.approx(values.mean())
            assert summary.loc[target, f"{kind}_max"] == pytest.approx(values.max())
            assert summary.loc[target, f"p_vs_{kind}"] == pytest.approx((1 + (values >= vrh).sum()) / 6)
