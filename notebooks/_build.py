"""Writes the notebooks in this folder from the cell sources below (run: python notebooks/_build.py; then
``python notebooks/_build.py --execute [01 ...]`` stores their executed outputs).

Notebooks are generated so their code is reviewed as plain Python; tests/test_notebooks.py executes
every notebook top to bottom and compares the kinds of its outputs with the stored ones, so they cannot rot. They run on the shipped toy model when it is present
(``toy:a``) and otherwise on a tiny random-weight fixture (then the numbers mean nothing; the code path
is the same).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

# No magics: the figures of vrh_interp.viz.plots display themselves (a `_repr_png_`), so a cell ending in one shows the
# picture in a fresh kernel without `%matplotlib inline` (tests/test_notebooks.py checks no notebook needs it).
# No progress bars or library warnings in the stored outputs: transformers' weight-loading bars and info lines,
# and tqdm.auto's "IProgress not found" warning where ipywidgets is not installed.
QUIET = '''import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # before transformers imports tqdm.auto
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
'''

PICK_MODEL = QUIET + '''
from vrh_interp import load
from vrh_interp.toy import CHECKPOINT_ROOT

MODEL = "toy:a" if (CHECKPOINT_ROOT / "a" / "config.json").exists() else "tiny:llava"
vlm = load(MODEL)
print(MODEL, vlm.adapter.display_name, vlm.geometry)'''

NOTEBOOKS = {
    "01_find_and_test_vrhs.ipynb": [
        ("markdown", "# Find the Visual Retrieval Heads of a model and test whether they are causal\n\n"
                     "Score every attention head on detection scenes, then mask the top-k heads on DISJOINT "
                     "evaluation scenes next to 19 random and 19 layer-matched sets of k heads drawn outside them. "
                     "The claim \"these heads are causal for grounding\" holds only when masking them causes a "
                     "significant drop AND a larger one than every control set (empirical p <= 0.05).\n\n"
                     "The model is `toy:planted`, the positive control shipped with the package: a toy VLM whose "
                     "three retrieval heads were declared before training and planted by construction, so we know "
                     "what the pipeline should find. Change `MODEL` to `toy:a`, a folder or a hub id to run the "
                     "same cells on another model (on toy A the claim does not hold: "
                     "[results](../docs/results/toy-a.md)). Every sentence below the cells is computed from the "
                     "numbers above it."),
        ("code", QUIET + '''
from vrh_interp import load
from vrh_interp.experiments import positive_control

MODEL = "toy:planted" if positive_control.available() else "tiny:llava"
vlm = load(MODEL)
planted = positive_control.declared()[0] if MODEL == "toy:planted" else None
print(MODEL, vlm.adapter.display_name, vlm.geometry, "| planted heads:", planted)'''),
        ("code", '''from vrh_interp.data.sources import synthetic_samples
from vrh_interp import score_heads, sweep

detect = synthetic_samples("detect", 24)
evaluate = synthetic_samples("eval", 24)  # disjoint scenes: the sweep refuses overlapping sample ids
scores = score_heads(vlm, detect, "vrh", batch_size=24, progress=False)
scores.to_frame().head(5)'''),
        ("code", '''from vrh_interp.viz import plots
plots.score_heatmap(scores.scores, "VRH scores")'''),
        ("code", '''K = 3
result = sweep(vlm, evaluate, scores, ks=(0, K), random_seeds=range(19), batch_size=64, progress=False)
summary = result.summary()
shown = summary[~summary["condition"].isin(["random", "matched"]) | (summary["seed"].astype(str) == "all")]
shown[["condition", "k", "sets", "n", "accuracy", "accuracy_ci_low", "accuracy_ci_high", "p_value_vs_baseline",
       "p_vs_random", "p_vs_matched"]]'''),
        ("code", '''from IPython.display import Markdown
from vrh_interp.experiments.verdicts import sweep_claims

claims = sweep_claims(result)  # the claims rules: holds / does not hold / inconclusive, with the items that decide
verdict = claims.iloc[0]
top = summary[(summary["condition"] == "top") & (summary["k"] == K)].iloc[0]
controls = {kind: summary[(summary["condition"] == kind) & (summary["k"] == K) & (summary["seed"].astype(str) == "all")]
            .iloc[0] for kind in ("random", "matched")}
found = scores.top(K)
recovered = "" if planted is None else (
    f"The top-{K} heads by score are {found}: {'exactly' if set(found) == set(planted) else 'NOT'} the planted "
    f"heads {planted}. ")
Markdown(f"{recovered}Masking them takes grounding accuracy from "
         f"{summary.loc[summary['condition'] == 'baseline', 'accuracy'].iloc[0]:.2f} to {top['accuracy']:.2f} "
         f"(95 % CI {top['accuracy_ci_low']:.2f}-{top['accuracy_ci_high']:.2f}, n = {top['n']}); "
         f"{int(controls['random']['sets'])} random sets of {K} heads leave {controls['random']['accuracy']:.2f} on "
         f"average and {int(controls['matched']['sets'])} layer-matched sets {controls['matched']['accuracy']:.2f}. "
         f"**The causal claim: {verdict['verdict'].upper()}** ({verdict['reason']}; {verdict['numbers']}).")'''),
        ("code", '''plots.k_sweep_curve(summary)'''),
        ("markdown", "What the heads look at: the mean attention of the top heads' answer rows over the image, for "
                     "one evaluation scene, with the referent's box and the model's answer box drawn in the "
                     "image's pixels."),
        ("code", '''from vrh_interp.core.description.boxes import Box
from vrh_interp.viz.overlays import overlay_figures, prediction_overlays

records = result.records
grounded = set(records[(records["condition"] == "baseline:k=0") & (records["iou"] >= 0.5)]["sample_id"])
sample = next((s for s in evaluate if s.sample_id in grounded), evaluate[0])  # a scene the model grounds
overlay = prediction_overlays(vlm, sample, scores.top(K))
figure = overlay_figures(overlay)[1]  # [all heads, the top-K heads, all heads except them]
figure.axes[0].set_title(f"top-{K} heads {scores.top(K)}\\n\\"{sample.expression}\\"", fontsize=9)
print("expression:", repr(sample.expression))
answer_box = overlay.predicted  # a Box in the image's pixels, or why the answer did not parse
print("answer:", repr(overlay.answer), "-> box in pixels",
      tuple(round(v) for v in answer_box.as_tuple()) if isinstance(answer_box, Box) else answer_box)
print("ground truth box in pixels:", tuple(round(v) for v in overlay.truth.as_tuple()))
figure'''),
    ],
    "02_transfer_between_models.ipynb": [
        ("markdown", "# Transfer Visual Retrieval Heads between two models that share a language backbone\n\n"
                     "The paper (sec. 5.3, Fig. 7) finds that VLMs built on the same base LLM share their VRHs: the "
                     "heads found in one model, masked in the other, hurt grounding about as much as the other "
                     "model's own heads, and more than random heads. Here: find the heads of both models, compare "
                     "the two score maps against chance, then cross-mask over a k-sweep.\n\n"
                     "The pair is the shipped toy models: `toy:a` (LLaVA class) and `toy:b` (InternVL class, a "
                     "different vision tower and projector, fine-tuned from A's language backbone). Where toy B is "
                     "not shipped in this installation, the notebook says so and runs the same code on a stand-in "
                     "pair of random-weight fixtures with one head grid (the numbers then mean nothing)."),
        ("code", QUIET + '''
from vrh_interp import load
from vrh_interp.toy import checkpoint_dir

if all((checkpoint_dir(name) / "config.json").exists() for name in ("a", "b")):
    PAIR = ("toy:a", "toy:b")
else:
    PAIR = ("tiny:llava", "tiny:llava_next")
    print("toy B is not shipped in this installation (no", checkpoint_dir("b") / "config.json", "):",
          "running on the stand-in pair", PAIR, "- random weights, the numbers mean nothing")
vlm_a, vlm_b = (load(spec) for spec in PAIR)
LABELS = ("A", "B")
for label, spec, vlm in zip(LABELS, PAIR, (vlm_a, vlm_b)):
    print(label, spec, vlm.adapter.display_name, vlm.geometry)
assert vlm_a.geometry == vlm_b.geometry, "index transfer needs one head grid"'''),
        ("code", '''from vrh_interp import score_heads
from vrh_interp.data.sources import synthetic_samples

detect = synthetic_samples("detect", 16)
evaluate = synthetic_samples("eval", 12)  # disjoint from the detection scenes
scores_a = score_heads(vlm_a, detect, "vrh", batch_size=16, progress=False)
scores_b = score_heads(vlm_b, detect, "vrh", batch_size=16, progress=False)
print("A top 5:", scores_a.top(5), " B top 5:", scores_b.top(5))'''),
        ("code", '''from vrh_interp.viz import plots
from vrh_interp.experiments.transfer import compare_scores

comparison = compare_scores(scores_a, scores_b, ks=(3, 5, 8))
display(plots.score_map_comparison(scores_a.scores, scores_b.scores, LABELS, k=5))
comparison'''),
        ("code", '''from vrh_interp.experiments.ks import demo_ks
from vrh_interp.experiments.transfer import cross_masking

_, k_star = demo_ks(vlm_a.geometry.total_heads)  # the demo's k* (1 of a toy's 32 heads: the paper's ~2%)
ks = sorted({0, 1, 2, k_star})  # a short sweep keeps the notebook fast; `vrh demo` runs the full one
result = cross_masking(vlm_a, vlm_b, scores_a, scores_b, evaluate, ks=ks, random_seeds=(0,), labels=LABELS,
                       batch_size=16, progress=False)
summary = result.summary()
masked_in_b = {c.key: c.heads for c in result.results["B"].conditions}
assert masked_in_b[f"transferred:k={k_star}"] == scores_a.top(k_star)  # A's top-k, same indices in B
summary[["model", "heads_from", "condition", "k", "seed", "accuracy", "accuracy_ci_low", "accuracy_ci_high",
         "p_value_vs_baseline", "p_vs_random"]]'''),
        ("code", '''plots.cross_masking_curves(summary)'''),
        ("code", '''from vrh_interp.experiments.transfer import masking_drops

drops = masking_drops(summary, k_star)
drops'''),
        ("code", '''from IPython.display import Markdown

overlap = comparison.set_index("statistic")
shared = {k: int(overlap.loc[f"top-{k} overlap", "heads_shared"]) for k in (3, 5, 8)}
lines = [f"The two score maps share {shared[3]} of their top-3 heads, {shared[5]} of their top-5 and {shared[8]} of "
         f"their top-8 (top-5: permutation p = {overlap.loc['top-5 overlap', 'p_value']:.2g} against chance, "
         f"chance overlap {overlap.loc['top-5 overlap', 'chance_mean']:.2f}); Spearman of the maps "
         f"{overlap.loc['spearman', 'value']:.2f}."]
for _, row in drops.iterrows():
    lines.append(f"{row['direction']} at k = {row['k']}: accuracy drops by " + ", ".join(
        f"{row[name]:.2f} ({name.removesuffix('_drop')} heads)" for name in drops.columns if name.endswith("_drop"))
        + ".")
from vrh_interp.evaluation.claims import CLAIMS, decide
from vrh_interp.experiments.verdicts import transfer_evidence

verdict, reason = decide(CLAIMS["shared"], transfer_evidence(result.results, k_star))
lines.append(f"**Transfer (the claims rule, both directions): {verdict.upper()}** ({reason}).")
Markdown("\\n\\n".join(lines) + "\\n\\nThe heads transfer when the transferred heads hurt about as much as the "
         "model's own and more than random sets; one random set per k here keeps the notebook fast, so this notebook "
         "cannot show transfer (the rule says inconclusive), only how to measure it. `vrh demo` runs the "
         "same analysis with 20 random sets and writes it into its report ([A vs B on the toys](../docs/results/"
         "toy-a.md)).")'''),
        ("markdown", "## The paper's own pairs, from its published lists\n\n"
                     "Appendix D publishes the top-20 heads of Qwen2.5-VL-7B, InternVL3-8B (both Qwen2.5-7B) and "
                     "Qwen3-VL-8B, InternVL3.5-8B (both Qwen3-8B) on five benchmarks (`vrh_interp.core.description.published`, "
                     "[docs](../docs/published-heads.md)). The overlap of each same-backbone pair against chance: "
                     "uniform over the grid, and layer-matched (same heads per layer, random heads within a layer). "
                     "On a real checkpoint, `sweep(vlm, samples, published.heads(...))` or "
                     "`vrh sweep --vrhs published:qwen2.5-vl-7b/refcoco` masks a published set."),
        ("code", '''from vrh_interp.core.description import published

published.same_backbone_overlap()[["pair", "benchmark", "shared", "jaccard", "chance_uniform", "p_uniform",
                                   "chance_layer_matched", "p_layer_matched"]]'''),
    ],
    "03_trace_and_ablate.ipynb": [
        ("markdown", "# Trace and ablate with nnsight inside your own experiments\n\n"
                     "The templates are plain data; apply them inside your own `vlm.nn.trace(...)`."),
        ("code", PICK_MODEL),
        ("code", '''import nnsight, torch
from vrh_interp.core.execution import interventions as iv
from vrh_interp.core.description.heads import Head, HeadSet
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.core.execution.templates import apply_in_order

sample = synthetic_samples("eval", 1)[0]
batch = vlm.encode_grounding([sample.image], [sample.expression])
heads = HeadSet([Head(0, 0), Head(1, 1)])
ablation = iv.head_ablation(vlm, heads)
readout = iv.attention_readout(vlm, [-1])
model = vlm.nn
with torch.no_grad(), model.trace(**batch.encoding):
    rows = nnsight.save(apply_in_order(model, [readout, ablation])[0])
    logits = nnsight.save(model.output.logits)
with torch.no_grad():
    plain = vlm.hf_model(**batch.encoding).logits
print("max logit change from ablating", heads, float((logits - plain).abs().max()))
assert float((logits - plain).abs().max()) > 0
assert torch.allclose(rows[0].sum(-1), torch.ones_like(rows[0].sum(-1)), atol=1e-5)'''),
        ("code", '''from vrh_interp.core.description.boxes import BoxParseFailure
from vrh_interp.viz.plots import pair_panels


def answer_in_pixels(interventions):
    """Greedy answer under ``interventions``, and its box parsed from the model's native format into pixels."""
    result = iv.run_generate(vlm, batch.encoding, interventions, max_new_tokens=24)
    answer = vlm.decode_answers(result.ids, batch.prompt_length)[0]
    box = vlm.adapter.parse_box(answer, batch.frames[0])
    return answer, None if isinstance(box, BoxParseFailure) else tuple(round(v) for v in box.as_tuple())


