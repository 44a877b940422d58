"""Peak memory and time of attention readout: plain sdpa forward vs eager output_attentions vs ours.

Each (mode, sequence length) runs in a fresh subprocess so peak RSS is that mode's own. The backbone is a
tiny random-weight Qwen2 inside a LLaVA VLM (4 layers, hidden 256, 8 heads, 2 KV heads, fp32), fed
text-only input ids of length S; the readout asks for the last 16 rows at every layer.

    python benchmarks/readout_memory.py [--lengths 1024,2048,4096,8192] [--repeats 3]

Prints a table with the ratios to the plain sdpa forward measured in the same run. Peak RSS of ~100 MB
deltas is noisy (allocator arenas), so every (mode, length) runs in ``--processes`` fresh subprocesses
(MALLOC_ARENA_MAX=1) and the median is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROWS = 16


def build_model():
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    torch.manual_seed(0)
    text = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                       num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=16384)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=28, patch_size=14)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=511)
    return LlavaForConditionalGeneration(config).eval()


def run_one(mode: str, length: int, repeats: int) -> dict[str, float]:
    import torch

    import nnsight

    from vrh_interp.core.execution.templates import apply_in_order
    from vrh_interp.core.execution.templates.readout import AttentionRowsReadout, attention_call_label

    torch.set_num_threads(1)
    model = build_model()
    ids = torch.randint(0, 500, (1, length))
    # every mode imports and builds the same things before the baseline, so only the forward's memory counts
    wrapped = nnsight.NNsight(model) if mode == "ours" else None
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    if mode == "sdpa":
        fn = lambda: model(input_ids=ids)  # noqa: E731
    elif mode == "eager":
        model.set_attn_implementation("eager")
        fn = lambda: [a[:, :, -ROWS:].clone() for a in model(input_ids=ids, output_attentions=True).attentions]  # noqa: E731
    else:
        label = attention_call_label(wrapped.model.language_model.layers[0].self_attn.source.names)
        readout = AttentionRowsReadout.build(
            {layer: f"model.language_model.layers.{layer}.self_attn" for layer in range(4)}, label,
            list(range(-ROWS, 0)))

        def fn():
            with wrapped.trace(input_ids=ids):
                values = nnsight.save(apply_in_order(wrapped, [readout]))
            return values

    with torch.no_grad():
        fn()  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mb": (peak - base_rss) / 1024, "seconds": statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="1024,2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child[0], int(args.child[1]), args.repeats)))
        return
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        result = {}
        for mode in ("sdpa", "eager", "ours"):
            runs = []
            for _ in range(args.processes if mode != "eager" or length <= 4096 else 1):
                out = subprocess.run([sys.executable, __file__, "--child", mode, str(length), "--repeats",
                                      str(args.repeats)], capture_output=True, text=True, check=True,
                                     env={**os.environ, "MALLOC_ARENA_MAX": "1"})
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            result[mode] = {key: statistics.median(r[key] for r in runs) for key in ("peak_mb", "seconds")}
        rows.append((length, result))
    print(f"{'S':>6} | {'sdpa MB':>8} {'eager MB':>9} {'ours MB':>8} | {'sdpa s':>7} {'eager s':>8} {'ours s':>7} |"
          f" {'ours/sdpa mem':>13} {'ours/sdpa time':>14} {'eager/sdpa mem':>14}")
    for length, r in rows:
        s, e, o = r["sdpa"], r["eager"], r["ours"]
        print(f"{length:>6} | {s['peak_mb']:8.1f} {e['peak_mb']:9.1f} {o['peak_mb']:8.1f} | {s['seconds']:7.3f} "
              f"{e['seconds']:8.3f} {o['seconds']:7.3f} | {o['peak_mb'] / max(s['peak_mb'], 1e-9):13.2f} "
              f"{o['seconds'] / s['seconds']:14.2f} {e['peak_mb'] / max(s['peak_mb'], 1e-9):14.2f}")


if __name__ == "__main__":
    main()
