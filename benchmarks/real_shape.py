"""A paper model at its real shape (random weights), measured through the library's own code paths in one run.

The model is built from its real configuration (``vrh_interp.core.description.families.paper_models``: the checkpoint's
config.json facts) with random weights in ``--dtype`` (bf16 by default), the family's real image processor class
with the checkpoint's preprocessor parameters, and a local byte tokenizer with the family's special tokens (no
tokenizer can be downloaded: prompts are longer in tokens than with the real BPE, the visual tokens are exact).
Images are synthetic scenes stretched to ``--image`` (1024x768 by default), so the visual-token count is the
real one at that size. Nothing comes from a model hub.

One run measures, side by side:

* ``readout / forward peak memory``: the memory-efficient attention readout (``interventions.attention_readout``
  of the prompt's text rows after the image, every layer, through nnsight) vs a plain HF forward of the same
  encoding; peak memory above what was allocated before the pass (CPU: resident set sampled every 2 ms, the
  allocator told to return freed blocks; CUDA: ``max_memory_allocated``). Goal <= 1.1;
* ``masked / plain generate time``: ``interventions.run_generate`` with 10 % of the heads zeroed at every step
  vs plain HF ``generate``, both forced to ``--new-tokens``: the ratio of the medians of ``--repeats`` (3) runs
  each, alternated (one run of each moved 0.96x-1.14x on PaliGemma2 here). Goal <= 1.05 (masked throughput >=
  0.95x plain);
* detection scoring (``scoring.collect.collect_batch``) on ``--samples`` samples, one batch of ``--conditions``
  masking conditions (``experiments.sweep.run_conditions``: the baseline and random 10 % head sets), giving
  ``seconds per masked answer``, and one patching pair (``patching.prepare_pairs`` with ground-truth targets,
  ``patch_head_set`` of the masked heads);
* on a 2-layer slice of the same model (its first two language-model layers, same weights), the largest
  difference of the ``vrh`` scores between bf16 and fp32 and the Spearman correlation of the two head
  rankings, teacher-forced on the ground-truth box (the same tokens in both precisions). Goal >= 0.99.

``--layers`` / ``--vision-layers`` keep the first N layers of the language model / vision tower (real widths,
head grid and visual tokens; per-layer costs are what the ratios compare); ``--scale`` shrinks every width
(for tests: ``--scale 0.0625 --layers 2 --vision-layers 1 --image 112x84`` runs in seconds).

    python benchmarks/real_shape.py --model qwen2.5-vl-3b [--layers 2 --vision-layers 1] [--device cuda]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GOALS = {"memory": 1.1, "masked": 1.05, "spearman": 0.99}
# glibc returns blocks above this size to the OS when they are freed (a fixed threshold also stops glibc raising
# it dynamically), so the resident set follows what is allocated and its peak measures a pass
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "1"}


def model_names() -> dict[str, Any]:
    """``--model`` names: the native paper models (lower-case paper name) and Qwen2.5-VL-3B."""
    from vrh_interp.core.description.families.paper_models import NATIVE, PAPER_MODELS, QWEN2_5_VL_3B

    return {m.name.lower(): m for m in (QWEN2_5_VL_3B, *PAPER_MODELS) if m.support == NATIVE}


def _scaled(value: int, scale: float, multiple: int = 1) -> int:
    return max(multiple, round(value * scale / multiple) * multiple)


def real_facts(paper: Any, *, layers: int | None, vision_layers: int | None, scale: float) -> dict[str, Any]:
    """The checkpoint's configuration facts with the first ``layers`` / ``vision_layers`` kept and widths times
    ``scale`` (head_dim kept, head counts scaled)."""
    facts = copy.deepcopy(dict(paper.config))
    text, vision = facts["text_config"], facts["vision_config"]
    if layers is not None:
        text["num_hidden_layers"] = min(layers, text["num_hidden_layers"])
    depth_key = "depth" if "depth" in vision else "num_hidden_layers"
    depth = vision.get(depth_key, 24)
    if vision_layers is not None:
        depth = min(vision_layers, depth)
        vision[depth_key] = depth
    if "fullatt_block_indexes" in vision:  # Qwen2.5-VL: keep the full-attention blocks that remain, else the last
        vision["fullatt_block_indexes"] = [i for i in vision["fullatt_block_indexes"] if i < depth] or [depth - 1]
    if scale != 1:
        head_dim = paper.geometry.head_dim
        kv = _scaled(text["num_key_value_heads"], scale)
        heads = _scaled(text["num_attention_heads"], scale, kv)
        text.update(num_attention_heads=heads, num_key_value_heads=kv, hidden_size=heads * head_dim,
                    intermediate_size=_scaled(text["intermediate_size"], scale, 8))
        if "head_dim" in text:
            text["head_dim"] = head_dim
        heads_key = "num_heads" if "num_heads" in vision else "num_attention_heads"
        vision_heads = vision.get(heads_key, 16)
        per_head = vision.get("hidden_size", 1024) // vision_heads
        vision_heads = _scaled(vision_heads, scale)
        vision.update({heads_key: vision_heads, "hidden_size": vision_heads * per_head,
                       "intermediate_size": _scaled(vision.get("intermediate_size", 4096), scale, 8)})
        if "out_hidden_size" in vision:
            vision["out_hidden_size"] = text["hidden_size"]
        if "projection_dim" in facts:  # PaliGemma: the projector maps the vision tower into the language model
            facts["projection_dim"] = vision["projection_dim"] = text["hidden_size"]
    return facts


def build_processor(paper: Any, recipe: Any) -> Any:
    """The family's processor class with the checkpoint's image processor and a local byte tokenizer."""
    from vrh_interp.core.description.tiny import resolve
    from vrh_interp.core.description.tiny._image_only_processor import image_only_processor_class
    from vrh_interp.core.description.tiny.tokenizer import build_byte_tokenizer

    if paper.image_processor is None:
        raise SystemExit(f"{paper.name}: no image processor recorded in core/description/families/paper_models.py; add "
                         "its preprocessor_config.json facts (image_processor=) to measure it")
    spec = recipe.tokenizer
    tokenizer = build_byte_tokenizer(spec.special_tokens, named_special_tokens=spec.named,
                                     extra_special_tokens=spec.extra or None, chat_template=spec.chat_template)
    name, kwargs = paper.image_processor
    processor_class = resolve(recipe.processor.target)
    if recipe.image_only_processor:
        processor_class = image_only_processor_class(processor_class)
    return processor_class(image_processor=resolve(name)(**kwargs), tokenizer=tokenizer,
                           chat_template=tokenizer.chat_template,
                           **{**recipe.processor.kwargs, **(paper.processor_kwargs or {})})


def build_model(paper: Any, args: argparse.Namespace, dtype: Any) -> Any:
    """The random-weight model and its ``VLM`` (weights drawn after ``torch.manual_seed(0)``)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from vrh_interp.core.description.families.registry import TINY_RECIPES
    from vrh_interp.core.description.model import wrap

    recipe = TINY_RECIPES[paper.family]
    processor = build_processor(paper, recipe)
    tokenizer = processor.tokenizer
    ids = tokenizer.convert_tokens_to_ids
    facts = real_facts(paper, layers=args.layers, vision_layers=args.vision_layers, scale=args.scale)
    text = facts["text_config"]
    if args.scale != 1:
        text["vocab_size"] = len(tokenizer)
    if recipe.text_token_ids is None:
        text.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id)
    else:
        text.update({key: ids(token) for key, token in recipe.text_token_ids.items()})
    facts.update({key: ids(token) for key, token in recipe.token_ids.items()})
    config = AutoConfig.for_model(paper.model_type, **facts)
    if recipe.set_vocab_size:
        config.vocab_size = text["vocab_size"]
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=args.attn_implementation)
    model = model.eval().to(args.device)
    return wrap(model, processor, model_id=f"random:{paper.name}")


