"""The positive control ``toy:planted``: its training losses against plain loops, its masking hook against the
library's zero ablation, and (when shipped) the properties its model card states, re-measured."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from vrh_interp.core.description.families.base import image_token_positions
from vrh_interp.core.description.heads import HeadSet
from vrh_interp.core.description.model import wrap
from toy_training import planted
from toy_training import train as trainer
from toy_training.configs import TextBackboneShape, VisionTowerShape, format_box_answer
from vrh_interp.toy import checkpoint_dir, load
from vrh_interp.toy.configs import GRID_SIDE
from vrh_interp.toy.planted import DECOY_HEADS, PLANTED_FILE, PLANTED_HEADS, declared_heads

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHIPPED = (checkpoint_dir("planted") / "model.safetensors").exists()
TINY_SHAPE = dict(text_shape=TextBackboneShape(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=8),
                  vision_shape=VisionTowerShape(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                num_attention_heads=2))


def _tiny_planted(attention: bool = True):
    config = trainer.TrainConfig(model="planted", planted=("L1H2",), decoys=("L1H0",),
                                 attention_loss_weight=1.0 if attention else 0.0, **TINY_SHAPE)
    processor = trainer.build_processor("planted")
    return config, trainer.build_model(config, processor), processor


def _batch(processor, n_scenes: int = 2):
    samples = trainer.held_out_samples(n_scenes, 1)
    inputs = trainer.encode_supervised(processor, [s.image for s in samples],
                                       trainer.grounding_prompts(processor, "planted", samples),
                                       [format_box_answer("planted", s.expression, s.box, s.image.size)
                                        for s in samples])
    return samples, inputs


def test_box_cells_match_the_library_layout() -> None:
    """The training targets use the same box -> visual token rule as the library's LLaVA adapter."""
    config, model, processor = _tiny_planted()
    vlm = wrap(model, processor)
    samples, inputs = _batch(processor)
    targets = planted.attention_targets(inputs["input_ids"], inputs["labels"], samples, model.config.image_token_id)
    for row, sample in enumerate(samples):
        encoding = {k: v[row:row + 1] for k, v in inputs.items()}
        layout = vlm.adapter.visual_layout(encoding, sample.image.size, processor)
        from vrh_interp.core.description.boxes import Box

        expected = set(layout.positions_for_box(Box(*sample.box)))
        assert set(targets.referent[row].nonzero().flatten().tolist()) == expected
        others = set()
        for k, box in enumerate(sample.meta["object_boxes"]):
            if k != sample.meta["target_index"]:
                others |= set(layout.positions_for_box(Box(*box)))
        assert set(targets.distractors[row].nonzero().flatten().tolist()) == others - expected
        visual = image_token_positions(inputs["input_ids"][row], model.config.image_token_id)
        assert len(visual) == GRID_SIDE * GRID_SIDE
        assert targets.text_rows[row].nonzero().min() == max(visual) + 1


def _loop_reference(attentions, targets, roles, eps=1e-4):
    """The auxiliary loss with explicit loops over rows, heads and keys (no masks, no matmul)."""
    planted_terms, decoy_terms, leak_terms = [], [], []
    for layer, attention in enumerate(attentions):
        for b in range(attention.shape[0]):
            visual = targets.visual[b].nonzero().flatten().tolist()
            referent = targets.referent[b].nonzero().flatten().tolist()
            distractors = targets.distractors[b].nonzero().flatten().tolist()
            for h in range(attention.shape[1]):
                role = int(roles[layer, h])
                for row in range(attention.shape[2]):
                    if not targets.text_rows[b, row]:
                        continue
                    weights = attention[b, h, row].double()
                    is_answer = bool(targets.answer_rows[b, row])
                    if role == 1 and is_answer:
                        planted_terms.append(-math.log(float(weights[referent].sum()) + eps))
                    if role == 2 and is_answer:
                        decoy_terms.append(-math.log(float(weights[distractors].sum()) + eps))
                    if role == 0 or not is_answer:
                        leak_terms.append(float(weights[visual].sum()))
    return np.mean(planted_terms) + np.mean(decoy_terms) + np.mean(leak_terms)


def test_attention_loss_equals_a_loop_reference() -> None:
    config, model, processor = _tiny_planted()
    samples, inputs = _batch(processor)
    with torch.no_grad():
        outputs = model(**inputs, output_attentions=True)
    targets = planted.attention_targets(inputs["input_ids"], inputs["labels"], samples, model.config.image_token_id)
    roles = planted.head_roles(2, 4, config.planted, config.decoys)
    loss, stats = planted.attention_loss(outputs.attentions, targets, roles)
    assert float(loss) == pytest.approx(_loop_reference(outputs.attentions, targets, roles), rel=1e-5)
    assert set(stats) == {"planted_nll", "decoy_nll", "leak_mass"}


