"""Each scoring preset against an independent port of its SOURCE's scoring arithmetic, on shared attention maps.

The library scores heads from statistics reduced inside the generation (``collect``) and aggregated by
``aggregate``; the ports here read the full eager attention maps of the same greedy answers
(``tests.reference.eager_attention_maps``: plain transformers, no vrh_interp readout) and apply each method's
own code, re-typed in numpy from the files named below (the commits read are given). Nothing here calls the
library's aggregation, readout, entropy or elbow code; from the library it takes only what the methods take as
given: the greedy ids, the answers' IoU, the ground-truth box's visual positions (``VisualLayout.positions_for_box``,
the key set K_s), the image grid (``VisualLayout.grid_block``: the family's real token grid), the gold answer
(the box in the family's native format) and the stop tokens.

Sources:

* ``vrh``: Park et al. 2026, Eq. 1 (Q_out, sum, mean): ``../shared/reference/paper-retrieval-heads-meet-vision.txt``.
* ``retrieval_heads``: nightdessert/Retrieval_Head @3ac171a, ``retrieval_head_detection.py``
  (``retrieval_calculate``: ``topk(1)`` of the decoding row, hit in the needle span adds ``1/len(needle)``;
  ``retrieval_head_accumulate`` only after ROUGE-1 recall > 50; ``np.mean`` over samples).
* ``vera``: Prongcan/VERA @4cc7a5e, ``vera/analysis/full_analysis.py`` (``weighted_score / (sum(attn) + 1e-9)``
  over the visual tokens).
* ``gaze``: rohitgandikota/gaze-heads @668fb48, ``gaze_heads/gaze.py`` (``collect_last_query_attentions``: the last
  prompt row; ``aggregate_region_attention``: raw attention sum over the region's image tokens).
* ``localization_heads``: seilk/LocalizationHeads @8ce33b0, ``localization_heads_finder.py`` (``spatial_entropy``,
  ``find_elbow_point``, ``vis_attn_summation``, ``analyze_attention_file``); per-sample top-10 frequency from the
  paper (Kang et al. CVPR 2025).
* ``localization_heads_paper``: the same paper as the library read it (cell-count components, elbow on mean sums).
* ``ocr_heads``: baekingeol/OCR_Head @7715819, ``step2_ocr_retrieval_head.py`` (the path without
  ``--fine_grained``), ``utils/utils.py`` (``return_attention``), ``utils/metrics.py`` (``compute_score``),
  ``step3_extracted_heads.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.reference import eager_attention_maps
from vrh_interp.data.checks import as_box
from vrh_interp.scoring.collect import collect_batch
from vrh_interp.scoring.detect import scores_from_stats

N_SAMPLES = 8
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def shared():
    """toy:planted (a LLaVA-class model with planted retrieval heads: real box answers, peaked heads) on 8 samples:
    the library's statistics, and the eager maps ``[L, b, H, S, S]`` of prompt + the same greedy answers."""
    from vrh_interp.core.execution import interventions as iv
    from vrh_interp.data.sources import synthetic_samples
    from vrh_interp.experiments.positive_control import load_planted

    vlm = load_planted()
    samples = synthetic_samples("detect", N_SAMPLES)
    stats = collect_batch(vlm, samples, max_new_tokens=MAX_NEW_TOKENS)
    batch = vlm.encode_grounding([s.image for s in samples], [s.expression for s in samples])
    ids = iv.run_generate(vlm, batch.encoding, [], max_new_tokens=MAX_NEW_TOKENS).ids
    full = dict(batch.encoding)
    new = ids.shape[1] - batch.prompt_length
    full["input_ids"] = ids
    full["attention_mask"] = torch.cat([batch.encoding["attention_mask"],
                                        torch.ones(len(samples), new, dtype=torch.long)], 1)
    maps = torch.stack(eager_attention_maps(vlm.hf_model, full)).double().numpy()  # [L, b, H, S, S]
    return vlm, samples, stats, batch, ids, maps


def _region(batch, samples, i):
    return np.asarray(batch.layouts[i].positions_for_box(as_box(samples[i].box)))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    def ranks(x):
        order = np.argsort(x.ravel(), kind="stable")
        r = np.empty(len(order))
        r[order] = np.arange(len(order))
        for value in np.unique(x.ravel()):  # average ranks for ties
            tied = x.ravel() == value
            r[tied] = r[tied].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float(np.array_equal(ra, rb))
    return float(np.corrcoef(ra, rb)[0, 1])


