"""Why a bf16 model must keep its rotary frequencies in float32: the attention-logit error of a model cast with
``model.to(torch.bfloat16)`` (which rounds ``inv_freq`` to bf16) against ``core.description.model.cast_model`` (which
keeps it float32, as ``from_pretrained(dtype=...)`` builds it), by distance from the query, and what each does to the
bf16 head ranking.

The model is a paper model at its real shape with random weights (``benchmarks/real_shape.py``'s builder: two
language-model layers, one vision layer, widths times ``--scale``). For the last prompt row, the attention over the
visual keys is read (``interventions.attention_readout``) in fp32 and in bf16 both ways; the log-probability
difference, centred per head, is the logit error. Then the ``vrh`` scores of the slice, teacher-forced on the
ground-truth box, compared as ``real_shape.py`` compares them (largest difference, Spearman of the rankings).

    python benchmarks/rotary_precision.py --model paligemma2-10b --scale 0.5
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import real_shape  # noqa: E402  (the builder and the slice comparison of the real-shape benchmark)

DISTANCE_BINS = ((0, 64), (64, 256), (256, 512), (512, 1024), (1024, 1 << 30))


def logit_error(vlm: Any, batch: Any, cast: Any) -> dict[str, Any]:
    """Std of the fp32 logits over the visual keys, std of their bf16 error with ``cast``, and the mean |error| per
    distance bin (query position minus key position), last prompt row, every head of every layer."""
    import torch

    from vrh_interp.core.execution import interventions as iv
    from vrh_interp.core.description.model import wrap

    model = vlm.hf_model
    visual = torch.as_tensor(list(batch.layouts[0].visual_positions))
    probs = {}
    for dtype in (torch.float32, torch.bfloat16):
        cast(model, dtype)
        handle = wrap(model, vlm.processor, model_id=vlm.model_id)
        encoding = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v
                    for k, v in batch.encoding.items()}
        values = iv.run_forward(handle, encoding, [iv.attention_readout(handle, [-1])]).values[0]
        probs[dtype] = torch.cat([values[layer][0, :, 0].float() for layer in sorted(values)])  # [heads, keys]
    exact = probs[torch.float32][:, visual].log()
    error = probs[torch.bfloat16][:, visual].log() - exact
    error = error - error.mean(-1, keepdim=True)
    distance = (batch.prompt_length - 1) - visual
    bins = {f"{lo}-{hi if hi < 1 << 30 else 'max'}": float(error[:, (distance >= lo) & (distance < hi)].abs().mean())
            for lo, hi in DISTANCE_BINS if ((distance >= lo) & (distance < hi)).any()}
    return {"logit_std": float(exact.std(-1).mean()), "error_std": float(error.std(-1).mean()), "by_distance": bins}


def main(argv: list[str] | None = None) -> None:
    import torch

    from vrh_interp.core.description.model import cast_model
    from vrh_interp.data.sources import synthetic_samples

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="paligemma2-10b", choices=list(real_shape.model_names()))
    parser.add_argument("--scale", type=float, default=0.5, help="width factor (1: the real widths)")
    parser.add_argument("--image", default="1024x768")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    options = real_shape.parse_args(["--model", args.model, "--layers", "2", "--vision-layers", "1", "--scale",
                                     str(args.scale), "--dtype", "float32", "--image", args.image])
    paper = real_shape.model_names()[args.model]
    options.attn_implementation = real_shape.attention_for(paper, None)
    vlm = real_shape.build_model(paper, options, torch.float32)
    size = real_shape.parse_size(args.image)
    samples = [real_shape.scaled_sample(s, size) for s in synthetic_samples("eval", 2)]
    batch = vlm.encode_grounding([samples[0].image], [samples[0].expression])
    print(f"model {paper.name}, 2 layers x {vlm.geometry.num_heads} heads, scale {args.scale}, "
          f"{len(batch.layouts[0].visual_positions)} visual tokens, prompt {batch.prompt_length} tokens")

    def to(model: Any, dtype: Any) -> Any:
        return model.to(dtype)

    original = {name: buf.clone() for name, buf in vlm.hf_model.named_buffers() if name.endswith("inv_freq")}

    def restore() -> None:  # back to fp32 with the exact rotary frequencies (.to(fp32) keeps bf16's rounding)
        vlm.hf_model.to(torch.float32)
        for name, buf in original.items():
            owner, _, attr = name.rpartition(".")
            vlm.hf_model.get_submodule(owner)._buffers[attr] = buf.clone()

    warnings.filterwarnings("ignore", message=".*rotary frequency")  # wrap's warning: the point of the first cast
    for label, cast in (("model.to(bfloat16)", to), ("cast_model(bfloat16)", cast_model)):
        restore()
        measured = logit_error(vlm, batch, cast)
        restore()
        bins = ", ".join(f"{name}: {value:.4f}" for name, value in measured["by_distance"].items())
        print(f"{label}: logits over visual keys std {measured['logit_std']:.3f}, bf16 logit error std "
              f"{measured['error_std']:.4f}; mean |error| by distance from the query {bins}")
        sliced = real_shape.slice_comparison(vlm, samples, torch.float32, cast=cast)
        print(f"{label}: vrh scores, largest bf16 difference {sliced['max_diff']:.2e} of a {sliced['score_range']:.2e}"
              f" span, Spearman {sliced['spearman']:.4f}", flush=True)


if __name__ == "__main__":
    main()