answers = {"unmasked": answer_in_pixels([]), f"{heads} masked": answer_in_pixels([ablation])}
print("expression:", repr(sample.expression), "| ground truth (pixels):", tuple(sample.box))
for name, (text, box) in answers.items():
    print(f"{name}: answer {text!r} -> box in pixels {box}")
pair_panels((sample.image, sample.image), {"ground truth": sample.box},
            titles=tuple(f"{name}: {sample.expression}" for name in answers),
            answers=tuple(box for _, box in answers.values()))'''),
    ],
    "04_activation_patching.ipynb": [
        ("markdown", "# Activation patching: what do the retrieval heads carry?\n\n"
                     "Masking shows that the Visual Retrieval Heads are *necessary* for grounding. Patching asks the "
                     "complementary question: copy a head's output from a **clean** run into a **corrupted** run "
                     "(the same scene with the referent moved) and measure how much of the clean answer comes back; "
                     "a head whose output alone restores it *carries* the referent's location.\n\n"
                     "Metric: the whole answer. Both runs' boxes are teacher-forced in full on each input and the "
                     "metric is `log P(clean box) - log P(corrupted box)`, every box token's log-probability summed, "
                     "so all four coordinates count (and it splits exactly into x1, y1, x2, y2 and the format "
                     "tokens). `prepare_pairs(..., metric=\"first_token\")` keeps the old single-token logit "
                     "difference at the first token where the answers differ: one coordinate only. Recovery is "
                     "`(patched - corrupted) / (clean - corrupted)`, as a ratio of means over pairs: 0 = no effect, "
                     "1 = the clean behaviour.\n\n"
                     "First ONE pair end to end on the shipped toy model A, then 12 pairs of each kind for numbers."),
        ("code", QUIET + '''
