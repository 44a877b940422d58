"""Tests written to kill surviving mutants of the ablation templates (``core/execution/templates/ablation.py``,
docs/testing.md).

Two levels. (1) The templates act on any object whose output projection has an ``.input`` (they never need
nnsight): here a stand-in model of plain tensors, and every expected value is written out by loops over rows,
positions and heads from the rules in the module's docstring (zero: the slice is 0 everywhere; mean / resample:
the segment's value at every non-padding position, padding untouched; a decode step is an answer token).
(2) One tiny LLaVA, built once per module: the library's templates run inside plain forward pre-hooks on o_proj
and are compared with ``tests/reference.py``'s independent hooks (``zeroed_heads``, ``replaced_heads``), with
the reference values summed by the reference's own loops.
"""

from __future__ import annotations

import hashlib
import zlib
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch

from tests.reference import decoder_layers, reference_segments, replaced_heads, segment_sums, zeroed_heads
from vrh_interp.core.description.heads import Head, HeadGeometry, HeadSet
from vrh_interp.core.execution.templates.ablation import (ANSWER, PAD, PROMPT, VISUAL, Ablation, AblationValues,
                                                          HeadAblation, RowHeadAblation, SegmentSumCapture,
                                                          forward_segments, segment_ids)
from vrh_interp.core.execution.templates.head_outputs import HeadOutputCapture

LAYERS, HEADS, DIM = 2, 3, 2
WIDTH = HEADS * DIM
GEOMETRY = HeadGeometry(LAYERS, HEADS, HEADS, DIM)
IDS = ("a", "y", "z")  # crc32 % 3 of each id is its own index: every donor is the skip to the next (z wraps to a)


def path(layer: int) -> str:
    return f"layers.{layer}.o_proj"


def stand_in(inputs: list[torch.Tensor]) -> SimpleNamespace:
    """A model whose layer l's output projection has ``.input`` = ``inputs[l]`` (``[batch, seq, width]``)."""
    return SimpleNamespace(layers=[SimpleNamespace(o_proj=SimpleNamespace(input=x)) for x in inputs])


def inputs(batch: int, seq: int) -> list[torch.Tensor]:
    return [torch.arange(batch * seq * WIDTH, dtype=torch.float32).view(batch, seq, WIDTH) + 1 + 1000 * layer
            for layer in range(LAYERS)]


def values() -> AblationValues:
    sums = torch.arange(3 * LAYERS * 3 * WIDTH, dtype=torch.float32).view(3, LAYERS, 3, WIDTH) * 2 + 1
    counts = torch.tensor([[1, 2, 4], [2, 1, 1], [1, 1, 2]])
    return AblationValues(IDS, sums, counts)


def pooled_mean(v: AblationValues) -> list[list[list[float]]]:
    """[layer][segment][w]: sum over samples of the sums / sum over samples of the counts, by loops."""
    return [[[sum(float(v.sums[s, layer, seg, w]) for s in range(3)) / sum(int(v.counts[s, seg]) for s in range(3))
              for w in range(WIDTH)] for seg in range(3)] for layer in range(LAYERS)]


def own_mean(v: AblationValues, index: int) -> list[list[list[float]]]:
    return [[[float(v.sums[index, layer, seg, w]) / int(v.counts[index, seg]) for w in range(WIDTH)]
             for seg in range(3)] for layer in range(LAYERS)]


def replaced(x: torch.Tensor, heads: list[int], table_of_row: Any, segments: list[list[int]],
             zero_padding: bool = False) -> torch.Tensor:
    """``x`` with ``heads`` set, at every position, to ``table_of_row(row)[segment][w]`` (padding: untouched, or
    zero with ``zero_padding``), one value at a time."""
    want = x.clone()
    for row in range(x.shape[0]):
        for pos in range(x.shape[1]):
            segment = segments[row][pos]
            for head in heads:
                for d in range(DIM):
                    w = head * DIM + d
                    if segment == PAD:
                        if zero_padding:
                            want[row, pos, w] = 0.0
                    else:
                        want[row, pos, w] = table_of_row(row)[segment][w]
    return want


