"""Read-out probes: what do chosen heads' outputs say, linearly, about the referent?

A Visual Retrieval Head is claimed to fetch the referred region into the answer. If so, its output at the
answer position should carry the referent's location (and perhaps its attributes) in a linearly decodable
form, more so than the output of as many other heads. This module measures exactly that, on held-out data.

Methodological choices
----------------------
* **Features.** Head h's output at layer l is the ``head_dim`` slice h of ``o_proj``'s input: what the head
  writes (before the shared output projection mixes heads), what ablation zeroes and what patching moves.
  It is captured with the ``HeadOutputCapture`` template (restricted to the trailing positions inside the
  trace, ``TrailingHeadOutputCapture``) through ``run_forward``, so it works through nnsight and on a remote handle
  and only the needed positions come back. One forward pass per batch captures ALL heads of the captured
  layers; every head set is then a column slice of the same matrix, so VRH, random and all-head probes see
  identical samples.
* **Position.** ``"prompt_end"`` (default): the last prompt position, the one whose next-token prediction is
  the first answer token. Batches are left-padded, so it is column -1 of every row. It is the last point
  where the model has read the whole query and image but has not yet committed to any answer token, so what
  is decodable there was retrieved, not copied from the model's own output. ``"answer_mean"``: teacher-forced
  mode; the answer (the model's own greedy answer, or the gold box in the family's native format with
  ``answer="gold"``) is appended to the prompt and the features are the mean over the positions that predict
  the answer tokens (the last prompt position and every answer token but the last). The greedy answer
  reproduces the activations of generation; the gold answer asks what the heads carry while the correct box
  is being written. Caveat: from the second answer position on, the already-written coordinates are IN the
  context, so a head that merely copies recent tokens scores well there; ``"answer_mean"`` measures
  retrieval plus copying and is not comparable to ``"prompt_end"``.
* **Targets.** The referent's box as normalised centre x, centre y, width and height (fractions of the image
  size, so images of any size share one scale), one ridge regression each; and the referent's colour, shape
  and size class (synthetic scenes record them in ``meta``), one ridge classifier each. The referring
  expression often names them (``"the small purple triangle"``): a probe can then read the attribute from
  the text, not the image. ``named_rate`` reports how often the held-out queries name the target attribute,
  so a high accuracy is read with that in mind. Box coordinates are never named, but width and height
  follow the size class (``small`` / ``big``), which the query may name; on the synthetic scenes every shape
  is drawn in a square, so width and height are the same target there.
* **Why ridge.** The question is linear decodability, not the best decoder. Ridge has a closed form (one SVD
  of the training matrix serves every regularisation strength and every target), is deterministic, and
  behaves with more features than samples (all heads of a 7B model: ~100k features). Classification uses
  the ridge classifier (one-vs-rest least squares on +-1 codes, argmax), so regression and classification
  share the solver and the model selection; a logistic probe would add an iterative solver and a tolerance
  without changing what "linearly decodable" means. Features are z-scored with TRAIN statistics.
* **Why this split.** Train and test are split by IMAGE (samples of one scene share an image and its
  objects), seeded, ``test_fraction`` held out; the regularisation strength is chosen by grouped K-fold
  cross-validation on the train split only, so the test split is touched once, by the final score. Scores:
  held-out R^2 (``1 - SSE / SST`` with the TEST mean, so predicting a constant scores <= 0; chance = 0) and
  held-out accuracy against the chance of always predicting the train split's majority class.
  95% percentile-bootstrap CIs resample held-out samples (``evaluation.statistics``), seeded.
* **Head sets.** The VRHs, ``random_control`` draws of as many heads outside them (the sweep's controls,
  same seeds; optionally ``layer_matched_control`` draws too) and all heads of the captured layers, each
  probed on the same split. The controls are a distribution, not a handful: ``summarise_random`` reports
  their spread and the VRHs' empirical p-value against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from vrh_interp.core.execution import interventions as iv
from vrh_interp.core._display import Card
from vrh_interp.evaluation.statistics import (bootstrap_ci, bootstrap_statistic_ci, empirical_p_value,
                                              random_set_distribution)
from vrh_interp.evaluation.controls import layer_matched_control, random_control
from vrh_interp.core.description.heads import HeadGeometry, HeadSet
from vrh_interp.core.description.model import VLM
from vrh_interp.data.checks import GroundingSampleLike, as_box, check_samples
from vrh_interp.core.execution.templates import module_at
from vrh_interp.core.execution.templates.head_outputs import HeadOutputCapture

Position = Literal["prompt_end", "answer_mean"]
AnswerSource = Literal["greedy", "gold"]

BOX_TARGETS: tuple[str, ...] = ("box_cx", "box_cy", "box_w", "box_h")
ATTRIBUTE_TARGETS: tuple[str, ...] = ("colour", "shape", "size")
DEFAULT_ALPHAS: tuple[float, ...] = tuple(float(a) for a in np.logspace(-3, 5, 17))


# ---------------------------------------------------------------------------------------------- features
@dataclass(frozen=True)
class TrailingHeadOutputCapture(HeadOutputCapture):
    """``HeadOutputCapture`` of the last ``window`` positions only: ``[batch, window, heads, head_dim]``.

    The slice is taken inside the trace, so a remote run sends back ``window`` positions, not the whole
    sequence (a 7B model's full capture is gigabytes per batch).
    """

    window: int = 1

    @classmethod
    def of(cls, capture: HeadOutputCapture, window: int) -> "TrailingHeadOutputCapture":
        if window < 1:
            raise ValueError(f"window must be positive, got {window}")
        return cls(capture.projection_paths, capture.num_heads, capture.head_dim, window)

    def at_output_projection(self, model: Any, layer: int) -> torch.Tensor:
        x = module_at(model, self.projection_paths[layer]).input
        batch, seq, _ = x.shape
        return x[:, seq - self.window:].reshape(batch, self.window, self.num_heads, self.head_dim).clone()


@dataclass(frozen=True, repr=False)
class HeadFeatures(Card):
    """Per-sample head outputs at one position: ``values[i, j, h]`` is head h of ``layers[j]`` for sample i."""

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        shape = " x ".join(str(v) for v in self.values.shape)
        return (f"HeadFeatures: {len(self.sample_ids)} samples, head outputs at {self.position}",
                [("values", f"[samples, layers, heads, head_dim] = [{shape}]"),
                 ("layers", ", ".join(map(str, self.layers)))])

    sample_ids: tuple[str, ...]
    values: torch.Tensor  # [samples, len(layers), num_heads, head_dim], float32 on CPU
    layers: tuple[int, ...]
    geometry: HeadGeometry
    position: str

    def matrix(self, heads: HeadSet) -> np.ndarray:
        """``[samples, len(heads) * head_dim]``: the heads' outputs side by side, in ``heads``' order."""
        heads = self.geometry.validate(heads)
        if not len(heads):
            raise ValueError("a probe needs at least one head")
        missing = sorted({h.layer for h in heads} - set(self.layers))
        if missing:
            raise ValueError(f"layers {missing} were not captured (captured: {list(self.layers)})")
        index = {layer: j for j, layer in enumerate(self.layers)}
        columns = [self.values[:, index[h.layer], h.head] for h in heads]
        return torch.cat(columns, dim=1).double().numpy()

    def all_heads(self) -> HeadSet:
        return HeadSet(h for h in self.geometry.all_heads() if h.layer in self.layers)


def collect_head_features(vlm: VLM, samples: Sequence[GroundingSampleLike], *, layers: Sequence[int] | None = None,
                          position: Position = "prompt_end", answer: AnswerSource = "greedy", batch_size: int = 8,
                          max_new_tokens: int = 24) -> HeadFeatures:
    """Capture every head of ``layers`` (default: all) at ``position`` for each sample, in batches."""
    check_samples(samples, what="probe samples")
    if position not in ("prompt_end", "answer_mean"):
        raise ValueError(f"position must be 'prompt_end' or 'answer_mean', got {position!r}")
    if answer not in ("greedy", "gold"):
        raise ValueError(f"answer must be 'greedy' or 'gold', got {answer!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    capture = iv.head_output_capture(vlm, layers)
    captured_layers = tuple(capture.layers())
    last = TrailingHeadOutputCapture.of(capture, 1)
    chunks = []
    for start in range(0, len(samples), batch_size):
        batch_samples = samples[start:start + batch_size]
        batch = vlm.encode_grounding([s.image for s in batch_samples], [s.expression for s in batch_samples])
        if position == "prompt_end":
            values = iv.run_forward(vlm, batch.encoding, [last]).values[0]
            chunks.append(torch.stack([values[layer][:, -1] for layer in captured_layers], dim=1).float().cpu())
            continue
        answers = _answer_ids(vlm, batch, batch_samples, answer, max_new_tokens)
        encoding = vlm.teacher_forced(batch, answers)
        window = encoding["input_ids"].shape[1] - batch.prompt_length + 1  # the last prompt position onwards
        values = iv.run_forward(vlm, encoding, [TrailingHeadOutputCapture.of(capture, window)]).values[0]
        rows = []
        for row, ids in enumerate(answers):
            positions = slice(0, max(len(ids), 1))  # window column 0 = the last prompt position
            rows.append(torch.stack([values[layer][row, positions].float().mean(dim=0) for layer in captured_layers]))
        chunks.append(torch.stack(rows).cpu())
    return HeadFeatures(sample_ids=tuple(s.sample_id for s in samples), values=torch.cat(chunks),
                        layers=captured_layers, geometry=vlm.geometry,
                        position=position if position == "prompt_end" else f"answer_mean:{answer}")


def _answer_ids(vlm: VLM, batch: Any, samples: Sequence[GroundingSampleLike], answer: AnswerSource,
                max_new_tokens: int) -> list[list[int]]:
    if answer == "gold":
        texts = [vlm.adapter.format_box(as_box(s.box), frame) for s, frame in zip(samples, batch.frames)]
        return [list(vlm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    ids = iv.run_generate(vlm, batch.encoding, max_new_tokens=max_new_tokens).ids
    lengths = vlm.answer_lengths(ids, batch.prompt_length)
    return [ids[row, batch.prompt_length:batch.prompt_length + n].tolist() for row, n in enumerate(lengths)]


# ----------------------------------------------------------------------------------------------- targets
@dataclass(frozen=True, repr=False)
class ProbeTargets(Card):
    """What each sample's referent is: normalised box (cx, cy, w, h), attributes, and the split groups."""

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        attributes = ", ".join(f"{name} ({len(set(values))} values)" for name, values in self.attributes.items())
        return (f"ProbeTargets: {len(self.sample_ids)} samples from {len(set(self.groups))} images",
                [("box", "normalised (cx, cy, w, h)"), ("attributes", attributes or "none known")])

    sample_ids: tuple[str, ...]
    box: np.ndarray  # [samples, 4]
    attributes: Mapping[str, tuple[str, ...]]  # "colour" / "shape" / "size" -> per-sample label, when known
    named: Mapping[str, np.ndarray]  # attribute -> per-sample bool: the expression names it
    groups: tuple[str, ...]  # samples sharing an image share a group (never split across train / test)


def probe_targets(samples: Sequence[GroundingSampleLike]) -> ProbeTargets:
    """Targets of each sample; attributes come from the synthetic scenes' ``meta`` (absent elsewhere)."""
    check_samples(samples, what="probe samples")
    boxes, groups = [], []
    labels: dict[str, list[str]] = {name: [] for name in ATTRIBUTE_TARGETS}
    for sample in samples:
        meta = getattr(sample, "meta", None) or {}
        width, height = meta.get("image_size") or sample.image.size
        box = as_box(sample.box)
        boxes.append(((box.x1 + box.x2) / 2 / width, (box.y1 + box.y2) / 2 / height,
                      box.width / width, box.height / height))
        groups.append(str(meta["seed"]) if "seed" in meta else f"id:{sample.sample_id}")
        attrs = meta.get("object_attributes")
        target = meta.get("target_index")
        if attrs is not None and target is not None:
            for name, value in zip(ATTRIBUTE_TARGETS, attrs[target]):
                labels[name].append(value)
    known = {name: tuple(values) for name, values in labels.items() if len(values) == len(samples)}
    named = {name: np.array([f" {value}" in f" {s.expression.lower()}" for value, s in zip(values, samples)])
             for name, values in known.items()}
    return ProbeTargets(sample_ids=tuple(s.sample_id for s in samples), box=np.asarray(boxes, dtype=float),
                        attributes=known, named=named, groups=tuple(groups))


# ------------------------------------------------------------------------------------------------- split
@dataclass(frozen=True, repr=False)
class Split(Card):
    train: np.ndarray  # sample indices
    test: np.ndarray

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        return f"Split: {len(self.train)} train, {len(self.test)} test samples (train, test: the indices)", []


def grouped_split(groups: Sequence[str], *, test_fraction: float = 0.3, seed: int = 0) -> Split:
    """Seeded train / test split of whole groups (images), about ``test_fraction`` of the groups held out."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    unique = sorted(set(groups))
    if len(unique) < 2:
        raise ValueError(f"a held-out split needs at least 2 distinct images, got {len(unique)}")
    order = np.random.default_rng(seed).permutation(len(unique))
    n_test = min(len(unique) - 1, max(1, round(test_fraction * len(unique))))
    test_groups = {unique[i] for i in order[:n_test]}
    is_test = np.array([g in test_groups for g in groups])
    return Split(train=np.flatnonzero(~is_test), test=np.flatnonzero(is_test))


def _group_folds(groups: Sequence[str], folds: int, seed: int) -> list[np.ndarray]:
    unique = sorted(set(groups))
    folds = min(folds, len(unique))
    if folds < 2:
        raise ValueError(f"cross-validation needs at least 2 distinct training images, got {len(unique)}")
    order = np.random.default_rng(seed).permutation(len(unique))
    fold_of = {unique[g]: i % folds for i, g in enumerate(order)}
    assignment = np.array([fold_of[g] for g in groups])
    return [np.flatnonzero(assignment == f) for f in range(folds)]


# ----------------------------------------------------------------------------------------------- solvers
@dataclass(frozen=True)
class _Ridge:
    """z-scoring with train statistics + the SVD of the train matrix: solves every alpha cheaply."""

    mean: np.ndarray
    scale: np.ndarray
    u: np.ndarray
    s: np.ndarray
    vt: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> "_Ridge":
        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale[scale < 1e-12] = 1.0
        u, s, vt = np.linalg.svd((x - mean) / scale, full_matrices=False)
        return cls(mean, scale, u, s, vt)

    def predict(self, x_new: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
        """Predictions for ``x_new`` of the ridge fit of ``y`` (``[n_train, k]``, centred here) at ``alpha``."""
        y_mean = y.mean(axis=0)
        shrink = self.s / (self.s ** 2 + alpha)
        weights = self.vt.T @ (shrink[:, None] * (self.u.T @ (y - y_mean)))
        return ((x_new - self.mean) / self.scale) @ weights + y_mean


def _r2(truth: np.ndarray, predicted: np.ndarray) -> float:
    total = float(((truth - truth.mean()) ** 2).sum())
    if total == 0:
        return float("nan")
    return 1.0 - float(((truth - predicted) ** 2).sum()) / total


def _codes(labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    return np.where(labels[:, None] == classes[None, :], 1.0, -1.0)


def _choose_alpha(x: np.ndarray, y: np.ndarray, groups: Sequence[str], alphas: Sequence[float], folds: int,
                  seed: int, score: Any) -> float:
    """The alpha with the best mean validation score over grouped folds of the TRAIN split."""
    if not alphas:
        raise ValueError("alphas is empty")
    totals = np.zeros(len(alphas))
    for held in _group_folds(groups, folds, seed):
        keep = np.setdiff1d(np.arange(len(x)), held)
        ridge = _Ridge.fit(x[keep])
        for i, alpha in enumerate(alphas):
            totals[i] += score(y[held], ridge.predict(x[held], y[keep], alpha))
    return float(alphas[int(np.argmax(totals))])  # first best: the smallest alpha among ties


@dataclass(frozen=True, repr=False)
class ProbeScore(Card):
    target: str
    metric_name: str  # "r2" or "accuracy"
    metric: float
    ci_low: float
    ci_high: float
    chance: float
    n_train: int
    n_test: int
    alpha: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def _card(self) -> tuple[str, list[tuple[str, str]]]:
        return (f"ProbeScore {self.target}: {self.metric_name} {self.metric:.3g} [{self.ci_low:.3g}, "
                f"{self.ci_high:.3g}] (chance {self.chance:.3g}; {self.n_train} train, {self.n_test} test, "
                f"alpha {self.alpha:g})", [])


def ridge_regression_probe(x: np.ndarray, y: np.ndarray, split: Split, *, target: str = "y",
                           groups: Sequence[str] | None = None, alphas: Sequence[float] = DEFAULT_ALPHAS,
                           folds: int = 5, seed: int = 0, resamples: int = 2000) -> ProbeScore:
    """Held-out R^2 of a ridge regression of ``y`` on ``x`` (alpha by grouped CV on the train split)."""
    x, y = _check_xy(x, np.asarray(y, dtype=float), split)
    train_groups = _train_groups(groups, split, len(x))
    column = y[:, None]
    mse = lambda truth, pred: -float(((truth - pred) ** 2).mean())  # noqa: E731
    alpha = _choose_alpha(x[split.train], column[split.train], train_groups, alphas, folds, seed, mse)
    predicted = _Ridge.fit(x[split.train]).predict(x[split.test], column[split.train], alpha)[:, 0]
    truth = y[split.test]
    low, high = bootstrap_statistic_ci(lambda idx: _r2(truth[idx], predicted[idx]), len(truth),
                                       resamples=resamples, seed=seed)
    return ProbeScore(target, "r2", _r2(truth, predicted), low, high, 0.0, len(split.train), len(split.test), alpha)


def ridge_classification_probe(x: np.ndarray, labels: Sequence[Any], split: Split, *, target: str = "label",
                               groups: Sequence[str] | None = None, alphas: Sequence[float] = DEFAULT_ALPHAS,
                               folds: int = 5, seed: int = 0, resamples: int = 2000) -> ProbeScore:
    """Held-out accuracy of a ridge classifier of ``labels`` vs always predicting the train majority class."""
    labels = np.asarray([str(v) for v in labels])
    x, labels = _check_xy(x, labels, split)
    classes = np.unique(labels[split.train])
    if len(classes) < 2:
        raise ValueError(f"target {target!r}: the train split has a single class {classes.tolist()}")
    train_groups = _train_groups(groups, split, len(x))
    train_codes = _codes(labels[split.train], classes)

    def accuracy(truth_codes: np.ndarray, scores: np.ndarray) -> float:
        return float((truth_codes.argmax(axis=1) == scores.argmax(axis=1)).mean())

    alpha = _choose_alpha(x[split.train], train_codes, train_groups, alphas, folds, seed, accuracy)
    scores = _Ridge.fit(x[split.train]).predict(x[split.test], train_codes, alpha)
    correct = (classes[scores.argmax(axis=1)] == labels[split.test]).astype(float)
    values, counts = np.unique(labels[split.train], return_counts=True)
    majority = values[int(np.argmax(counts))]
    chance = float((labels[split.test] == majority).mean())
    low, high = bootstrap_ci(correct, resamples=resamples, seed=seed)
    return ProbeScore(target, "accuracy", float(correct.mean()), low, high, chance, len(split.train),
                      len(split.test), alpha)


def _check_xy(x: np.ndarray, y: np.ndarray, split: Split) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=float)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"x must be [samples, features] with one row per target, got {x.shape} and {len(y)} targets")
    if len(split.train) == 0 or len(split.test) == 0:
        raise ValueError("the split needs both train and test samples")
    if max(split.train.max(), split.test.max()) >= len(x):
        raise ValueError("split indices exceed the number of samples")
    return x, y


def _train_groups(groups: Sequence[str] | None, split: Split, n: int) -> list[str]:
    if groups is None:
        groups = [str(i) for i in range(n)]
    if len(groups) != n:
        raise ValueError(f"{len(groups)} groups for {n} samples")
    return [groups[i] for i in split.train]


# ---------------------------------------------------------------------------------------------- head sets
def probe_head_sets(features: HeadFeatures, targets: ProbeTargets, head_sets: Mapping[str, HeadSet], *,
                    target_names: Sequence[str] | None = None, test_fraction: float = 0.3, seed: int = 0,
                    alphas: Sequence[float] = DEFAULT_ALPHAS, folds: int = 5,
                    resamples: int = 2000) -> pd.DataFrame:
    """One row per (head set, target): held-out metric, its CI, chance, sizes, chosen alpha.

    Every head set is probed on the SAME grouped split (``seed``), so rows are comparable.
    """
    if features.sample_ids != targets.sample_ids:
        raise ValueError("features and targets describe different samples (ids or order differ)")
    available = list(BOX_TARGETS) + [name for name in ATTRIBUTE_TARGETS if name in targets.attributes]
    names = list(target_names) if target_names is not None else available
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"targets {unknown} are not available for these samples (available: {available}); "
                         "colour/shape need samples whose meta records the referent's attributes")
    split = grouped_split(targets.groups, test_fraction=test_fraction, seed=seed)
    rows = []
    for label, heads in head_sets.items():
        x = features.matrix(heads)
        for name in names:
            common = dict(target=name, groups=targets.groups, alphas=alphas, folds=folds, seed=seed,
                          resamples=resamples)
            if name in BOX_TARGETS:
                score = ridge_regression_probe(x, targets.box[:, BOX_TARGETS.index(name)], split, **common)
                named_rate = float("nan")  # a box is never named; see the module docstring for size
            else:
                score = ridge_classification_probe(x, targets.attributes[name], split, **common)
                named_rate = float(targets.named[name][split.test].mean())
            rows.append({"head_set": label, "n_heads": len(heads), "heads": str(heads), "position": features.position,
                         **score.as_dict(), "named_rate": named_rate})
    return pd.DataFrame(rows)


def comparison_head_sets(vrhs: HeadSet, geometry: HeadGeometry, *, random_seeds: Sequence[int] = (0, 1, 2),
                         include_all: bool = True, exclude_first_layer: bool = False,
                         matched: bool = False) -> dict[str, HeadSet]:
    """``{"vrh": vrhs, "random:seed=S": ..., ["matched:seed=S": ...,] "all": every head}``: the sweep's controls
    (``matched``: also ``layer_matched_control`` sets, as many heads per layer as the VRHs)."""
    vrhs = geometry.validate(vrhs)
    if not len(vrhs):
        raise ValueError("vrhs is empty")
    sets = {"vrh": vrhs}
    for seed in random_seeds:
        sets[f"random:seed={seed}"] = random_control(geometry, vrhs, len(vrhs), seed,
                                                     exclude_first_layer=exclude_first_layer)
    if matched:
        sets.update({f"matched:seed={seed}": layer_matched_control(geometry, vrhs, vrhs, seed)
                     for seed in random_seeds})
    if include_all:
        sets["all"] = geometry.all_heads()
    return sets


def readout_probes(vlm: VLM, samples: Sequence[GroundingSampleLike], vrhs: HeadSet, *,
                   random_seeds: Sequence[int] = (0, 1, 2), include_all: bool = True, matched: bool = False,
                   position: Position = "prompt_end", answer: AnswerSource = "greedy",
                   target_names: Sequence[str] | None = None, test_fraction: float = 0.3, seed: int = 0,
                   batch_size: int = 8, max_new_tokens: int = 24,
                   alphas: Sequence[float] = DEFAULT_ALPHAS, folds: int = 5, resamples: int = 2000) -> pd.DataFrame:
    """Capture features once, probe VRHs vs random heads vs all heads; see ``probe_head_sets``."""
    sets = comparison_head_sets(vrhs, vlm.geometry, random_seeds=random_seeds, include_all=include_all, matched=matched)
    layers = sorted({h.layer for heads in sets.values() for h in heads})
    features = collect_head_features(vlm, samples, layers=layers, position=position, answer=answer,
                                     batch_size=batch_size, max_new_tokens=max_new_tokens)
    return probe_head_sets(features, probe_targets(samples), sets, target_names=target_names,
                           test_fraction=test_fraction, seed=seed, alphas=alphas, folds=folds, resamples=resamples)


def summarise_random(frame: pd.DataFrame) -> pd.DataFrame:
    """Per target: VRH metric, all-heads metric, chance, and per control kind present (``random``,
    ``matched``) the distribution of the sets' metric (``random_set_distribution``: sets, mean, sd, quantiles),
    its max, and the VRHs' empirical p-value ``(1 + #sets scoring >= the VRHs) / (1 + #sets)``."""
    rows = []
    for target, part in frame.groupby("target", sort=False):
        vrh = part[part["head_set"] == "vrh"]["metric"]
        every = part[part["head_set"] == "all"]["metric"]
        vrh_value = float(vrh.iloc[0]) if len(vrh) else float("nan")
        row = {"target": target, "metric_name": part["metric_name"].iloc[0], "vrh": vrh_value,
               "all": float(every.iloc[0]) if len(every) else float("nan"), "chance": float(part["chance"].iloc[0])}
        for kind in ("random", "matched"):
            values = part[part["head_set"].str.startswith(kind + ":")]["metric"].to_numpy(dtype=float)
            if kind == "matched" and not len(values):
                continue
            stats = random_set_distribution(values)
            row.update({f"{kind}_{key}": value for key, value in stats.items()})
            row[f"{kind}_max"] = float(values.max()) if len(values) else float("nan")
            row[f"p_vs_{kind}"] = empirical_p_value(-vrh_value, -values) if len(values) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)