import vrh_interp as vrh
from vrh_interp import toy
from vrh_interp.viz import plots
from vrh_interp.core.description.tiny import build_tiny

if (toy.checkpoint_dir("a") / "config.json").exists():
    model, processor = toy.load("a")
    TARGETS = "greedy"  # the metric compares the model's own two answers
else:  # stand-in: random weights rarely answer two inputs differently, so compare the referents' boxes
    tiny = build_tiny("llava")
    model, processor = tiny.model, tiny.processor
    TARGETS = "ground_truth"
    print("toy A is not shipped in this installation: random-weight stand-in, the numbers mean nothing")
vlm = vrh.wrap(model, processor)
geometry = vlm.geometry
print(vlm.adapter.display_name, geometry, "targets:", TARGETS)'''),
        ("markdown", "## One pair\n\n"
                     "`referent_moved`: the same expression on the same scene with the referent shifted to a free "
                     "spot; every other pixel is identical. Among the first `N_PAIRS` = 12 such pairs (reused in the "
                     "many-pair section) we take one where the model grounds both inputs correctly, so its answer "
                     "follows the object."),
        ("code", '''from vrh_interp.core.description.boxes import BoxParseFailure
from vrh_interp.patching.batch import prepare_pairs
from vrh_interp.patching.pairs import make_pairs
from vrh_interp.data.checks import as_box


