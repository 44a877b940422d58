"""benchmarks/protocol_speed.py on tiny:llava at 2 items (seconds): its naive loop answers as the library does.

The speed-up is measured by hand (docs/benchmarks.md); here the script runs end to end, its promised lines are
printed and every (item, condition) answer of the naive loop (plain ``generate`` with hooks) equals the library's,
with and without layer sharing.
No timing is asserted: it is measured, not promised, on a shared CPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.conftest import noise_image, tiny_vlm
from vrh_interp.core.description.heads import Head, HeadSet

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "protocol_speed.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("protocol_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_naive_loop_equals_the_library_on_a_tiny_model(capsys: pytest.CaptureFixture[str]) -> None:
    script = _load_script()
    threads = torch.get_num_threads()
    code = script.main(["--model", "tiny:llava", "--items", "2", "--sets", "1", "--detect-scenes", "2",
                        "--census-items", "2", "--max-new-tokens", "4"])
    torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert code == 0, out
    for line in ("conditions:", "items: 2", "library pipeline seconds:", "naive loop seconds:", "answers equal: yes",
                 "protocol speed-up over naive loop:", "deduplicated head sets:", "batching of conditions:",
                 "shared image prefix:", "library pipeline without layer sharing seconds:", "layer sharing:",
                 "without layer sharing"):
        assert line in out, out


def test_the_naive_hook_zeroes_exactly_the_named_heads() -> None:
    """The naive loop's masking is not vacuous: its hook changes the output, and equals the library's ablation."""
    from vrh_interp.core.execution import interventions as iv

    script = _load_script()
    vlm = tiny_vlm("llava")
    sample = vlm.encode_grounding([noise_image(32, 32)], ["the red square"])
    heads = HeadSet([Head(0, 1), Head(1, 2)])
    with torch.no_grad():
        with script.zeroed_heads(vlm.hf_model, script.by_layer(heads)):
            hooked = vlm.hf_model(**sample.encoding).logits
        unhooked = vlm.hf_model(**sample.encoding).logits
    assert not torch.equal(hooked, unhooked)
    with torch.no_grad(), script.zeroed_heads(vlm.hf_model, script.by_layer(heads)):
        naive = vlm.hf_model.generate(**sample.encoding, max_new_tokens=4, do_sample=False)
    ours = iv.run_generate(vlm, sample.encoding, [iv.head_ablation(vlm, heads)], max_new_tokens=4).ids
    assert torch.equal(naive, ours)