def _check(name: str, library: np.ndarray, port: np.ndarray, atol: float = 1e-5) -> None:
    top = 3
    lib_top = set(np.argsort(-library.ravel(), kind="stable")[:top])
    port_top = set(np.argsort(-port.ravel(), kind="stable")[:top])
    print(f"{name}: Spearman {spearman(library, port):.4f}, top-{top} overlap {len(lib_top & port_top)}/{top}")
    np.testing.assert_allclose(library, port, rtol=0, atol=atol, err_msg=name)


# ---- vrh (the paper's Eq. 1) and gaze / vera / retrieval heads -------------------------------------------------

def test_vrh_equals_eq1_on_eager_maps(shared):
    vlm, samples, stats, batch, ids, maps = shared
    P = batch.prompt_length
    lengths = vlm.answer_lengths(ids, P)
    per_sample = []
    for i in range(len(samples)):
        region = _region(batch, samples, i)
        rows = [maps[:, i, :, P - 1 + t][..., region].sum(-1) for t in range(lengths[i])]  # rows predicting tokens
        per_sample.append(np.mean(rows, axis=0))
    _check("vrh", scores_from_stats(stats, "vrh").scores, np.mean(per_sample, axis=0))


def test_gaze_equals_its_raw_region_sum(shared):
    """gaze_heads/gaze.py: ``attention[0, :, -1, :]`` of the prefill (the last prompt row), ``einsum`` of the raw
    image attention with the region's one-hot (no normalisation); samples averaged."""
    vlm, samples, stats, batch, ids, maps = shared
    P = batch.prompt_length
    per_sample = []
    for i in range(len(samples)):
        attn_at_query = maps[:, i, :, P - 1, :P]  # (n_layers, n_heads, seq_len)
        region_ids = np.zeros(P, dtype=int)
        region_ids[_region(batch, samples, i)] = 1
        onehot = np.zeros((P, 2))
        onehot[np.arange(P), region_ids] = 1.0
        per_sample.append(np.einsum("lht,tr->lhr", attn_at_query, onehot)[..., 1])
    _check("gaze", scores_from_stats(stats, "gaze").scores, np.mean(per_sample, axis=0))


def test_vera_equals_its_ratio(shared):
    """vera/analysis/full_analysis.py: over the visual tokens, ``sum(attn * patch_weights) / (sum(attn) + 1e-9)``
    (patch_weights: patches overlapping the evidence box) at the first generated token's row."""
    vlm, samples, stats, batch, ids, maps = shared
    P = batch.prompt_length
    per_sample = []
    for i in range(len(samples)):
        layout = batch.layouts[i]
        visual = np.asarray(layout.visual_positions)
        patch_weights = np.isin(visual, _region(batch, samples, i)).astype(np.float32)
        attn_array = maps[:, i, :, P - 1][..., visual]
        per_sample.append((attn_array * patch_weights).sum(-1) / (attn_array.sum(-1) + 1e-9))
    _check("vera", scores_from_stats(stats, "vera").scores, np.mean(per_sample, axis=0))


def test_retrieval_heads_rank_alike(shared):
    """retrieval_head_detection.py ``retrieval_calculate``: at each decoding step, ``topk(1)`` over every key of
    the row that produced the token; a hit in the needle span adds ``1 / len(needle)``; a sample counts only when
    the answer is right (the code: ROUGE-1 recall > 50; here IoU >= 0.5, the preset's stated deviation); heads'
    scores are ``np.mean`` over counted samples. The copy condition (attended id == generated id) has no visual
    analogue (the preset's deviation) and the needle length's analogue is the answer length (the answer is what
    is retrieved), so the port equals the library's mean over answer rows."""
    vlm, samples, stats, batch, ids, maps = shared
    P = batch.prompt_length
    lengths = vlm.answer_lengths(ids, P)
    counted = []
    for i, st in enumerate(stats):
        if st.iou < 0.5:
            continue
        region = set(_region(batch, samples, i).tolist())
        score = np.zeros((maps.shape[0], maps.shape[2]))
        for t in range(lengths[i]):
            row = torch.from_numpy(maps[:, i, :, P - 1 + t, : P + t])
            _, idx = row.topk(1)
            score += np.isin(idx[..., 0].numpy(), list(region)) / lengths[i]
        counted.append(score)
    assert counted, "no correctly answered sample: the toy no longer answers"
    _check("retrieval_heads", scores_from_stats(stats, "retrieval_heads").scores, np.mean(counted, axis=0))