def answer_box(sample, answer):
    """The parsed answer box in the image's pixels, or None if it did not parse."""
    frame = vlm.encode_grounding([sample.image], [sample.expression]).frames[0]
    box = vlm.adapter.parse_box(answer, frame)
    return None if isinstance(box, BoxParseFailure) else box


def follows_the_object(batch, i):
    pair = batch.pairs[i]
    clean = answer_box(pair.clean, batch.clean_answers[i])
    corrupted = answer_box(pair.corrupted, batch.corrupted_answers[i])
    return (clean is not None and corrupted is not None and clean.iou(as_box(pair.clean.box)) >= 0.5
            and corrupted.iou(as_box(pair.corrupted_box)) >= 0.5)


N_PAIRS = 12  # per kind in the many-pair section: few, to keep the notebook fast on CPU
candidates = prepare_pairs(vlm, make_pairs("referent_moved", N_PAIRS), targets=TARGETS)
index = next((i for i in range(candidates.n) if follows_the_object(candidates, i)), 0)
pair = candidates.pairs[index]
one = prepare_pairs(vlm, [pair], targets=TARGETS)
print(pair.pair_id, repr(pair.clean.expression))
print("clean answer:    ", one.clean_answers[0], " referent box", pair.clean.box)
print("corrupted answer:", one.corrupted_answers[0], " referent box", pair.corrupted_box)
answers = (answer_box(pair.clean, one.clean_answers[0]), answer_box(pair.corrupted, one.corrupted_answers[0]))
plots.pair_panels((pair.clean.image, pair.corrupted.image),
                  {"clean referent": pair.clean.box, "corrupted referent": pair.corrupted_box},
                  titles=(f"clean: {pair.clean.expression}", "corrupted: referent moved"),
                  answers=tuple(None if a is None else a.as_tuple() for a in answers))'''),
        ("code", '''from vrh_interp.patching.batch import baseline

from vrh_interp.patching.batch import GROUPS

tokens = vlm.tokenizer.convert_ids_to_tokens
base = baseline(vlm, one)
print("clean answer tokens:", list(zip(tokens(one.clean_ids[0]), [GROUPS[g] for g in one.clean_groups[0]])))
print(f"log P(clean box) - log P(corrupted box): clean run {base.clean[0]:+.3f}, corrupted run {base.corrupted[0]:+.3f}")
print("per coordinate, clean - corrupted:",
      {g: round(float(v), 2) for g, v in zip(GROUPS, base.clean_parts[0] - base.corrupted_parts[0])})
assert base.clean[0] > base.corrupted[0]'''),
        ("markdown", "### Patch each head\n\n"
                     "Each head's output (its slice of the output projection's input) at the answer positions, "
                     "copied clean -> corrupted, one head at a time; `heads_per_forward=8` heads share one batched "
                     "forward pass (one copy of the corrupted row per head), exactly equal to patching them one by "
                     "one."),
        ("code", '''from vrh_interp.patching.head_patching import patch_each_head

exact = patch_each_head(vlm, one, base=base, heads_per_forward=8, progress=False)
ranked = exact.frame.sort_values("recovery", ascending=False)
top_head = vrh.Head(int(ranked.iloc[0]["layer"]), int(ranked.iloc[0]["head_index"]))
print("top heads:", list(ranked["head"][:4]), "recoveries", ranked["recovery"][:4].round(3).tolist())
plots.patching_heatmap(exact.recovery_grid(geometry.num_layers, geometry.num_heads),
                       f"recovery per head, pair {pair.pair_id}")'''),
        ("markdown", "### Attribution patching\n\n"
                     "Linear estimates of every head's effect: the gradient at the corrupted run x (clean - "
                     "corrupted activation), from ONE forward and backward pass, and integrated gradients (the "
                     "gradient averaged along the path from corrupted to clean, one layer at a time). They are only "
                     "worth using where they agree with the exact sweep ON THE HEADS THAT MATTER: "
                     "`compare_attribution` judges the top heads by exact recovery, not the many near zero."),
        ("code", '''from vrh_interp.patching.attribution import attribution_patching, compare_attribution

