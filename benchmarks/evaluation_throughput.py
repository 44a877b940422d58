"""Evaluation and scoring cost, measured side by side in one run.

1. Masked batched greedy generation (ours: nnsight, heads zeroed at every step) vs plain HF ``generate``
   on the same left-padded batches: samples/s and the ratio (goal >= 0.85x).
2. Scoring cost per sample (ours: greedy generation with the region readout captured during it) vs a
   plain HF ``generate`` of the same answer (goal <= 1.3x) and vs a plain forward.

    python benchmarks/evaluation_throughput.py [--model toy:a] [--samples 64] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import time

import torch


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="toy:a")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)

    from vrh_interp import interventions as iv
    from vrh_interp.cli import _load_model
    from vrh_interp.scoring.collect import collect_batch
    from vrh_interp.sources import synthetic_samples

    vlm = _load_model(args.model, None, None)
    samples = synthetic_samples("eval", args.samples)
    batches = [samples[i: i + args.batch_size] for i in range(0, len(samples), args.batch_size)]
    encoded = [vlm.encode_grounding([s.image for s in b], [s.expression for s in b]).encoding for b in batches]
    heads = vlm.geometry.all_heads()[: max(1, vlm.geometry.total_heads // 10)]
    gen = dict(max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, do_sample=False)

    def plain_generate() -> None:
        with torch.no_grad():
            for enc in encoded:
                vlm.hf_model.generate(**enc, **gen)

    def masked_generate() -> None:
        ablation = iv.head_ablation(vlm, heads)
        for enc in encoded:
            iv.run_generate(vlm, enc, [ablation], **gen)

    def plain_forward() -> None:
        with torch.no_grad():
            for enc in encoded:
                vlm.hf_model(**enc)

    def scoring() -> None:
        for batch in batches:
            collect_batch(vlm, batch, max_new_tokens=args.max_new_tokens)

    results = {name: timed(fn, args.repeats) for name, fn in
               (("plain HF generate", plain_generate), ("masked generate (ours)", masked_generate),
                ("plain forward", plain_forward), ("scoring pass (ours)", scoring))}
    n = len(samples)
    print(f"model {args.model}, {n} samples, batch {args.batch_size}, {args.max_new_tokens} new tokens, "
          f"{len(heads)} heads masked")
    for name, seconds in results.items():
        print(f"  {name:24s} {seconds:8.3f} s  {n / seconds:8.1f} samples/s")
    print(f"masked / plain generate throughput: {results['plain HF generate'] / results['masked generate (ours)']:.2f}x "
          "(goal >= 0.85x)")
    print(f"scoring / plain generate cost:      {results['scoring pass (ours)'] / results['plain HF generate']:.2f}x "
          "(goal <= 1.3x)")
    print(f"scoring / plain forward cost:       {results['scoring pass (ours)'] / results['plain forward']:.2f}x")


if __name__ == "__main__":
    main()