# ---- localization heads: the released code ----------------------------------------------------------------------

def _label(binary: np.ndarray) -> tuple[np.ndarray, int]:
    """``scipy.ndimage.label(binary, structure=np.ones((3, 3)))`` (8-connectivity), by flood fill."""
    labels = np.zeros(binary.shape, dtype=int)
    count = 0
    for r, c in zip(*np.nonzero(binary)):
        if labels[r, c]:
            continue
        count += 1
        labels[r, c] = count
        stack = [(r, c)]
        while stack:
            y, x = stack.pop()
            for ny in range(max(0, y - 1), min(binary.shape[0], y + 2)):
                for nx in range(max(0, x - 1), min(binary.shape[1], x + 2)):
                    if binary[ny, nx] and not labels[ny, nx]:
                        labels[ny, nx] = count
                        stack.append((ny, nx))
    return labels, count


def released_spatial_entropy(attention_map: np.ndarray, threshold: float = 0.001) -> float:
    """``LocalizationHeadsFinder.spatial_entropy`` (torch ops re-typed in numpy, float32 as the map)."""
    S_h = attention_map.astype(np.float32)
    B_h = np.maximum(S_h - S_h.mean(), 0)
    B_h_binary = (B_h > threshold).astype(np.int32)
    labeled_array, num_features = _label(B_h_binary)
    total_sum_B_h = float(B_h.sum())
    if total_sum_B_h <= 0:
        return float("inf")
    component_sums = [B_h[labeled_array == i].sum() for i in range(1, num_features + 1)]
    probabilities = [s / total_sum_B_h for s in component_sums if s > 0]
    return -sum(p * np.log(p) for p in probabilities if p > 0) if probabilities else 0


def find_elbow_point(x: list, y: list):
    """``LocalizationHeadsFinder.find_elbow_point`` verbatim, but returning the sorted POSITION of the elbow (the
    code returns ``x_sorted[elbow_idx]``, a head index, and compares head indices with it: issue #12)."""
    x_arr, y_arr = np.array(x), np.array(y)
    sorted_indices = np.argsort(y_arr)
    x_sorted, y_sorted = x_arr[sorted_indices], y_arr[sorted_indices]
    points = np.array([(i, val) for i, val in enumerate(y_sorted)])
    start, end = points[0], points[-1]
    line_vec = end - start
    unit_line_vec = line_vec / np.linalg.norm(line_vec)
    vec_from_start = points - start
    scalar_proj = np.dot(vec_from_start, unit_line_vec)
    proj = np.outer(scalar_proj, unit_line_vec)
    distances = np.linalg.norm(vec_from_start - proj, axis=1)
    elbow_idx = np.argmax(distances)
    return x_sorted, elbow_idx


def _grid_maps(shared, i):
    vlm, samples, stats, batch, ids, maps = shared
    block = batch.layouts[i].grid_block()  # the family's real grid (rows x cols), not sqrt(N) x sqrt(N)
    vis = maps[:, i, :, batch.prompt_length - 1][..., list(block.positions)]  # [L, H, rows * cols]
    return vis.reshape(*vis.shape[:2], block.rows, block.cols)


def _frequency(rankings: list[list[int]], shape: tuple[int, int], top: int = 10) -> np.ndarray:
    counts = np.zeros(shape[0] * shape[1])
    for ranking in rankings:
        counts[ranking[:top]] += 1
    return (counts / len(rankings)).reshape(shape)


def released_localization(shared) -> np.ndarray:
    """``analyze_attention_file`` per sample (elbow by value), then the paper's top-10 frequency over samples."""
    samples = shared[1]
    rankings = []
    for i in range(len(samples)):
        grids = _grid_maps(shared, i)
        L, H = grids.shape[:2]
        head_indices = [l * H + h for l in range(L) for h in range(H)]
        summation_values = [float(grids[l, h].sum()) for l in range(L) for h in range(H)]
        x_sorted, elbow_idx = find_elbow_point(head_indices, summation_values)
        above = set(x_sorted[elbow_idx:].tolist())  # the heads at or above the elbow in sorted order
        results = []
        for l in range(L):
            for h in range(H):
                se = released_spatial_entropy(grids[l, h]) if l * H + h in above else float("inf")
                results.append({"head_idx": l * H + h, "spatial_entropy": se})
        results.sort(key=lambda r: r["spatial_entropy"])  # stable: ties stay in (layer, head) order
        rankings.append([r["head_idx"] for r in results])
    return _frequency(rankings, grids.shape[:2])


