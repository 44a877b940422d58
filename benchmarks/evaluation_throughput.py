"""Evaluation and scoring cost against plain HF ``generate``, measured side by side in one run.

Every path runs greedy generation over the same samples, pre-encoded into the same left-padded batches
(encoding is not timed; the sweep encodes its own batches, timed):

1. masked generation (ours: nnsight, one condition, heads zeroed at every step) vs plain HF ``generate``, both
   forced to the same length: ``masked / plain generate throughput`` (goal >= 0.95x);
2. a 20-condition sweep (``experiments.sweep.run_conditions``: the unmasked baseline and 19 random head sets,
   zero ablation, conditions packed into batched passes; a scene's referents share their image prefix,
   ``interventions.shared_image_prefix``) vs plain ``generate`` stopping at EOS:
   ``conditions per plain generate`` = 20 x plain time / sweep time (goal > 5);
3. the scoring pass (ours: ``scoring.collect.collect_batch``, greedy generation with the region readout
   captured during it; it stops at EOS, so its answers are plain ``generate``'s) vs plain ``generate``
   stopping at EOS: ``scoring / plain generate cost`` (goal <= 1.15x).

Items (``--items``): ``scenes`` (default) takes every referent of the first synthetic scenes (about 3.3
expressions per image, as in the demo and in RefCOCO-style data); ``distinct`` one item per image, where no
prefix is shared.

Timings are interleaved (round r runs every path once) and each path's median over rounds is reported, so a
background load drifting during the run weighs on all paths alike; ``--clock cpu`` uses process CPU time.

    python benchmarks/evaluation_throughput.py [--model toy:a] [--samples 32] [--batch-size 32]
    python benchmarks/evaluation_throughput.py --model random:qwen2-0.5b   # realistic shape, random weights

``random:qwen2-0.5b`` builds offline a random-weight ``LlavaForConditionalGeneration`` whose language backbone
has Qwen2-0.5B's dimensions (24 layers, hidden 896, 14 query / 2 KV heads of dim 64, MLP 4864: 358M parameters
outside the embedding), with the toy models' builders (``toy_training.configs``: their word-level tokenizer,
so a 301-token vocabulary, and a small CLIP tower) and 128 px images in patches of 8: 256 visual tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # toy_training (the toy models' builders) is dev tooling at the root, not installed
    sys.path.insert(0, str(ROOT))

GOALS = {"masked": ">= 0.95", "conditions": "> 5", "scoring": "<= 1.15"}
SWEEP_CONDITIONS = 20

# per model kind: samples, batch size, new tokens, rounds (the realistic shape keeps a run to minutes on 2 cores)
PROFILES: dict[str, dict[str, int]] = {
    "random": {"samples": 2, "batch_size": 2, "max_new_tokens": 8, "repeats": 3, "sweep_repeats": 1},
    "default": {"samples": 32, "batch_size": 32, "max_new_tokens": 16, "repeats": 3, "sweep_repeats": 3},
}

REALISTIC_SHAPES: dict[str, dict[str, int]] = {
    # Qwen2-0.5B (Qwen/Qwen2-0.5B config.json): the backbone of LLaVA-OneVision-0.5B
    "qwen2-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                   "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64},
}
REALISTIC_IMAGE_SIZE = 128  # patch 8 -> 16 x 16 = 256 visual tokens


def build_random_vlm(name: str, *, image_size: int = REALISTIC_IMAGE_SIZE, seed: int = 0,
                     dtype: torch.dtype = torch.float32) -> Any:
    """A random-weight LLaVA-class VLM with a real backbone's proportions, built offline (nothing downloaded)."""
    from transformers import LlavaForConditionalGeneration

    from vrh_interp.core.description.model import cast_model, wrap
    from toy_training import configs

    if name not in REALISTIC_SHAPES:
        raise SystemExit(f"unknown realistic shape {name!r}; available: {', '.join(REALISTIC_SHAPES)}")
    processor = configs.build_processor("a")  # LlavaProcessor (CLIP image processor) + the toy tokenizer
    processor.image_processor = type(processor.image_processor)(  # the same image processor at image_size
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
        image_mean=configs.CLIP_MEAN, image_std=configs.CLIP_STD)
    config = configs.model_config("a", processor.tokenizer, configs.TextBackboneShape(**REALISTIC_SHAPES[name]))
    grid = image_size // configs.PATCH_SIZE
    config.vision_config.image_size = image_size
    config.image_seq_length = grid * grid
    config.text_config.max_position_embeddings = 4096
    torch.manual_seed(seed)
    model = cast_model(LlavaForConditionalGeneration(config).eval(), dtype)  # rotary inv_freq stays float32
    return wrap(model, processor, model_id=f"random:{name}")


def load_model(spec: str, dtype: str | None) -> Any:
    if spec.startswith("random:"):
        return build_random_vlm(spec.split(":", 1)[1], dtype=getattr(torch, dtype) if dtype else torch.float32)
    from vrh_interp.specs import load_spec

    return load_spec(spec, None, dtype)