SEGMENTS_2x4 = [[PAD, VISUAL, PROMPT, ANSWER], [VISUAL, VISUAL, PROMPT, ANSWER]]


# ------------------------------------------------------------------ segments and reference values
def test_segment_ids_edges() -> None:
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 0] = 0
    got = segment_ids(mask, [[3], []], prompt_length=4)  # the last prompt position is allowed; a row may have none
    assert got.tolist() == [[PROMPT, PROMPT, PROMPT, VISUAL, ANSWER], [PAD, PROMPT, PROMPT, PROMPT, ANSWER]]
    assert segment_ids(mask, [[0], [4]]).tolist() == [[VISUAL, PROMPT, PROMPT, PROMPT, PROMPT],
                                                      [PAD, PROMPT, PROMPT, PROMPT, VISUAL]]
    for positions in ([[4], []], [[-1], []]):
        with pytest.raises(ValueError, match="row 0: visual positions outside the prompt \\(length 4\\)"):
            segment_ids(mask, positions, prompt_length=4)
    with pytest.raises(ValueError, match="1 rows of visual positions for a batch of 2"):
        segment_ids(mask, [[0]])


@pytest.mark.parametrize("ids, sums, counts, words", [
    ((), torch.zeros(0, 2, 3, 6), torch.zeros(0, 3), "at least one reference sample"),
    (("a", "a"), torch.zeros(2, 2, 3, 6), torch.ones(2, 3), "duplicate reference sample ids"),
    (("a", "b"), torch.zeros(2, 3, 6), torch.ones(2, 3), "sums must be \\[2, layers, 3, width\\], got \\(2, 3, 6\\)"),
    (("a", "b"), torch.zeros(3, 2, 3, 6), torch.ones(2, 3), "sums must be"),
    (("a", "b"), torch.zeros(2, 2, 4, 6), torch.ones(2, 3), "sums must be"),
    (("a", "b"), torch.zeros(2, 2, 3, 6), torch.ones(2, 4), "counts must be \\[2, 3\\], got \\(2, 4\\)"),
    (("a", "b"), torch.zeros(2, 2, 3, 6), torch.ones(3, 3), "counts must be"),
])
def test_ablation_values_refuse_bad_shapes(ids, sums, counts, words) -> None:
    with pytest.raises(ValueError, match=words):
        AblationValues(ids, sums, counts)


def test_values_check_the_head_grid() -> None:
    v = values()
    v.check(GEOMETRY)
    for geometry in (HeadGeometry(3, HEADS, HEADS, DIM), HeadGeometry(LAYERS, 2, 2, DIM),
                     HeadGeometry(LAYERS, HEADS, HEADS, 3)):
        with pytest.raises(ValueError, match="ablation values are for 2 layers x width 6, the model has"):
            v.check(geometry)
    with pytest.raises(ValueError, match=f"the model has 3 x {WIDTH}"):
        v.check(HeadGeometry(3, HEADS, HEADS, DIM))


def test_pooled_and_donor_means_by_hand() -> None:
    v = values()
    torch.testing.assert_close(v.mean(), torch.tensor(pooled_mean(v)))
    assert v.mean() is v.mean()  # computed once
    # donors: a -> itself (0) -> y; y -> itself -> z; z -> itself -> wraps to a; other ids by crc32 % 3
    assert [v.donor(i) for i in ("a", "y", "z", "x", "q", "s1")] == [1, 2, 0, 0, 2, 1]
    assert all(zlib.crc32(i.encode()) % 3 == IDS.index(i) for i in IDS)
    for sample_id, donor in (("a", 1), ("x", 0), ("z", 0)):
        torch.testing.assert_close(v.donor_mean(sample_id), torch.tensor(own_mean(v, donor)))
    tables = Ablation("resample", v).tables([1, 0], ["a", "q"])
    assert sorted(tables) == [0, 1]
    torch.testing.assert_close(tables[1], torch.tensor([own_mean(v, 1)[1], own_mean(v, 2)[1]]))
    mean_tables = Ablation("mean", v).tables([1])
    assert list(mean_tables) == [1]
    torch.testing.assert_close(mean_tables[1], torch.tensor([pooled_mean(v)[1]]))
    assert Ablation().tables([0, 1]) == {}
    with pytest.raises(ValueError, match="resample ablation needs the batch's sample_ids"):
        Ablation("resample", v).tables([0])