estimate = attribution_patching(vlm, one, base=base)
agreement = compare_attribution(exact, estimate)
integrated = compare_attribution(exact, attribution_patching(vlm, one, base=base, method="integrated_gradients"))
for name, row in (("gradient", agreement), ("integrated gradients", integrated)):
    print(f"{name}: top {row['top_k']} exact heads {row['top_k_heads']}, Spearman {row['top_k_spearman']:.2f}, "
          f"ratio {row['ratio_min']:.2f} to {row['ratio_max']:.2f}; safe substitute: {row['safe_substitute']}")
plots.attribution_scatter(exact.frame, estimate.frame, agreement)'''),
        ("markdown", "### Where does the top head read from?\n\n"
                     "For the top head only, its keys and values at the visual tokens of one region are copied "
                     "clean -> corrupted and its output at the answer positions is recomputed. The text is "
                     "identical in a moved-referent pair, so only visual regions can recover anything; the dashed "
                     "line is the whole head's output patched (the ceiling)."),
        ("code", '''from vrh_interp.patching.positions import position_patching

regions = position_patching(vlm, one, [top_head], base=base)
display(regions[["head", "region", "recovery", "mean_positions"]].round(3))
plots.position_patching_map(regions, image=pair.corrupted.image,
                            boxes={"clean_referent": pair.clean.box, "corrupted_referent": pair.corrupted_box})'''),
        ("markdown", "### Direct vs total effect, and the box itself\n\n"
                     "Total: the head patched, everything downstream reacts. Direct: the same patch with every "
                     "later MLP and head frozen at its corrupted value, so only the residual-stream path to the "
                     "logits is left. `patched_answers` lets the corrupted input generate with the head patched at "
                     "every step, and scores the box it writes."),
        ("code", '''from vrh_interp.core.description.heads import HeadSet
from vrh_interp.patching.head_patching import patched_answers
from vrh_interp.patching.mediation import direct_and_total_effect

effect = direct_and_total_effect(vlm, one, HeadSet([top_head]), base=base)
print({k: round(v, 3) if isinstance(v, float) else v for k, v in effect.items()})
patched_answers(vlm, one, HeadSet(ranked["head"][:2]))[["clean_answer", "patched_answer", "iou_clean_box",
                                                       "iou_corrupted_box"]]'''),
        ("markdown", "### Read-out probes and preference pairs\n\n"
                     "Detect the VRHs (the VRH preset, 16 detection scenes), then: can a ridge probe read the "
                     "referent's box and attributes off their outputs at the prompt end, better than off as many "
                     "random heads? (24 scenes: a smoke test of the API, not a result.) Finally export DPO pairs "
                     "(unmasked answer `chosen`, VRH-masked answer `rejected`, and a random-head control) in TRL's "
                     "layout into a temporary folder."),
        ("code", '''from vrh_interp import score_heads
from vrh_interp.patching.probes import readout_probes, summarise_random
from vrh_interp.data.sources import synthetic_samples

vrhs = score_heads(vlm, synthetic_samples("detect", 16), "vrh", batch_size=16, progress=False).top(2)
probe_samples = synthetic_samples("eval", 24)
probes = readout_probes(vlm, probe_samples, vrhs, random_seeds=range(5), matched=True, batch_size=24, resamples=200)
print("VRHs:", vrhs)
summarise_random(probes).round(3)'''),
        ("code", '''import json
import tempfile
from pathlib import Path

from vrh_interp.experiments.preferences import export_preference_pairs

with tempfile.TemporaryDirectory() as folder:
    exported = export_preference_pairs(vlm, probe_samples[:6], vrhs, Path(folder) / "pairs.jsonl", batch_size=6)
    records = [json.loads(line) for line in (Path(folder) / "pairs.jsonl").read_text().splitlines()]
display(exported[["condition", "heads", "n_pairs", "n_identical", "chosen_accuracy", "rejected_accuracy"]])
if records:
    print(json.dumps({k: records[0][k] for k in ("chosen", "rejected", "images")}))'''),
        ("markdown", "## A dozen pairs\n\n"
                     "One pair is an anecdote. The same measurements on the 12 moved-referent pairs, with bootstrap "
                     "CIs over pairs: every head patched exactly, and how well attribution patching ranks them."),
        ("code", '''moved = candidates  # the N_PAIRS moved-referent pairs prepared above
moved_base = baseline(vlm, moved)
sweep_n = patch_each_head(vlm, moved, base=moved_base, heads_per_forward=8, progress=False)
estimate_n = attribution_patching(vlm, moved, base=moved_base)
agreement_n = compare_attribution(sweep_n, estimate_n)
best = sweep_n.frame.sort_values("recovery", ascending=False).iloc[0]
top_n = vrh.Head(int(best["layer"]), int(best["head_index"]))
print(f"{moved.n} pairs ({len(moved.excluded)} excluded); top head {top_n}: recovery {best['recovery']:.3f} "
      f"[{best['ci_low']:.3f}, {best['ci_high']:.3f}]; attribution on the top {agreement_n['top_k']} exact heads: "
      f"Spearman {agreement_n['top_k_spearman']:.3f} (all heads {agreement_n['spearman']:.3f}), safe substitute: "
      f"{agreement_n['safe_substitute']}")
display(plots.patching_heatmap(sweep_n.recovery_grid(geometry.num_layers, geometry.num_heads),
                               f"recovery per head, {moved.n} referent_moved pairs"))