def test_masking_hook_equals_the_library_zero_ablation() -> None:
    """Masking by the trainer's plain pre-hook gives the same logits as the library's nnsight ablation."""
    from vrh_interp.core.execution.interventions import head_ablation, run_forward

    config, model, processor = _tiny_planted(attention=False)
    model.eval()
    vlm = wrap(model, processor)
    _, inputs = _batch(processor, 1)
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    heads = HeadSet(["L0H1", "L1H2", "L1H3"])
    with torch.no_grad(), planted.head_multipliers(model, planted.mask_multipliers(model, heads)):
        hooked = model(**inputs).logits
    library = run_forward(vlm, inputs, [head_ablation(vlm, heads)]).logits
    unmasked = model(**inputs).logits
    assert torch.allclose(hooked, library.to(hooked.dtype), atol=1e-5)
    assert not torch.allclose(hooked, unmasked, atol=1e-3)


def test_head_dropout_never_drops_planted_heads_and_is_seeded() -> None:
    roles = planted.head_roles(4, 16, PLANTED_HEADS, DECOY_HEADS)
    torch.manual_seed(0)
    first = planted.dropout_multipliers(64, roles, 0.5)
    torch.manual_seed(0)
    again = planted.dropout_multipliers(64, roles, 0.5)
    assert torch.equal(first, again)
    for head in HeadSet(PLANTED_HEADS):
        assert bool((first[head.layer, :, head.head] == 1).all())
    rest = first[(roles == 0)[:, None, :].expand_as(first)]
    assert 0.4 < float(rest.mean()) < 0.6
    assert planted.dropout_multipliers(4, roles, 0.0) is None


def test_head_dropout_restricted_to_layers_and_whole_layer_dropout() -> None:
    roles = planted.head_roles(4, 16, PLANTED_HEADS, DECOY_HEADS)
    torch.manual_seed(0)
    plain = planted.dropout_multipliers(64, roles, 0.5)
    torch.manual_seed(0)
    restricted = planted.dropout_multipliers(64, roles, 0.5, layers=(0, 2))
    assert bool((restricted[[1, 3]] == 1).all())  # layers outside ``layers`` are never dropped
    assert torch.equal(restricted[[0, 2]], plain[[0, 2]])  # and the kept layers' draws are the plain ones
    torch.manual_seed(0)
    whole = planted.dropout_multipliers(2000, roles, 0.0, layers=(0,), layer_p=0.3)
    dropped = (whole[0] == 0).all(-1)  # rows whose layer 0 is zeroed whole
    assert 0.25 < float(dropped.float().mean()) < 0.35
    assert bool(((whole[0] == 1).all(-1) | dropped).all())  # with p = 0 a layer is either kept or dropped whole
    assert bool((whole[1:] == 1).all())
    for head in HeadSet(PLANTED_HEADS):  # planted heads are never dropped, not even with their layer
        assert bool((whole[head.layer, :, head.head] == 1).all())

def test_declared_heads_lie_in_middle_and_late_layers() -> None:
    heads = list(HeadSet(PLANTED_HEADS)) + list(HeadSet(DECOY_HEADS))
    assert not set(HeadSet(PLANTED_HEADS)) & set(HeadSet(DECOY_HEADS))
    assert all(1 <= h.layer < planted.PLANTED_SHAPE.num_hidden_layers for h in heads)
    assert planted.PLANTED_SHAPE.num_hidden_layers * planted.PLANTED_SHAPE.num_attention_heads >= 64


def test_grade_ranking_by_hand() -> None:
    from vrh_interp.scoring.grading import grade_ranking

    ranking = HeadSet(["L2H5", "L3H7", "L3H2", "L0H0", "L3H11", "L2H10"])
    graded = grade_ranking(ranking, HeadSet(["L2H5", "L3H2", "L3H11"]), HeadSet(["L2H10", "L3H7"]))
    assert graded["precision_at_p"] == pytest.approx(2 / 3)
    assert graded["recall_at_p"] == pytest.approx(2 / 3)
    assert graded["exact"] is False
    assert graded["planted_ranks"] == [1, 3, 5]
    assert graded["decoy_ranks"] == [6, 2]
    assert graded["best_decoy_rank"] == 2
    assert graded["decoy_above_a_planted_head"] is True
    exact = grade_ranking(HeadSet(["L3H11", "L2H5", "L3H2", "L3H7"]), HeadSet(["L2H5", "L3H2", "L3H11"]),
                          HeadSet(["L3H7"]))
    assert exact["exact"] is True and exact["precision_at_p"] == 1.0 and exact["decoy_above_a_planted_head"] is False
    with pytest.raises(ValueError, match="at least one planted head"):
        grade_ranking(ranking, HeadSet(), HeadSet())