def scaled_sample(sample: Any, size: tuple[int, int], suffix: str = "") -> Any:
    """``sample`` with its image stretched to ``size`` and its box scaled alike."""
    from PIL import Image

    from vrh_interp.core.description.boxes import Box
    from vrh_interp.data.datasets.images import LoadedImage
    from vrh_interp.data.datasets.samples import GroundingSample

    image = sample.image.resize(size, Image.Resampling.BILINEAR)
    sx, sy = size[0] / sample.image_size[0], size[1] / sample.image_size[1]
    box = scale_box(sample.box, sx, sy, size)
    return GroundingSample(sample.sample_id + suffix, sample.expression, Box(*box), size,
                           LoadedImage(image, f"{sample.image_source.where} at {size[0]}x{size[1]}"), sample.meta)


def scale_box(box: Any, sx: float, sy: float, size: tuple[int, int]) -> tuple[int, int, int, int]:
    x1, y1, x2, y2 = box
    return (int(x1 * sx), int(y1 * sy), min(size[0], max(int(x1 * sx) + 1, round(x2 * sx))),
            min(size[1], max(int(y1 * sy) + 1, round(y2 * sy))))


def scaled_pair(pair: Any, size: tuple[int, int]) -> Any:
    from dataclasses import replace

    sx, sy = size[0] / pair.clean.image_size[0], size[1] / pair.clean.image_size[1]
    return replace(pair, clean=scaled_sample(pair.clean, size), corrupted=scaled_sample(pair.corrupted, size),
                   corrupted_box=scale_box(pair.corrupted_box, sx, sy, size) if pair.corrupted_box else None,
                   distractor_boxes=tuple(scale_box(b, sx, sy, size) for b in pair.distractor_boxes))