def test_localization_heads_equal_the_released_code(shared):
    stats = shared[2]
    _check("localization_heads", scores_from_stats(stats, "localization_heads").scores, released_localization(shared),
           atol=0)


def test_released_entropy_weights_components_by_mass():
    """Hand-made maps where the released rule and a cell-count rule disagree, and its edge cases."""
    from vrh_interp.scoring.collect import released_negative_spatial_entropies

    grid = np.zeros((4, 6))
    grid[0, 0] = 0.5  # a heavy one-cell component
    grid[3, 3:6] = 0.1  # a light three-cell component
    faint = np.full((3, 5), 0.1)
    faint[1, 2] = 0.1 + 0.0009  # relu mass but no cell clears 0.001: entropy 0 (best)
    flat = np.full((2, 3), 0.25)  # no relu mass: entropy inf (worst)
    got = released_negative_spatial_entropies(np.stack([grid]))
    assert got[0] == pytest.approx(-released_spatial_entropy(grid), abs=1e-6)
    assert released_negative_spatial_entropies(faint[None])[0] == 0.0 == released_spatial_entropy(faint)
    assert released_negative_spatial_entropies(flat[None])[0] == float("-inf")
    assert released_spatial_entropy(flat) == float("inf")


def test_released_entropy_on_random_non_square_grids():
    """The library's vectorised released entropy against the port on many small non-square maps whose relu values
    straddle the 0.001 threshold (a threshold, weighting or empty-map rule off shows here)."""
    from vrh_interp.scoring.collect import released_negative_spatial_entropies

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(300, 5, 7)) * rng.uniform(0.5, 4, size=(300, 1, 1))
    grids = np.exp(logits) / np.exp(logits).sum(axis=(1, 2), keepdims=True) * rng.uniform(0.01, 1, size=(300, 1, 1))
    want = np.array([-released_spatial_entropy(g) for g in grids])
    np.testing.assert_allclose(released_negative_spatial_entropies(grids), want, rtol=1e-5, atol=1e-6)
    assert (want != 0).sum() > 100 and (want == 0).sum() > 0  # both cases occur


def test_localization_heads_paper_variant(shared):
    """The paper as the library read it: components of ``A > mean A`` weighted by cell count, heads below the elbow
    of the samples' MEAN image-attention sums dropped, per-sample top-10 frequency."""
    samples, stats = shared[1], shared[2]
    grids = [_grid_maps(shared, i) for i in range(len(samples))]
    L, H = grids[0].shape[:2]
    mean_sums = np.mean([g.sum(axis=(2, 3)) for g in grids], axis=0).ravel()
    x_sorted, elbow_idx = find_elbow_point(list(range(L * H)), list(mean_sums))
    above = set(x_sorted[elbow_idx:].tolist())
    rankings = []
    for g in grids:
        entropies = []
        for l in range(L):
            for h in range(H):
                labels, count = _label((g[l, h] > g[l, h].mean()).astype(int))
                sizes = np.array([(labels == c).sum() for c in range(1, count + 1)], dtype=float)
                if l * H + h not in above or not count:
                    entropies.append(float("inf"))
                else:
                    p = sizes / sizes.sum()
                    entropies.append(float(-(p * np.log(p)).sum()))
        rankings.append(sorted(range(L * H), key=lambda k: entropies[k]))
    _check("localization_heads_paper", scores_from_stats(stats, "localization_heads_paper").scores,
           _frequency(rankings, (L, H)), atol=0)


# ---- OCR heads: the released code -----------------------------------------------------------------------------

def compute_score(gold: list, pred: list) -> float:
    """utils/metrics.py ``longest_common_substring_length`` / ``compute_score`` verbatim."""
    if not gold:
        return 0
    m, n = len(gold), len(pred)
    dp = [[0] * (n + 1) for _ in range(m + 1)]
    longest = 0
    for i in range(m):
        for j in range(n):
            if gold[i] == pred[j]:
                dp[i + 1][j + 1] = dp[i][j] + 1
                longest = max(longest, dp[i + 1][j + 1])
    return longest / len(gold)