needs_shipped = pytest.mark.skipif(not SHIPPED, reason="toy:planted is not shipped in this installation")


@needs_shipped
def test_shipped_organism_properties_hold_on_a_small_sample() -> None:
    """The model card's properties, re-measured on 12 scenes with the trainer's plain hooks (not the library)."""
    folder = checkpoint_dir("planted")
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 10 * 1024 * 1024
    declared, decoys = declared_heads(folder)
    stated = json.loads((folder / PLANTED_FILE).read_text())["measured"]
    model, processor = load("planted")
    config = model.config.get_text_config()
    assert config.num_hidden_layers * config.num_attention_heads >= 64
    samples = trainer.held_out_samples(12, 1)
    shares = planted.attention_shares(model, processor, samples)
    rest = np.ones_like(shares["referent"], dtype=bool)
    for head in list(declared) + list(decoys):
        rest[head.layer, head.head] = False
    for head in declared:  # planted heads look at the referent far more than any other head
        assert shares["referent"][head.layer, head.head] > 2 * shares["referent"][rest].max()
    for head in decoys:  # decoys look at the other objects, not the referent
        assert shares["distractors"][head.layer, head.head] > shares["referent"][head.layer, head.head]
    assert shares["text_visual"][rest].max() <= stated["rest_max_text_visual_mass"] + 0.05
    unmasked = planted.masked_accuracy(model, processor, samples, HeadSet())
    ceiling = trainer.grounding_metrics(samples, [None] * len(samples))["baseline_query_ignoring_ceiling"]
    assert unmasked >= stated["accuracy"] - 0.1
    assert planted.masked_accuracy(model, processor, samples, declared) <= ceiling
    assert planted.masked_accuracy(model, processor, samples, decoys) >= unmasked - 0.1


@needs_shipped
def test_library_default_scorer_finds_the_planted_heads_and_masking_them_separates() -> None:
    """Through the library's own path (nnsight detection and masked generation): top-|P| == P, and masking P
    collapses grounding while masking the decoys does not."""
    from vrh_interp.experiments.conditions import Condition
    from vrh_interp.experiments.sweep import run_conditions
    from vrh_interp.experiments.positive_control import declared as declared_sets, load_planted
    from vrh_interp.scoring.detect import collect_detection_stats, scores_from_stats
    from vrh_interp.data.sources import synthetic_samples

    vlm = load_planted()
    declared, decoys = declared_sets()
    stats = collect_detection_stats(vlm, synthetic_samples("detect", 12), batch_size=12, progress=False)
    assert set(scores_from_stats(stats, "vrh").ranking()[: len(declared)]) == set(declared)
    evals = synthetic_samples("eval", 24)
    result = run_conditions(vlm, evals, [Condition("baseline", 0, None, HeadSet()),
                                         Condition("top", len(declared), None, declared),
                                         Condition("decoys", len(decoys), None, decoys)],
                            batch_size=24, progress=False)
    accuracy = result.summary().set_index("condition")["accuracy"]
    assert accuracy["top"] <= 0.2
    assert accuracy["decoys"] >= accuracy["baseline"] - 0.15
    assert accuracy["baseline"] - accuracy["top"] >= 0.4


def test_the_organism_starts_as_an_exact_copy_of_toy_a() -> None:
    """``embed_donor``: the 64-head model built from toy A computes toy A's logits before training."""
    config = trainer.TrainConfig(**{**trainer.MODEL_PRESETS["planted"], "model": "planted"})
    processor = trainer.build_processor("planted")
    model = trainer.build_model(config, processor).eval()
    trainer.load_whole_model(model, config.warm_start)
    donor, _ = load("a")
    samples, inputs = _batch(processor, 2)
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        assert torch.allclose(model(**inputs).logits[real], donor(**inputs).logits[real], atol=1e-4)
    new_slots = [s for s in range(16) if s not in {planted.donor_slot(a) for a in range(8)}]
    assert len(new_slots) == 8
    for head in list(HeadSet(PLANTED_HEADS)) + list(HeadSet(DECOY_HEADS)):
        assert head.head in new_slots  # every planted/decoy head is made by the planting, not inherited
    o_proj = model.model.language_model.layers[2].self_attn.o_proj.weight.detach()
    assert float(o_proj.unflatten(1, (16, 16))[:, new_slots].abs().max()) == 0.0