def interleaved(paths: dict[str, Callable[[], Any]], rounds: dict[str, int],
                clock: Callable[[], float]) -> dict[str, list[float]]:
    """Seconds of each path's ``rounds``, the rounds interleaved: round i runs in turn every path that has an
    i-th round."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for i in range(max(rounds.values())):
        for name, fn in paths.items():
            if i < rounds[name]:
                start = clock()
                fn()
                times[name].append(clock() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy:a", help="toy:a, tiny:<family>, random:qwen2-0.5b or a hub id")
    parser.add_argument("--samples", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--repeats", type=int, help="timed rounds (median reported)")
    parser.add_argument("--sweep-repeats", type=int, help="timed rounds of the sweep (the longest path)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", help="e.g. bfloat16 (default: the model's)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--items", choices=("scenes", "distinct"), default="scenes",
                        help="scenes: every referent of the first scenes, several expressions per image, as the demo "
                             "and RefCOCO-style data have them (the sweep shares each image's prompt prefix); "
                             "distinct: one item per image")
    parser.add_argument("--verbose", action="store_true", help="print every round's time")
    args = parser.parse_args()
    profile = PROFILES["random" if args.model.startswith("random:") else "default"]
    for key, value in profile.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    torch.set_num_threads(args.threads)

    from vrh_interp.core.execution import interventions as iv
    from vrh_interp.experiments.conditions import Condition
    from vrh_interp.experiments.sweep import run_conditions
    from vrh_interp.evaluation.controls import random_control
    from vrh_interp.core.description.heads import HeadSet
    from vrh_interp.scoring.collect import collect_batch
    from vrh_interp.data.sources import synthetic_samples

    built = time.perf_counter()
    vlm = load_model(args.model, args.dtype)
    built = time.perf_counter() - built
    geometry = vlm.geometry
    if args.items == "scenes":
        from vrh_interp.experiments.demo_plan import evaluation_items

        samples = evaluation_items(args.samples)[:args.samples]  # >= 1 referent per scene: enough scenes
    else:
        samples = synthetic_samples("eval", args.samples)
    batches = [samples[i: i + args.batch_size] for i in range(0, len(samples), args.batch_size)]
    encoded = [vlm.encode_grounding([s.image for s in b], [s.expression for s in b]) for b in batches]
    k = max(1, geometry.total_heads // 10)
    heads = geometry.all_heads()[:k]
    conditions = [Condition("baseline", 0, None, HeadSet())] + [
        Condition("random", k, seed, random_control(geometry, HeadSet(), k, seed))
        for seed in range(SWEEP_CONDITIONS - 1)]
    fixed = dict(max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, do_sample=False)
    natural = dict(max_new_tokens=args.max_new_tokens, do_sample=False)

    def plain(gen: dict[str, Any]) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                for batch in encoded:
                    vlm.hf_model.generate(**batch.encoding, **gen)
        return run

    def masked() -> None:
        ablation = iv.head_ablation(vlm, heads)
        for batch in encoded:
            iv.run_generate(vlm, batch.encoding, [ablation], **fixed)

    def scoring() -> None:
        for part, batch in zip(batches, encoded):
            collect_batch(vlm, part, max_new_tokens=args.max_new_tokens, batch=batch)

    def sweep() -> None:
        run_conditions(vlm, samples, conditions, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                       progress=False)

    # warm-up (first-call costs: nnsight's source instrumentation, kernel selection): one sample, two tokens
    one, one_batch = batches[0][:1], vlm.encode_grounding([batches[0][0].image], [batches[0][0].expression])
    with torch.no_grad():
        vlm.hf_model.generate(**one_batch.encoding, max_new_tokens=2, do_sample=False)
    iv.run_generate(vlm, one_batch.encoding, [iv.head_ablation(vlm, heads)], max_new_tokens=2)
    collect_batch(vlm, one, max_new_tokens=2, batch=one_batch)
    run_conditions(vlm, one, conditions[:2], batch_size=1, max_new_tokens=2, progress=False)

    sweep_name = f"{SWEEP_CONDITIONS}-condition sweep (ours)"
    paths = {"plain HF generate, fixed length": plain(fixed), "masked generate (ours)": masked,
             "plain HF generate, stops at EOS": plain(natural), "scoring pass (ours)": scoring, sweep_name: sweep}
    rounds = {name: args.sweep_repeats if name == sweep_name else args.repeats for name in paths}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    times = interleaved(paths, rounds, clock)
    seconds = {name: statistics.median(values) for name, values in times.items()}

    n = len(samples)
    prompt = max(batch.prompt_length for batch in encoded)
    print(f"model {args.model}: {geometry.num_layers} layers x {geometry.num_heads} heads, "
          f"{sum(p.numel() for p in vlm.hf_model.parameters()) / 1e6:.1f}M parameters, "
          f"{next(vlm.hf_model.parameters()).dtype}, built/loaded in {built:.1f} s")
    images = len({id(s.image) for s in samples})
    print(f"{n} samples ({args.items}: {images} images), batch {args.batch_size}, prompt {prompt} tokens "
          f"({len(encoded[0].layouts[0].visual_positions)} visual), {args.max_new_tokens} new tokens, "
          f"{k} heads masked, {args.threads} threads, {args.clock} clock, median of {args.repeats} interleaved rounds "
          f"({args.sweep_repeats} for the sweep)")
    for name, value in seconds.items():
        per = SWEEP_CONDITIONS * n if "sweep" in name else n
        rounds_text = f"  (rounds: {', '.join(f'{t:.3f}' for t in times[name])})" if args.verbose else ""
        print(f"  {name:34s} {value:8.3f} s  {per / value:8.2f} sample-conditions/s{rounds_text}")
    masked_ratio = seconds["plain HF generate, fixed length"] / seconds["masked generate (ours)"]
    per_plain = SWEEP_CONDITIONS * seconds["plain HF generate, stops at EOS"] / seconds[sweep_name]
    scoring_ratio = seconds["scoring pass (ours)"] / seconds["plain HF generate, stops at EOS"]
    print(f"masked / plain generate throughput: {masked_ratio:.2f}x (goal {GOALS['masked']})")
    print(f"conditions per plain generate: {per_plain:.2f} (goal {GOALS['conditions']})")
    print(f"scoring / plain generate cost: {scoring_ratio:.2f}x (goal {GOALS['scoring']})")


if __name__ == "__main__":
    main()