plots.attribution_scatter(sweep_n.frame, estimate_n.frame, agreement_n)'''),
        ("markdown", "Is the VRH set special? Not against two or three random draws: against the DISTRIBUTION of "
                     "same-size sets. `compare_with_controls` patches 20 random and 20 layer-matched sets (the "
                     "sweep's controls, drawn outside the VRHs) and every same-size set of the other heads (here "
                     "predicted from the single-head recoveries, with the additivity measured on the 40 sets patched "
                     "exactly), and reports the VRH set's rank and tail probability in each."),
        ("code", '''from vrh_interp.patching.controls import compare_with_controls

controls = compare_with_controls(vlm, moved, vrhs, random_seeds=range(20), single=sweep_n, base=moved_base)
print("additivity check:", {k: round(float(v), 3) for k, v in controls.additivity.items()})
controls.summary[["population", "method", "sets", "mean", "q95", "max", "vrh_recovery", "rank", "tail_p"]].round(3)'''),
        ("markdown", "Each kind of pair isolates a different input change. Per kind, 12 pairs: the VRHs patched "
                     "together, recovery of the whole answer and of each coordinate. Pairs whose two answers "
                     "coincide carry no signal and are excluded (counted)."),
        ("code", '''import pandas as pd

from vrh_interp.patching.head_patching import patch_head_set
from vrh_interp.patching.pairs import PAIR_KINDS

batches, rows = {"referent_moved": (moved, moved_base)}, []
for kind in PAIR_KINDS:
    if kind not in batches:
        batch = prepare_pairs(vlm, make_pairs(kind, N_PAIRS), targets=TARGETS)
        batches[kind] = (batch, baseline(vlm, batch))
    batch, kind_base = batches[kind]
    result = patch_head_set(vlm, batch, vrhs, base=kind_base)
    rows.append({"kind": kind, "pairs": batch.n, "excluded": len(batch.excluded),
                 "VRHs": f"{result['recovery']:.2f} [{result['ci_low']:.2f}, {result['ci_high']:.2f}]",
                 **{g: round(result[f"recovery_{g}"], 2) for g in GROUPS[:4]}})
pd.DataFrame(rows)'''),
        ("markdown", "Where the top head reads from, in an expression swap (same image, the expression of another "
                     "object: the visual keys and values are the same in both runs, up to the rotary phase where the "
                     "two prompts are padded differently, so only the text can matter) "
                     "and in a moved referent (same text: only visual regions can). Where no region recovers what the "
                     "whole head output does, the difference enters through the head's QUERY (computed from the "
                     "corrupted run's residual stream at the answer position), which key/value patching leaves "
                     "alone."),
        ("code", '''region_frames = []
for kind in ("expression_swap", "referent_moved"):
    batch, kind_base = batches[kind]
    frame = position_patching(vlm, batch, [top_n], base=kind_base)
    region_frames.append(frame.assign(head=f"{kind}\\n{top_n}"))
plots.position_patching_map(pd.concat(region_frames),
                            title=f"{top_n}: key/value patching by region, {N_PAIRS} pairs per kind")'''),
        ("markdown", "Direct vs total effect of the VRHs and of a random set of as many heads, over the same pairs."),
        ("code", '''from vrh_interp.patching.mediation import mediation_table

from vrh_interp.patching.controls import control_sets

mediation_table(vlm, moved, {"VRHs": vrhs, **control_sets(geometry, vrhs, random_seeds=(0, 1))}).round(3)'''),
        ("markdown", "Reading it: a head carries the referent's location in moved-referent pairs when patching it "
                     "alone recovers much of the whole answer and that recovery comes through its keys and values "
                     "at the referents' visual tokens, not the distractors', the background's or the text's. A head "
                     "set is special when few same-size sets recover as much: its tail probability among random, "
                     "layer-matched and all sets is small (a random set that happens to contain a strong head can "
                     "match it, which is why a handful of draws proves nothing). A dozen pairs keep this notebook "
                     "fast; every function takes any number of pairs, and a handle placed with "
                     "`vlm.on(remote=True)` for NDIF."),
    ],
    "05_steer_and_localize.ipynb": [
        ("markdown", "# Steer and localize: are the retrieval heads sufficient, and do they know where the referent "
                     "is?\n\n"
                     "Masking (notebook 01) tests necessity: remove the top heads and grounding breaks. Two more "
                     "questions about the same heads:\n\n"
                     "1. **Sufficiency by redirection** (`vrh steer`, `vrh_interp.experiments.steer`): give the top-3 "
                     "heads a pre-softmax bias alpha on the visual tokens of ANOTHER object of the image, at the rows "
                     "that write the answer, and read where the answer's box lands: it **moves** to the target "
                     "(IoU >= 0.5 with its box), **stays** on the referent or **breaks** (no box, or a box on "
                     "neither). The claim `sufficient` holds only when the top-3 move more answers than alpha = 0 and "
                     "more than every kind of control set of 3 heads redirected the same way.\n"
                     "2. **Attention boxes** (`vrh localize`, `vrh_interp.experiments.localize`): read a box from the "
                     "heads' attention over the image (the Localization Heads recipe) and score it beside the "
                     "model's own generated box, on the same items.\n\n"
                     "The model is the positive control `toy:planted`: three retrieval heads declared before "
                     "training and planted, and two decoy heads that attend to other objects. Sizes are small so "
                     "that the notebook runs on CPU in about a minute; the full experiments (more items, up to 199 "
                     "control sets per kind) are on the results pages ([steer](../docs/results/steer.md), "
                     "[localize](../docs/results/localize.md)), and the [recipe](../docs/recipes/steer-and-localize.md) "
                     "makes the same calls in a script. Every sentence below the cells is computed from the numbers "
                     "above it."),
        ("code", QUIET + '''