def released_ocr_heads(shared) -> np.ndarray:
    """step2 (no --fine_grained) then step3, on the eager maps.

    ``return_attention`` stacks the prefill's ``P x P`` map and one row per decoding step into a matrix of
    ``P + G - 1`` rows and columns (the G-th generated token is never fed back); row ``P + n`` is the row OF
    generated token n. For each generated token whose id is in ``tokenizer(str(answer)).input_ids`` the head's
    entry is ``compute_score(gold, sequences)`` if ``argmax(attn[P + n, :-G])`` (keys 0 .. P-2) is an evidence
    patch, else 0; an IndexError (a gold token never fed back) drops the sample (``except: error.append``). Step 2
    means each head's entries; step 3 keeps the mean only if ``sum(_t == 0) > 0.1 * len(_t)``.
    """
    vlm, samples, stats, batch, ids, maps = shared
    P = batch.prompt_length
    lengths = vlm.answer_lengths(ids, P)
    L, H = maps.shape[0], maps.shape[2]
    features: list[np.ndarray] = []
    for i in range(len(samples)):
        n_answer = lengths[i]
        G = min(n_answer + 1, ids.shape[1] - P)  # generated ids: the answer and its stop token, if generated
        generated = ids[i, P: P + G].tolist()
        gold = vlm.tokenizer(vlm.adapter.format_box(as_box(samples[i].box), batch.frames[i]),
                             add_special_tokens=False)["input_ids"]
        prompt = ids[i, :P][batch.encoding["attention_mask"][i].bool()].tolist()  # batch 1 in the code: no pads
        image_retrieval_score = compute_score(gold, prompt + generated)
        ans_idx = [P + n for n, tok in enumerate(generated) if tok in gold]
        if any(a > P + G - 2 for a in ans_idx):
            continue  # IndexError in attn[ans]: the sample is dropped
        region = set(_region(batch, samples, i).tolist())
        for ans in ans_idx:
            index = maps[:, i, :, ans, : P - 1].argmax(-1)  # attn[ans, :-G] of the P + G - 1 columns
            features.append(np.where(np.isin(index, list(region)), image_retrieval_score, 0.0))
    entries = np.stack(features)  # [entries, L, H]
    mean = entries.sum(axis=0) / len(entries)
    zeros = (entries == 0).sum(axis=0)
    assert mean.shape == (L, H)
    return np.where(zeros > 0.1 * len(entries), mean, 0.0)


def test_prompt_key_argmax_equals_the_code_slice():
    """The readout's fourth statistic against ``argmax(attn[row, :-G])`` (keys 0 .. P-2) on random rows whose
    largest values often sit on the last prompt key or on generated keys (which the code's slice excludes)."""
    from vrh_interp.core.execution.templates.readout import RegionAttentionReadout

    rng = np.random.default_rng(1)
    b, heads, rows, P, G = 3, 4, 6, 20, 5
    probs = rng.random((b, heads, rows, P + G)) ** 8
    probs[:, :, :2, P - 1] = 5.0  # the last prompt key wins the full row
    probs[:, :, 2:4, P + 1] = 5.0  # a generated key wins the full row
    probs = torch.from_numpy(probs / probs.sum(-1, keepdims=True)).float()
    region = torch.zeros(b, P, dtype=torch.bool)
    region[:, 3:9] = True
    visual = torch.zeros(b, P, dtype=torch.bool)
    visual[:, 2:14] = True
    stats = RegionAttentionReadout(None, region, visual).reduce(probs).numpy()  # type: ignore[arg-type]
    index = probs[..., : P - 1].numpy().argmax(-1)
    want = np.isin(index, np.arange(3, 9)).astype(float)
    np.testing.assert_array_equal(stats[..., 3], want)
    assert (stats[..., 2] != stats[..., 3]).any()  # the full-row argmax differs on those rows


def test_ocr_heads_equal_the_released_code(shared):
    stats = shared[2]
    assert any(s.gold_tokens is not None and s.gold_tokens.any() for s in stats)
    _check("ocr_heads", scores_from_stats(stats, "ocr_heads").scores, released_ocr_heads(shared))