# ----------------------------------------------------------------------------------------------- measuring

class PeakMemory:
    """Peak memory of a block above what was in use when it started, in MiB (module doc)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.peak_mib = 0.0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> "PeakMemory":
        import gc

        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
            return self
        self._start = self._peak = self._rss()
        self._stop = threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.002):
                self._peak = max(self._peak, self._rss())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, self._rss())
        self.peak_mib = (peak - self._start) / 2 ** 20


def measured(device: str, fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``'s result, wall seconds and peak MiB."""
    import torch

    with PeakMemory(device) as memory:
        start = time.perf_counter()
        result = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return result, seconds, memory.peak_mib


def report(name: str, seconds: float, peak_mib: float) -> None:
    print(f"  {name:34s} {seconds:9.2f} s  peak {peak_mib:9.1f} MiB above the loaded model", flush=True)


def spearman(a: Any, b: Any) -> float:
    """Spearman's rho: Pearson's correlation of the ranks (ties averaged), without scipy."""
    import numpy as np
    import pandas as pd

    return float(np.corrcoef(pd.Series(a.ravel()).rank(), pd.Series(b.ravel()).rank())[0, 1])


def slice_comparison(vlm: Any, samples: list[Any], dtype: Any, cast: Callable[[Any, Any], Any] | None = None
                     ) -> dict[str, float]:
    """``vrh`` scores of the first two language-model layers of ``vlm`` (same weights) in bf16 and fp32, the model
    cast by ``cast`` (default ``core.description.model.cast_model``: rotary ``inv_freq`` stays float32, as
    ``from_pretrained(dtype=)`` leaves it; ``benchmarks/rotary_precision.py`` passes ``model.to`` to show the
    difference)."""
    import torch

    from vrh_interp.core.description.model import cast_model, wrap
    from vrh_interp.scoring.collect import collect_batch
    from vrh_interp.scoring.detect import scores_from_stats

    model = vlm.hf_model
    language = model.model.language_model
    language.layers = language.layers[:2]
    text = model.config.get_text_config()
    text.num_hidden_layers = 2
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:2]
    scores = {}
    for precision in (dtype, torch.float32 if dtype != torch.float32 else torch.bfloat16):
        (cast or cast_model)(model, precision)
        sliced = wrap(model, vlm.processor, model_id=vlm.model_id)
        stats = collect_batch(sliced, samples, max_new_tokens=1, output_source="teacher_forced")
        scores[str(precision).removeprefix("torch.")] = scores_from_stats(stats, "vrh").scores
    low, high = scores.get("bfloat16"), scores.get("float32")
    return {"max_diff": float(abs(low - high).max()), "spearman": spearman(low, high),
            "score_range": float(high.max() - high.min()), "heads": int(high.size)}


def check_options(args: argparse.Namespace) -> None:
    """One-line refusals of what this machine cannot run."""
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device here (torch {torch.__version__}); use --device cpu")
    if args.attn_implementation == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            raise SystemExit("--attn-implementation flash_attention_2: the flash-attn package is not installed "
                             "(pip install flash-attn, CUDA only); use sdpa")
        if not args.device.startswith("cuda"):
            raise SystemExit("--attn-implementation flash_attention_2 needs --device cuda")