from vrh_interp import load, score_heads
from vrh_interp.data.sources import synthetic_samples
from vrh_interp.experiments import positive_control

MODEL = "toy:planted" if positive_control.available() else "tiny:llava"  # tiny: random weights, meaningless numbers
vlm = load(MODEL)
planted, decoys = positive_control.declared() if MODEL == "toy:planted" else (None, None)
K = 3
scores = score_heads(vlm, synthetic_samples("detect", 16), "vrh", batch_size=16, progress=False)
print(MODEL, "| planted heads:", planted, "| decoys:", decoys, f"| top-{K} by the VRH score:", scores.top(K))
scores'''),
        ("markdown", "## Redirect the top-3 onto another object\n\n"
                     "Each item is an evaluation scene with at least two referable objects: the expression names its "
                     "referent, the target is the next referable object (`steer_items`). Conditions: alpha = 0 (the "
                     "unsteered run, exactly), then at alpha 4, 8 and 16 the top-3, the planted heads and the decoys "
                     "(named sets), and 3 random and 3 layer-matched sets of 3 heads drawn outside the top-3 (the "
                     "sweep's control machinery). The claim is judged at the largest alpha, declared before the run; "
                     "its rank test draws its own control sets there, up to 39 per kind on 8 fixed items, so its "
                     "p-value reaches 1/40 (the results page: 199 sets, 1/200). The activation-patching form "
                     "(`patching=True`) and the live-head controls (`live=`) are left out to keep it fast."),
        ("code", '''import tempfile
from pathlib import Path

from vrh_interp.experiments.steer import run_steer, steer_items

RUNS = Path(tempfile.mkdtemp(prefix="vrh-notebook-05-"))  # run folders: `steer_from_run` reads one back
items = steer_items("eval", 24)  # scenes with two referable objects
named = {"planted": planted, "decoys": decoys} if planted is not None else {}
SIZES = dict(random_seeds=range(3), patching=False, rank_sets=39, rank_items=8, batch_size=24)
steered = run_steer(vlm, items, scores.ranking(), RUNS / "top", k=K, alphas=(0, 4, 8, 16), named=named, **SIZES)
print(f"{len(items)} items, e.g. {items[0].sample.expression!r} -> target {items[0].target.expression!r}")
steered.dose_response()'''),
        ("code", '''steered.plot()'''),
        ("code", '''from vrh_interp.evaluation.table import ClaimsTable

display(steered.rank())  # the sequential rank test at alpha 16, per control kind
ClaimsTable(steered.claims(), title=f"steer: is the top-{K} sufficient?")'''),
        ("markdown", "## The same with a random head set\n\n"
                     "The claim's calibration: 3 random heads, drawn outside the top-3, the planted heads and the "
                     "decoys, redirected in the top-3's place (alpha 0 and 16 only, the two the verdict reads), "
                     "against the same kinds of control sets (`vrh steer --heads ...`). A random set must not read "
                     "\"holds\"."),
        ("code", '''import pandas as pd

from vrh_interp.evaluation.controls import random_control

random_heads = random_control(vlm.geometry, scores.top(K).union([*(planted or []), *(decoys or [])]), K, seed=0)
calibration = run_steer(vlm, items, random_heads, RUNS / "random", k=K, alphas=(0, 16), **SIZES)
rows = []
for name, result in ((f"top-{K}", steered), ("random set", calibration)):
    moved = result.dose_response().set_index(["kind", "alpha"])["move_rate"]
    rows.append({"redirected": name, "heads": ", ".join(result.config["conditions"]["top:alpha=16"]),
                 "moved at alpha 0": moved[("top", 0.0)], "moved at alpha 16": moved[("top", 16.0)],
                 "verdict": result.verdict()})
display(pd.DataFrame(rows).round(3))
ClaimsTable(calibration.claims(), title=f"steer: a random set in the top-{K}'s place")'''),
        ("code", '''from IPython.display import Markdown

at = steered.dose_response().query("alpha == 16").set_index("kind")["move_rate"]
others = ", ".join(f"{kind} {rate:.0%}" for kind, rate in at.items() if kind != "top")
random_at = calibration.dose_response().set_index(["kind", "alpha"])["move_rate"][("top", 16.0)]
Markdown(f"At alpha 16 the top-{K} move {at['top']:.0%} of the {len(items)} answers to the target (alpha 0: "
         f"{steered.dose_response().set_index(['kind', 'alpha'])['move_rate'][('top', 0.0)]:.0%}); the other sets "
         f"(mean over a kind's sets): {others}. **Sufficient: {steered.verdict().upper()}.** The random set "
         f"{', '.join(random_heads.to_list())} in the top-{K}'s place moves {random_at:.0%}: "
         f"**{calibration.verdict()}** (a random set must never read \\"holds\\"; with few items a null effect can "
         "read inconclusive rather than \\"does not hold\\").")'''),
        ("markdown", "## Attention boxes beside the model's own boxes\n\n"
                     "Per item: the model's greedy answer parsed into a box, and each head set's attention box, read "
                     "from the last prompt row, summed over the heads, cells above the map's mean, the largest "
                     "8-connected component; each is right when its IoU with the referent's box is >= 0.5 "
                     "(Acc@0.5). The four-way table counts `both`, `heads_only` (the heads know where, the answer "
                     "says otherwise), `answer_only` and `neither`; `mcnemar_p` is the exact two-sided test of the "
                     "two accuracies on the same items. Smoothing is off (`sigma=0`): a referent here covers 2-3 "
                     "cells of the toy's 12 x 12 grid, and the default Gaussian of one cell (made for LLaVA-1.5's "
                     "24 x 24) spreads the map past it (compared below)."),
        ("code", '''from vrh_interp.data import grounding_samples