def test_relabelling_keeps_the_function_and_moves_each_head_to_its_slot() -> None:
    """``relabel_heads`` (the negative transfer control) against the unrelabelled model with plain hooks: same
    logits, and masking head h before equals masking ``relabel_slot(h)`` after."""
    config = trainer.TrainConfig(model="planted-b", **{**TINY_SHAPE, "text_shape": TextBackboneShape(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8)})
    processor = trainer.build_processor("planted-b")
    model = trainer.build_model(config, processor).eval()
    with torch.no_grad():  # non-zero biases, so a bias left in place would show
        for layer in model.model.language_model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.normal_()
    samples, inputs = _batch(processor)
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    before = {}
    with torch.no_grad():
        before["all"] = model(**inputs).logits
        for head in ("L0H1", "L1H2"):
            with planted.head_multipliers(model, planted.mask_multipliers(model, HeadSet([head]))):
                before[head] = model(**inputs).logits
        planted.relabel_heads(model)
        assert torch.allclose(model(**inputs).logits, before["all"], atol=1e-5)
        for head in ("L0H1", "L1H2"):
            moved = planted.relabelled([head], 4, 2)
            assert moved != [head]
            with planted.head_multipliers(model, planted.mask_multipliers(model, HeadSet(moved))):
                assert torch.allclose(model(**inputs).logits, before[head], atol=1e-5), head
            with planted.head_multipliers(model, planted.mask_multipliers(model, HeadSet([head]))):
                assert not torch.allclose(model(**inputs).logits, before[head], atol=1e-3), head


def test_relabelling_sends_every_special_head_to_an_ordinary_slot() -> None:
    """At the planted backbone's shape (16 heads, 4 KV heads) no planted or decoy index is planted or decoy after
    relabelling, and the relabelling is an involution."""
    special = set(PLANTED_HEADS) | set(DECOY_HEADS)
    moved = planted.relabelled(list(special), 16, 4)
    assert not special & set(moved)
    assert set(planted.relabelled(moved, 16, 4)) == special


def test_transfer_control_rule() -> None:
    """``transfer_control``: holds only when the shared pair holds and the relabelled pair does not; a pair that
    reads against its construction fails it; anything undecided (or a partner missing) is inconclusive."""
    from vrh_interp.experiments.positive_control import transfer_verdict

    def rows(shared: str, relabelled: str | None) -> list[dict]:
        out = [{"shares_backbone": True, "verdict": shared}]
        return out + ([{"shares_backbone": False, "verdict": relabelled}] if relabelled else [])

    assert transfer_verdict(rows("holds", "does not hold")) == "holds"
    assert transfer_verdict(rows("holds", "inconclusive")) == "holds"  # the negative control never holding is enough
    assert transfer_verdict(rows("holds", "holds")) == "does not hold"
    assert transfer_verdict(rows("does not hold", "does not hold")) == "does not hold"
    assert transfer_verdict(rows("inconclusive", "does not hold")) == "inconclusive"
    assert transfer_verdict(rows("holds", None)) == "inconclusive"


PAIR_SHIPPED = all((checkpoint_dir(name) / "model.safetensors").exists() for name in ("planted-b", "planted-x"))


@pytest.mark.skipif(not PAIR_SHIPPED, reason="toy:planted-b / toy:planted-x are not shipped in this installation")
def test_planted_pairs_transfer_as_constructed_through_plain_hooks() -> None:
    """Independently of the library (the trainer's plain forward pre-hooks, greedy decoding): masking toy:planted's
    declared heads BY INDEX collapses toy:planted-b's grounding (the same backbone) and leaves toy:planted-x's (the
    relabelled copy) near its baseline, where masking planted-x's own declared heads collapses it."""
    samples = trainer.held_out_samples(16, 1, 300)  # scenes no shipping choice looked at
    source, _ = declared_heads(checkpoint_dir("planted"))
    accuracies = {}
    for name in ("planted-b", "planted-x"):
        model, processor = load(name)
        own, _ = declared_heads(checkpoint_dir(name))
        accuracies[name] = {which: planted.masked_accuracy(model, processor, samples, heads, name)
                            for which, heads in (("none", HeadSet()), ("source", source), ("own", own))}
    b, x = accuracies["planted-b"], accuracies["planted-x"]
    assert b["none"] >= 0.6 and x["none"] >= 0.6, accuracies
    assert b["source"] <= b["none"] - 0.4, accuracies  # transfer where the indices are shared
    assert x["source"] >= x["none"] - 0.15, accuracies  # none where they are not
    assert x["own"] <= x["none"] - 0.4, accuracies  # ... although planted-x has the heads, elsewhere