def attention_for(paper: Any, requested: str | None) -> str:
    """``--attn-implementation``, or its default: sdpa, eager where the language model is Gemma 2 (PaliGemma 2),
    which transformers refuses to build with sdpa (soft-capped attention logits); a one-line refusal of sdpa there."""
    gemma2 = paper.config["text_config"].get("model_type") == "gemma2"
    if requested is None:
        return "eager" if gemma2 else "sdpa"
    if gemma2 and requested == "sdpa":
        raise SystemExit(f"--attn-implementation sdpa: {paper.name}'s Gemma 2 language model has no sdpa path in "
                         "transformers (soft-capped attention logits); use eager (the default for it)")
    return requested


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    return int(width), int(height)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = list(model_names())
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-vl-3b", choices=names)
    parser.add_argument("--layers", type=int, help="keep the first N language-model layers (default: all)")
    parser.add_argument("--vision-layers", type=int, help="keep the first N vision-tower layers (default: all)")
    parser.add_argument("--scale", type=float, default=1.0, help="width factor (tests: 0.0625)")
    parser.add_argument("--image", default="1024x768", help="image size WIDTHxHEIGHT")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--conditions", type=int, default=3, help="masking conditions in the batch (with baseline)")
    parser.add_argument("--new-tokens", type=int, default=4, help="generated tokens per answer")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attn-implementation", choices=("sdpa", "eager", "flash_attention_2"),
                        help="default: sdpa, eager for a Gemma 2 language model (transformers has no sdpa path for "
                             "it: sdpa cannot soft-cap the attention logits)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of plain and of masked generate, alternated; the ratio of their medians")
    parser.add_argument("--no-slice", action="store_true", help="skip the bf16 / fp32 slice comparison")
    parser.add_argument("--slice-only", action="store_true",
                        help="only the bf16 / fp32 slice comparison (no memory or time lines)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()) and not args.device.startswith("cuda"):
        os.execve(sys.executable, [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])],
                  {**os.environ, **MALLOC_ENV})
    import torch

    check_options(args)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    paper = model_names()[args.model]
    args.attn_implementation = attention_for(paper, args.attn_implementation)

    from vrh_interp.core.execution import interventions as iv
    from vrh_interp.core.description.heads import HeadSet
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.evaluation.controls import random_control
    from vrh_interp.experiments.conditions import Condition
    from vrh_interp.experiments.sweep import run_conditions
    from vrh_interp.patching import batch as patching
    from vrh_interp.patching.head_patching import patch_head_set
    from vrh_interp.patching.pairs import make_pairs
    from vrh_interp.scoring.collect import _input_rows, collect_batch

    size = parse_size(args.image)
    vlm, built, _ = measured(args.device, lambda: build_model(paper, args, dtype))
    geometry = vlm.geometry
    config = vlm.hf_model.config
    vision = config.vision_config
    parameters = sum(p.numel() for p in vlm.hf_model.parameters())
    text = config.get_text_config()
    print(f"model {paper.name} ({paper.checkpoint} configuration, random {args.dtype} weights, "
          f"{parameters / 1e9:.2f}B parameters as built), built in {built:.1f} s")
    print(f"  language model: {geometry.num_layers} of {paper.config['text_config']['num_hidden_layers']} layers x "
          f"{geometry.num_heads} heads ({geometry.num_kv_heads} KV heads, head_dim {geometry.head_dim}), hidden "
          f"{text.hidden_size}, vocabulary {text.vocab_size}; vision tower: "
          f"{getattr(vision, 'depth', getattr(vision, 'num_hidden_layers', '?'))} layers, hidden {vision.hidden_size}")
    print(f"  device {args.device}, attention {args.attn_implementation}, {args.threads} threads, scale {args.scale}")

    samples = [scaled_sample(s, size) for s in synthetic_samples("eval", args.samples)]
    pair = scaled_pair(make_pairs("referent_moved", 1)[0], size)
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    visual = len(batch.layouts[0].visual_positions)
    print(f"{len(samples)} samples, image {size[0]}x{size[1]}: {visual} visual tokens, prompt {batch.prompt_length} "
          f"tokens (byte tokenizer), {args.new_tokens} new tokens, {args.conditions} masking conditions", flush=True)

    if args.slice_only:
        print_slice(vlm, samples, dtype)
        return
    k = max(1, geometry.total_heads // 10)
    heads = random_control(geometry, HeadSet(), k, 0)
    fixed = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
    rows = _input_rows(batch)[0][0].tolist()

    # warm-up (nnsight's first-call instrumentation) on a small square image (one InternVL tile), one token
    small = [scaled_sample(samples[0], (84, 84))]
    warm = vlm.encode_grounding([small[0].image], [small[0].expression])
    iv.run_generate(vlm, warm.encoding, [iv.head_ablation(vlm, heads)], max_new_tokens=1)
    iv.run_forward(vlm, warm.encoding, [iv.attention_readout(vlm, [-1])])

    def plain_forward() -> Any:
        with torch.no_grad():
            return vlm.hf_model(**batch.encoding).logits.shape

    def plain_generate() -> Any:
        with torch.no_grad():
            return vlm.hf_model.generate(**batch.encoding, **fixed)

    def masked_generate() -> Any:
        return iv.run_generate(vlm, batch.encoding, [iv.head_ablation(vlm, heads)], **fixed)

    results: dict[str, tuple[float, float]] = {}
    for name, fn in (
            ("plain HF forward", plain_forward),
            ("readout forward (ours)", lambda: iv.run_forward(vlm, batch.encoding, [iv.attention_readout(vlm, rows)])),
            ("plain HF generate", plain_generate),
            ("masked generate (ours)", masked_generate),
            ("detection scoring (ours)", lambda: collect_batch(vlm, samples, max_new_tokens=args.new_tokens,
                                                               batch=batch))):
        _, seconds, peak = measured(args.device, fn)
        results[name] = (seconds, peak)
        report(name, seconds, peak)
    conditions = [Condition("baseline", 0, None, HeadSet())] + [
        Condition("random", k, seed, random_control(geometry, HeadSet(), k, seed))
        for seed in range(args.conditions - 1)]
    _, sweep_s, sweep_mib = measured(args.device, lambda: run_conditions(
        vlm, samples, conditions, batch_size=len(samples), max_new_tokens=args.new_tokens, progress=False))
    report(f"{len(conditions)} masking conditions (ours)", sweep_s, sweep_mib)

    def patching_pair() -> Any:
        prepared = patching.prepare_pairs(vlm, [pair], targets="ground_truth")
        return patch_head_set(vlm, prepared, heads)

    _, patch_s, patch_mib = measured(args.device, patching_pair)
    report("patching pair (ours)", patch_s, patch_mib)

    # single timings of the same call move by +-20 % on a shared CPU: more pairs, alternated, and the medians
    timings = {"plain HF generate": [results["plain HF generate"][0]],
               "masked generate (ours)": [results["masked generate (ours)"][0]]}
    for repeat in range(1, args.repeats):
        pair = [("masked generate (ours)", masked_generate), ("plain HF generate", plain_generate)]
        for name, fn in pair if repeat % 2 else pair[::-1]:
            timings[name].append(measured(args.device, fn)[1])
    if args.repeats > 1:
        print("  generate times, alternated: " + "; ".join(
            f"{name} {', '.join(f'{t:.2f}' for t in times)} s" for name, times in timings.items()))
    memory = results["readout forward (ours)"][1] / results["plain HF forward"][1]
    masked = statistics.median(timings["masked generate (ours)"]) / statistics.median(timings["plain HF generate"])
    print(f"visual tokens: {visual}")
    print(f"readout / forward peak memory: {memory:.2f}x (goal <= {GOALS['memory']})")
    print(f"masked / plain generate time: {masked:.2f}x (goal <= {GOALS['masked']}: masked throughput >= 0.95x; "
          f"medians of {args.repeats} alternated runs each)")
    print(f"seconds per masked answer: {sweep_s / (len(conditions) * len(samples)):.2f} "
          f"({len(conditions)} conditions x {len(samples)} samples in one run_conditions call; plain generate "
          f"{results['plain HF generate'][0] / len(samples):.2f} s per answer)")
    if not args.no_slice:
        print_slice(vlm, samples, dtype)


def print_slice(vlm: Any, samples: list[Any], dtype: Any) -> None:
    sliced = slice_comparison(vlm, samples, dtype)
    print(f"bf16 vs fp32 on a 2-layer slice ({sliced['heads']} heads, teacher-forced): largest score difference "
          f"{sliced['max_diff']:.2e} (fp32 scores span {sliced['score_range']:.2e}); "
          f"Spearman of head rankings {sliced['spearman']:.4f} (goal >= {GOALS['spearman']})")


if __name__ == "__main__":
    main()