from vrh_interp.evaluation.attention_box import BoxReadout
from vrh_interp.experiments.localize import localize

samples = [s for scene in range(30) for s in grounding_samples("eval", scene, 1)]  # every level-1 referent
head_sets = {**({"planted": planted} if planted is not None else {}), f"vrh top-{K}": scores.top(K),
             **({"decoys": decoys} if decoys is not None else {})}
located = localize(vlm, samples, head_sets, BoxReadout(sigma=0.0), batch_size=34, progress=False)
located.summary()[["heads", "n", "heads_acc", "answer_acc", "both", "heads_only", "answer_only", "neither",
                   "mcnemar_p", "heads_mean_iou", "answer_mean_iou"]]'''),
        ("code", '''FIRST = next(iter(head_sets))  # the planted heads on toy:planted
located.four_way(FIRST)'''),
        ("code", '''from vrh_interp.evaluation.attention_box import attention_boxes
from vrh_interp.viz import plots

shown = located.items().query("heads == @FIRST").reset_index(drop=True)
index = next(iter(shown.index[shown["outcome"] == "heads_only"]), 0)  # the heads know where, the answer does not
sample, row = samples[index], shown.loc[index]
found = attention_boxes(vlm, vlm.encode_grounding([sample.image], [sample.expression]), head_sets[FIRST],
                        located.readout)[0]
boxes = {"ground truth": row["truth"], "attention box": row["heads_box"], "generated box": row["answer_box"]}
plots.attention_overlay(sample.image, found.grid, found.canvas.region,
                        {name: tuple(box) for name, box in boxes.items() if box is not None},
                        title=f"{FIRST} heads, {row['outcome']}: {sample.expression!r}")'''),
        ("code", '''smoothed = localize(vlm, samples, {FIRST: head_sets[FIRST]}, BoxReadout(), batch_size=34, progress=False)
table = located.summary().set_index("heads")
first, default = table.loc[FIRST], smoothed.summary().set_index("heads").loc[FIRST]
lines = [f"On {len(samples)} items the {FIRST} heads' attention box reaches Acc@0.5 {first['heads_acc']:.3f} against "
         f"{first['answer_acc']:.3f} for the model's own box ({int(first['heads_only'])} items heads-only, "
         f"{int(first['answer_only'])} answer-only, McNemar p = {first['mcnemar_p']:.2g})."]
if "decoys" in table.index:
    lines.append(f"The decoys, which attend to other objects, reach {table.loc['decoys', 'heads_acc']:.3f}.")
lines.append(f"With the default smoothing (sigma = 1 cell) the {FIRST} heads reach {default['heads_acc']:.3f} "
             f"(mean IoU {default['heads_mean_iou']:.3f} against {first['heads_mean_iou']:.3f} unsmoothed): sigma is "
             "in cells, so it is not a constant of the method across grids.")
Markdown(" ".join(lines))'''),
    ],
}


def build() -> None:
    """Write every notebook from its cell sources, keeping the stored outputs of cells whose source is unchanged
    (run ``--execute`` to refresh them)."""
    for name, cells in NOTEBOOKS.items():
        previous, metadata = {}, {}
        if (HERE / name).exists():
            stored = nbformat.read(HERE / name, as_version=4)
            previous = {(c.cell_type, c.source): c for c in stored.cells}
            metadata = dict(stored.metadata)  # e.g. language_info from the last --execute: rebuilding keeps it
        nb = nbformat.v4.new_notebook()
        nb.metadata.update(metadata)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
                    for kind, src in cells]
        for index, cell in enumerate(nb.cells):  # stable cell ids: rebuilding an unchanged notebook changes nothing
            old = previous.get((cell.cell_type, cell.source))
            cell.id = old.id if old is not None else hashlib.sha1(f"{name}:{index}".encode()).hexdigest()[:8]
            if old is not None and cell.cell_type == "code":
                cell.outputs, cell.execution_count = old.outputs, old.execution_count
        nbformat.write(nb, HERE / name)


def compress_png(data: str) -> str:
    """A base64 PNG re-encoded with an adaptive 256-colour palette (plots and overlays lose nothing visible),
    when that is smaller."""
    import base64
    import io

    from PIL import Image

    raw = base64.b64decode(data)
    image = Image.open(io.BytesIO(raw)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode() + "\n" if buffer.tell() < len(raw) else data


def execute(names: list[str], timeout: int = 600) -> None:
    """Run notebooks top to bottom in a scratch working directory and store their outputs (PNGs compressed,
    no timing metadata), so that they show on a code host and in the docs site."""
    import tempfile

    from nbclient import NotebookClient

    for name in names:
        nb = nbformat.read(HERE / name, as_version=4)
        with tempfile.TemporaryDirectory() as scratch:
            NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                           resources={"metadata": {"path": scratch}}).execute()
        for cell in nb.cells:
            for output in cell.get("outputs", []):
                if "image/png" in output.get("data", {}):
                    output["data"]["image/png"] = compress_png(output["data"]["image/png"])
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    import sys

    build()
    if sys.argv[1:2] == ["--execute"]:  # --execute [NAME ...]: all notebooks when none is named
        execute([n for n in NOTEBOOKS if not sys.argv[2:] or any(n.startswith(a) for a in sys.argv[2:])])