def test_empty_segments_are_refused_by_name() -> None:
    sums = torch.ones(2, 1, 3, 2)
    no_answer = AblationValues(("a", "b"), sums, torch.tensor([[1, 1, 0], [1, 2, 0]]))
    with pytest.raises(ValueError, match="the reference samples have no answer tokens: mean ablation is undefined"):
        no_answer.mean()
    none = AblationValues(("a", "b"), sums, torch.tensor([[0, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="have no visual / prompt / answer tokens"):
        none.mean()
    donor_empty = AblationValues(("a", "b"), sums, torch.tensor([[1, 1, 1], [0, 1, 0]]))
    assert donor_empty.donor("a") == 1  # crc32("a") % 2 == 0: itself, so b
    with pytest.raises(ValueError, match="resample donor 'b' has no visual / answer tokens"):
        donor_empty.donor_mean("a")
    torch.testing.assert_close(donor_empty.donor_mean("b"), torch.ones(1, 3, 2))
    with pytest.raises(ValueError, match="the only reference sample is the sample itself"):
        AblationValues(("a",), torch.ones(1, 1, 3, 2), torch.ones(1, 3)).donor("a")
    assert AblationValues(("a",), torch.ones(1, 1, 3, 2), torch.ones(1, 3)).donor("b") == 0


def test_fingerprint_is_the_documented_digest(tmp_path) -> None:
    v = values()
    digest = hashlib.sha256(b"a\ny\nz")
    digest.update(v.sums.numpy().tobytes())
    digest.update(v.counts.numpy().tobytes())
    assert v.fingerprint() == digest.hexdigest()[:16]
    loaded = AblationValues.load(v.save(tmp_path / "v.pt"))
    assert loaded.sample_ids == IDS and torch.equal(loaded.sums, v.sums) and torch.equal(loaded.counts, v.counts)
    assert Ablation().manifest() == {"kind": "zero", "values": None}
    assert Ablation("resample", v).manifest() == {"kind": "resample", "values": digest.hexdigest()[:16]}


def test_ablation_kind_and_values_must_agree() -> None:
    v = values()
    with pytest.raises(ValueError, match="ablation kind must be one of \\('zero', 'mean', 'resample'\\), got 'max'"):
        Ablation("max")  # type: ignore[arg-type]
    for kind in ("mean", "resample"):
        with pytest.raises(ValueError, match=f"{kind} ablation needs reference values"):
            Ablation(kind)  # type: ignore[arg-type]
        assert Ablation(kind, v).values is v  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="zero ablation takes no reference values"):
        Ablation("zero", v)


# ------------------------------------------------------------------ HeadAblation on a stand-in model
HEAD_SET = HeadSet([Head(0, 1), Head(1, 0), Head(1, 2)])
BY_LAYER = {0: [1], 1: [0, 2]}


def test_zero_ablation_zeroes_the_heads_everywhere() -> None:
    template = HeadAblation.build(HEAD_SET, GEOMETRY, path)
    assert template.layers() == (0, 1) and template.at_attention_call(None, 0) is None
    assert template.tables == {} and template.segments is None and template.kind == "zero"
    xs = inputs(2, 4)
    before = [x.clone() for x in xs]
    template.apply(stand_in(xs))
    for layer in range(LAYERS):
        want = replaced(before[layer], BY_LAYER[layer], lambda row: None, [[PAD] * 4] * 2, zero_padding=True)
        assert torch.equal(xs[layer], want)


@pytest.mark.parametrize("kind", ["mean", "resample"])
def test_mean_and_resample_ablation_by_hand(kind: str) -> None:
    v = values()
    segments = torch.tensor(SEGMENTS_2x4)
    ids = ["a", "q"]  # donors y and z
    template = HeadAblation.build(HEAD_SET, GEOMETRY, path, Ablation(kind, v), segments=segments, sample_ids=ids)
    xs = inputs(2, 4)
    before = [x.clone() for x in xs]
    template.apply(stand_in(xs))
    rows = [own_mean(v, 1), own_mean(v, 2)] if kind == "resample" else [pooled_mean(v)] * 2
    for layer in range(LAYERS):
        want = replaced(before[layer], BY_LAYER[layer], lambda row: rows[row][layer], SEGMENTS_2x4)
        torch.testing.assert_close(xs[layer], want)
    # a one-token decode step is an answer token, for every row
    step = inputs(2, 1)
    before = [x.clone() for x in step]
    template.apply(stand_in(step))
    for layer in range(LAYERS):
        want = replaced(before[layer], BY_LAYER[layer], lambda row: rows[row][layer], [[ANSWER], [ANSWER]])
        torch.testing.assert_close(step[layer], want)
    with pytest.raises(ValueError, match=f"{kind} ablation was built for sequences of 4 tokens .* this forward has 3"):
        template.apply(stand_in(inputs(2, 3)))
    with pytest.raises(ValueError, match=f"{kind} ablation was built for a batch of 2, got 3"):
        template.apply(stand_in(inputs(3, 4)))


def test_head_ablation_build_refusals() -> None:
    v = values()
    with pytest.raises(ValueError, match="mean ablation replaces outputs segment by segment: pass segments="):
        HeadAblation.build(HEAD_SET, GEOMETRY, path, Ablation("mean", v))
    with pytest.raises(ValueError, match="1 sample ids for a batch of 2 rows"):
        HeadAblation.build(HEAD_SET, GEOMETRY, path, Ablation("resample", v), segments=torch.tensor(SEGMENTS_2x4),
                           sample_ids=["a"])
    with pytest.raises(ValueError, match="ablation values are for 2 layers"):
        HeadAblation.build(HeadSet([Head(0, 0)]), HeadGeometry(3, HEADS, HEADS, DIM), path, Ablation("mean", v),
                           segments=torch.tensor(SEGMENTS_2x4))
    built = HeadAblation.build(HEAD_SET, GEOMETRY, path, Ablation("mean", v), segments=torch.tensor(SEGMENTS_2x4))
    assert built.kind == "mean" and built.projection_paths == {0: path(0), 1: path(1)}
    assert built.heads_by_layer == {0: (1,), 1: (0, 2)} and (built.num_heads, built.head_dim) == (HEADS, DIM)
    assert built.tables[1].shape == (1, 3, 2, DIM) and built.segments.dtype == torch.long


def test_forward_segments() -> None:
    segments = torch.tensor(SEGMENTS_2x4)
    assert torch.equal(forward_segments(segments, 2, 4, "cpu", "it"), segments)
    assert forward_segments(segments, 3, 1, "cpu", "it").tolist() == [[ANSWER]] * 3
    with pytest.raises(ValueError, match="it was built for sequences of 4 tokens"):
        forward_segments(segments, 2, 2, "cpu", "it")


# ------------------------------------------------------------------ RowHeadAblation on a stand-in model
ROW_SEGMENTS = [[PAD, VISUAL, PROMPT, ANSWER], [PAD, VISUAL, PROMPT, ANSWER], [VISUAL, VISUAL, PROMPT, ANSWER],
                [VISUAL, PROMPT, PROMPT, ANSWER]]


def test_row_ablation_gives_each_row_its_own_kind_by_hand() -> None:
    v = values()
    heads = [HeadSet([Head(0, 1)]), HeadSet([Head(0, 1), Head(1, 2)]), HeadSet([Head(1, 0)]), None]
    kinds = [Ablation(), Ablation("mean", v), Ablation("resample", v), Ablation("mean", v)]
    template = RowHeadAblation.build(heads, kinds, GEOMETRY, path, segments=torch.tensor(ROW_SEGMENTS),
                                     sample_ids=["r0", "r1", "y", "r3"])  # y's donor: z
    assert template.rows == 4 and template.heads_by_layer == {0: (1,), 1: (0, 2)}
    assert template.keep_padding.tolist() == [False, True, True, True]
    assert template.masks[1].tolist() == [[False, False], [False, True], [True, False], [False, False]]
    xs = inputs(4, 4)
    before = [x.clone() for x in xs]
    template.apply(stand_in(xs))
    zero = [[[0.0] * WIDTH] * 3] * LAYERS
    row_heads = [{0: [1], 1: []}, {0: [1], 1: [2]}, {0: [], 1: [0]}, {0: [], 1: []}]
    row_tables = [zero, pooled_mean(v), own_mean(v, 2), None]
    for layer in range(LAYERS):
        for row in range(4):
            want = replaced(before[layer][row:row + 1], row_heads[row][layer], lambda _: row_tables[row][layer],
                            ROW_SEGMENTS[row:row + 1], zero_padding=row == 0)
            torch.testing.assert_close(xs[layer][row:row + 1], want)
    step = inputs(4, 1)
    before = [x.clone() for x in step]
    template.apply(stand_in(step))
    for row in range(4):
        want = replaced(before[1][row:row + 1], row_heads[row][1], lambda _: row_tables[row][1], [[ANSWER]])
        torch.testing.assert_close(step[1][row:row + 1], want)
    with pytest.raises(ValueError, match="the per-row ablation was built for 4 rows, the batch has 2"):
        template.apply(stand_in(inputs(2, 4)))


def test_row_ablation_with_only_zero_rows() -> None:
    heads = [HeadSet([Head(1, 1)]), HeadSet([Head(1, 2), Head(0, 0)])]
    template = RowHeadAblation.build(heads, [Ablation(), Ablation()], GEOMETRY, path)
    assert template.tables == {} and template.segments is None and template.rows == 2
    assert template.layers() == (0, 1)
    xs = inputs(2, 3)
    before = [x.clone() for x in xs]
    template.apply(stand_in(xs))
    want0 = before[0].clone()
    want0[1, :, 0:2] = 0
    want1 = before[1].clone()
    want1[0, :, 2:4] = 0
    want1[1, :, 4:6] = 0
    assert torch.equal(xs[0], want0) and torch.equal(xs[1], want1)
    # a mean row whose head set is empty replaces nothing: no segments needed
    quiet = RowHeadAblation.build([HeadSet(), HeadSet([Head(0, 0)])], [Ablation("mean", values()), Ablation()],
                                  GEOMETRY, path)
    assert quiet.tables == {} and quiet.keep_padding is None
    assert RowHeadAblation((), {}, {}, HEADS, DIM).rows == 0


def test_row_ablation_keeps_float64_values_exact() -> None:
    """Values kept in float64 reach a float64 forward unrounded (the per-row table takes the values' dtype)."""
    sums = torch.full((2, LAYERS, 3, WIDTH), 1.0, dtype=torch.float64) / 3  # not a float32 number
    v = AblationValues(("a", "b"), sums, torch.ones(2, 3, dtype=torch.long))
    template = RowHeadAblation.build([HeadSet([Head(1, 1)])], [Ablation("resample", v)], GEOMETRY, path,
                                     segments=torch.tensor(SEGMENTS_2x4[1:]), sample_ids=["a"])
    xs = [x.double() for x in inputs(1, 4)]
    template.apply(stand_in(xs))
    assert xs[1][0, :, 2:4].unique().tolist() == [1 / 3]


def test_row_ablation_build_refusals() -> None:
    v = values()
    one = [HeadSet([Head(0, 0)])]
    with pytest.raises(ValueError, match="2 ablations for 1 rows of heads"):
        RowHeadAblation.build(one, [Ablation(), Ablation()], GEOMETRY, path)
    with pytest.raises(ValueError, match="RowHeadAblation needs at least one row"):
        RowHeadAblation.build([], [], GEOMETRY, path)
    with pytest.raises(ValueError, match="mean / resample ablation replaces outputs segment by segment"):
        RowHeadAblation.build(one, [Ablation("mean", v)], GEOMETRY, path)
    with pytest.raises(ValueError, match="segments have 2 rows for a batch of 1"):
        RowHeadAblation.build(one, [Ablation("mean", v)], GEOMETRY, path, segments=torch.tensor(SEGMENTS_2x4))
    with pytest.raises(ValueError, match="2 sample ids for a batch of 1 rows"):
        RowHeadAblation.build(one, [Ablation("resample", v)], GEOMETRY, path, segments=torch.tensor(SEGMENTS_2x4[:1]),
                              sample_ids=["a", "b"])
    with pytest.raises(ValueError, match="resample ablation needs the batch's sample_ids"):
        RowHeadAblation.build(one, [Ablation("resample", v)], GEOMETRY, path, segments=torch.tensor(SEGMENTS_2x4[:1]))
    with pytest.raises(ValueError, match="ablation values are for 2 layers"):
        RowHeadAblation.build(one, [Ablation("mean", v)], HeadGeometry(3, HEADS, HEADS, DIM), path,
                              segments=torch.tensor(SEGMENTS_2x4[:1]))


# ------------------------------------------------------------------ SegmentSumCapture on a stand-in model
def test_segment_sums_by_hand() -> None:
    capture = SegmentSumCapture(HeadOutputCapture({0: path(0), 1: path(1)}, HEADS, DIM), torch.tensor(SEGMENTS_2x4))
    assert capture.layers() == (0, 1) and capture.at_attention_call(None, 1) is None
    xs = inputs(2, 4)
    got = capture.at_output_projection(stand_in(xs), 1)
    assert got.dtype == torch.float32 and got.shape == (2, 3, WIDTH)
    for row in range(2):
        for segment in range(3):
            for w in range(WIDTH):
                want = sum(float(xs[1][row, pos, w]) for pos in range(4) if SEGMENTS_2x4[row][pos] == segment)
                assert float(got[row, segment, w]) == want
    # no answer tokens in this forward: still three segments (the answer's sums are 0)
    prompt_only = SegmentSumCapture(HeadOutputCapture({0: path(0)}, HEADS, DIM), torch.tensor([[VISUAL, PROMPT]]))
    got = prompt_only.at_output_projection(stand_in(inputs(1, 2)), 0)
    assert got.tolist() == [[list(range(1, 7)), list(range(7, 13)), [0.0] * WIDTH]]
    with pytest.raises(ValueError, match="segments \\(2, 4\\) do not match the forward's \\[batch, seq\\] \\(2, 3\\)"):
        capture.at_output_projection(stand_in(inputs(2, 3)), 0)


# ------------------------------------------------------------------ a tiny LLaVA against tests/reference.py
@contextmanager
def library_template_in_hooks(model: Any, template: Any) -> Iterator[None]:
    """Run the library's template in plain forward pre-hooks on o_proj (no nnsight): the hook hands the template
    a stand-in whose ``.input`` is o_proj's input (a clone), then passes the edited tensor on."""
    handles = []
    for layer in template.layers():
        def pre_hook(_module: Any, args: tuple[Any, ...], layer: int = layer) -> tuple[Any, ...]:
            x = args[0].clone()
            sites = [SimpleNamespace(o_proj=SimpleNamespace(input=x if i == layer else None)) for i in range(layer + 1)]
            template.at_output_projection(SimpleNamespace(layers=sites), layer)
            return (x, *args[1:])

        handles.append(decoder_layers(model)[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@pytest.fixture(scope="module")
def llava() -> SimpleNamespace:
    """Three samples with teacher-forced answers of different lengths (left-padded prompts, right-padded answers),
    segments and per-segment sums by the reference's own rules and loops."""
    from tests.conftest import tiny_vlm
    from vrh_interp.data.checks import as_box
    from vrh_interp.data.sources import synthetic_samples

    vlm = tiny_vlm("llava")
    model = vlm.hf_model
    samples = synthetic_samples("eval", 3)
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    answers = [vlm.adapter.format_box(as_box(s.box), f) for s, f in zip(samples, batch.frames)]
    encoding = vlm.teacher_forced(batch, [vlm.tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers])
    segments = reference_segments(model, encoding, batch.prompt_length)
    sums, counts = segment_sums(model, encoding, segments)
    assert (counts > 0).all() and (segments == PAD).any()
    g = vlm.geometry
    heads = HeadSet([Head(0, 1), Head(g.num_layers - 1, 0), Head(g.num_layers - 1, g.num_heads - 1)])
    with torch.no_grad():
        plain = model(**encoding).logits
    return SimpleNamespace(vlm=vlm, model=model, encoding=encoding, segments=segments, sums=sums, counts=counts,
                           values=AblationValues(("r0", "r1", "r2"), sums.float(), counts), heads=heads, plain=plain)


def _logits(setup: SimpleNamespace, template: Any) -> torch.Tensor:
    with torch.no_grad(), library_template_in_hooks(setup.model, template):
        return setup.model(**setup.encoding).logits


def test_tiny_llava_zero_ablation_equals_the_reference(llava) -> None:
    got = _logits(llava, HeadAblation.build(llava.heads, llava.vlm.geometry, path))
    with torch.no_grad(), zeroed_heads(llava.model, llava.heads.by_layer()):
        want = llava.model(**llava.encoding).logits
    assert (got - llava.plain).abs().max() > 1e-4
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["mean", "resample"])
def test_tiny_llava_mean_and_resample_equal_the_reference(llava, kind: str) -> None:
    ids = ["r1", "s1", "r0"]  # crc32 % 3: 0, 1, 2 (none is its own index)
    donors = [zlib.crc32(i.encode()) % 3 for i in ids]
    if kind == "mean":
        table = llava.sums.sum(0) / llava.counts.sum(0)[None, :, None]
        tables = {layer: table[layer][None].float() for layer in llava.heads.by_layer()}
    else:
        rows = torch.stack([llava.sums[d] / llava.counts[d][None, :, None] for d in donors])
        tables = {layer: rows[:, layer].float() for layer in llava.heads.by_layer()}
    with torch.no_grad(), replaced_heads(llava.model, llava.heads.by_layer(), tables, llava.segments):
        want = llava.model(**llava.encoding).logits
    ablation = Ablation(kind, llava.values)  # type: ignore[arg-type]
    got = _logits(llava, HeadAblation.build(llava.heads, llava.vlm.geometry, path, ablation, segments=llava.segments,
                                            sample_ids=ids))
    assert (got - llava.plain).abs().max() > 1e-4
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # the same rows through the per-row template (one kind for all rows) give the same logits
    rows = RowHeadAblation.build([llava.heads] * 3, [ablation] * 3, llava.vlm.geometry, path,
                                 segments=llava.segments, sample_ids=ids)
    torch.testing.assert_close(_logits(llava, rows), want, rtol=0, atol=1e-5)


def test_tiny_llava_segment_sums_equal_the_reference(llava) -> None:
    g = llava.vlm.geometry
    layers = [0, g.num_layers - 1]
    capture = SegmentSumCapture(HeadOutputCapture({layer: path(layer) for layer in layers}, g.num_heads,
                                                  g.head_dim), llava.segments)
    got: dict[int, torch.Tensor] = {}
    handles = []
    for layer in layers:
        def pre_hook(_module: Any, args: tuple[Any, ...], layer: int = layer) -> None:
            sites = [SimpleNamespace(o_proj=SimpleNamespace(input=args[0])) for _ in range(layer + 1)]
            got[layer] = capture.at_output_projection(SimpleNamespace(layers=sites), layer)

        handles.append(decoder_layers(llava.model)[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook))
    try:
        with torch.no_grad():
            llava.model(**llava.encoding)
    finally:
        for handle in handles:
            handle.remove()
    for layer in layers:
        torch.testing.assert_close(got[layer].double(), llava.sums[:, layer], rtol=1e-5, atol=1e-5)
