"""Writes the notebooks in this folder from the cell sources below (run: python notebooks/_build.py).

Notebooks are generated so their code is reviewed as plain Python; tests/test_notebooks.py executes
every notebook top to bottom, so they cannot rot. They run on the shipped toy model when it is present
(``toy:a``) and otherwise on a tiny random-weight fixture (then the numbers mean nothing; the code path
is the same).
"""

from __future__ import annotations

from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

PICK_MODEL = '''from vrh_interp.cli import _load_model
from vrh_interp.toy import CHECKPOINT_ROOT

MODEL = "toy:a" if (CHECKPOINT_ROOT / "a" / "config.json").exists() else "tiny:llava"
vlm = _load_model(MODEL, None, None)
print(MODEL, vlm.adapter.display_name, vlm.geometry)'''

NOTEBOOKS = {
    "01_find_and_test_vrhs.ipynb": [
        ("markdown", "# Find the Visual Retrieval Heads of a model and prove they are causal\n\n"
                     "Detect on held-out scenes, then mask the top-k heads and k random heads (drawn outside the "
                     "detected set) on DISJOINT scenes."),
        ("code", PICK_MODEL),
        ("code", '''from vrh_interp.sources import synthetic_samples
from vrh_interp import score_heads, sweep

detect = synthetic_samples("detect", 16)
evaluate = synthetic_samples("eval", 8)
scores = score_heads(vlm, detect, "vrh", batch_size=16, progress=False)
scores.to_frame().head(5)'''),
        ("code", '''from vrh_interp import plots
plots.score_heatmap(scores.scores, "VRH scores")'''),
        ("code", '''result = sweep(vlm, evaluate, scores, ks=(0, 1, 2), random_seeds=(0, 1), batch_size=16, progress=False)
summary = result.summary()
assert set(summary["condition"]) == {"baseline", "top", "random"}
summary[["condition", "k", "seed", "accuracy", "accuracy_ci_low", "accuracy_ci_high", "parse_failure_rate", "mislocation_rate"]]'''),
        ("code", '''plots.k_sweep_curve(summary)'''),
        ("code", '''from vrh_interp.overlays import overlay_figures, prediction_overlays
overlay = prediction_overlays(vlm, evaluate[0], scores.top(2))
figures = overlay_figures(overlay)
print(overlay.answer)
figures[0]'''),
    ],
    "03_trace_and_ablate.ipynb": [
        ("markdown", "# Trace and ablate with nnsight inside your own experiments\n\n"
                     "The templates are plain data; apply them inside your own `vlm.nn.trace(...)`."),
        ("code", PICK_MODEL),
        ("code", '''import nnsight, torch
from vrh_interp import interventions as iv
from vrh_interp.heads import Head, HeadSet
from vrh_interp.sources import synthetic_samples
from vrh_interp.templates import apply_in_order

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
        ("code", '''result = iv.run_generate(vlm, batch.encoding, [ablation], max_new_tokens=24)
print("masked answer:", vlm.decode_answers(result.ids, batch.prompt_length)[0])
print("truth:", sample.box)'''),
    ],
}


def build() -> None:
    for name, cells in NOTEBOOKS.items():
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
                    for kind, src in cells]
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    build()
