"""The head-scoring design space (the paper's Eq. 1) and the published methods as presets.

    score(l, h) = Omega over samples s of [ mean over query rows t in Q_s of Phi over keys j in K_s of a_lh(t, j) ]

K_s is the set of visual tokens whose patch overlaps the ground-truth box (``VisualLayout``).

Query rows. A generated token is produced by the forward pass of the position before it, so the
"output token" rows are the rows that PREDICT each answer token: the last prompt position for the first
answer token, then each fed-back answer token for the next one (what Retrieval Heads' code reads at each
decoding step; the paper's "prediction-stage attention"). Rows that predict the end-of-sequence token
are excluded: they belong to no answer token. Consequently ``last_input`` (Localization/Gaze heads) and
``first_output`` (VERA) are the same row in this convention; both names are kept for the presets.

* ``output``: every answer-token row (paper default); ``random_output``: one of them, drawn per sample
  from a seeded RNG (paper Fig. 8b); ``first_output``: the first one;
* ``input``: the prompt's text tokens after the image (instruction + expression + template), QRHead's
  query side; ``union``: input and output rows; ``last_input``: the last prompt token;
* ``gold_token_rows``: the row OF each answer token whose id occurs in the gold answer's ids (the row the
  token is fed back at, which predicts the NEXT token; OCR Heads' code, ``attn[P + n]``); a sample whose last
  answer token is such a token but was never fed back (the answer was cut at ``max_new_tokens``) is skipped,
  as the code's IndexError drops it.

Key aggregation Phi. ``sum``: attention mass on K_s (why a sum and not a mean: a head that retrieves puts its
mass on the referent whatever its size, and the sum is the probability the head reads the referent);
``argmax``: 1 if the most-attended visible key lies in K_s (Retrieval Heads); ``ratio``: mass on K_s over
(mass on all visual tokens + 1e-9) (VERA's code); ``argmax_prompt``: 1 if the most-attended key among the
prompt keys but the last (``0 .. P-2``: generated tokens and the last prompt token excluded, OCR Heads' code)
lies in K_s; ``entropy``: minus the spatial entropy of the last-input row's thresholded attention map over the
image grid, components of relu(A - mean A) > 0 (8-connectivity, on the real 2-D token grid) weighted by their
cell counts; ``entropy_mass``: the released LocalizationHeads code's spatial entropy (components of relu(A -
mean A) > 0.001 weighted by their relu mass over the map's total relu mass; 0 when no cell clears 0.001;
``collect.released_negative_spatial_entropies``). Lower entropy = more localized, so the score is its
negative; both ignore the box.

``elbow`` (Localization Heads' criterion 1) keeps, before the entropy ranking, only the heads whose
last-input attention sum over the image grid lies at or above the elbow (chord method) of the sorted sums:
``per_sample`` (the released code: one elbow per sample, cut by VALUE; the code's comparison of a flat head
index with the elbow, its issue #12, is not copied) or ``mean`` (one elbow on the sums averaged over the
samples, as the paper describes it); the others score minus infinity (the code: entropy ``inf``).

Sample aggregation Omega. ``mean`` over samples; ``freq``: share of samples in whose per-sample top-k
(``freq_top_k``) the head is; ``pooled``: the mean over every query-row entry of every sample (a sample
with more rows weighs more; OCR Heads' code). ``grade_weight`` multiplies each entry by the answer's graded
correctness (``SampleStats.grade``, OCR Heads); ``min_zero_share`` (OCR Heads' step 3: 0.1) keeps a head's
score only where MORE than that share of its entries are zero, else 0.

Presets follow their authors' code where the visual setting allows (peer-methods.md); where a rule has
no visual analogue it is named in ``deviation``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

QuerySet = Literal["output", "input", "union", "random_output", "first_output", "last_input", "gold_token_rows"]
KeyAggregation = Literal["sum", "argmax", "ratio", "entropy", "argmax_prompt", "entropy_mass"]
SampleAggregation = Literal["mean", "freq", "pooled"]
OutputSource = Literal["greedy", "teacher_forced"]
Elbow = Literal["none", "per_sample", "mean"]

QUERY_SETS: tuple[str, ...] = ("output", "input", "union", "random_output", "first_output", "last_input",
                               "gold_token_rows")
KEY_AGGREGATIONS: tuple[str, ...] = ("sum", "argmax", "ratio", "entropy", "argmax_prompt", "entropy_mass")
SAMPLE_AGGREGATIONS: tuple[str, ...] = ("mean", "freq", "pooled")
ELBOWS: tuple[str, ...] = ("none", "per_sample", "mean")
ENTROPY_AGGREGATIONS: tuple[str, ...] = ("entropy", "entropy_mass")


@dataclass(frozen=True)
class ScoringDesign:
    """One point of the design space."""

    query_set: QuerySet = "output"
    key_aggregation: KeyAggregation = "sum"
    sample_aggregation: SampleAggregation = "mean"
    freq_top_k: int = 20
    output_source: OutputSource = "greedy"
    correct_only: bool = False  # count only samples whose answer has IoU >= 0.5 (Retrieval Heads' filter)
    seed: int = 0  # for random_output
    grade_weight: bool = False  # each entry times the answer's graded correctness (OCR Heads)
    min_zero_share: float | None = None  # keep a head's score only where > this share of entries are 0 (OCR Heads)
    elbow: Elbow = "none"  # entropy designs: drop heads below the image-attention elbow (Localization Heads)

    def __post_init__(self) -> None:
        checks = ((self.query_set, QUERY_SETS, "query_set"),
                  (self.key_aggregation, KEY_AGGREGATIONS, "key_aggregation"),
                  (self.sample_aggregation, SAMPLE_AGGREGATIONS, "sample_aggregation"),
                  (self.output_source, ("greedy", "teacher_forced"), "output_source"),
                  (self.elbow, ELBOWS, "elbow"))
        for value, allowed, name in checks:
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")
        if self.freq_top_k < 1:
            raise ValueError("freq_top_k must be >= 1")
        if self.min_zero_share is not None and not 0 <= self.min_zero_share < 1:
            raise ValueError("min_zero_share must be in [0, 1) or None")
        if self.elbow != "none" and self.key_aggregation not in ENTROPY_AGGREGATIONS:
            raise ValueError(f"elbow={self.elbow!r} applies to the entropy key aggregations only "
                             f"({', '.join(ENTROPY_AGGREGATIONS)})")

    @property
    def label(self) -> str:
        extra = [f"{name}={getattr(self, name)}" for name, default in (("grade_weight", False),
                                                                       ("min_zero_share", None), ("elbow", "none"))
                 if getattr(self, name) != default]
        return ", ".join([f"Q={self.query_set}, Phi={self.key_aggregation}, Omega={self.sample_aggregation}", *extra])

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    name: str
    design: ScoringDesign
    source: str
    deviation: str = ""


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("vrh", ScoringDesign("output", "sum", "mean"),
               "Park et al. 2026, Retrieval Heads Meet Vision, Eq. 1 default (Q_out, sum, mean)"),
        Preset("retrieval_heads", ScoringDesign("output", "argmax", "mean", correct_only=True),
               "Wu et al. 2024 (nightdessert/Retrieval_Head): argmax of each decoded token's attention in the "
               "needle span; only samples answered correctly count",
               "the copy condition (attended token id == generated id) has no visual analogue and is dropped; "
               "'correct' = IoU >= 0.5 instead of ROUGE-1 recall > 0.5; a hit adds 1/len(answer) (the code: "
               "1/len(needle), the answer's analogue); the code also counts the row predicting its stop token "
               "('\\n'), the end-of-sequence row is not counted here"),
        Preset("qrhead", ScoringDesign("input", "sum", "mean"),
               "Zhang et al. 2025 (princeton-pli/QRHead): query-span tokens, summed attention on the gold span",
               "the null-query ('N/A') calibration and the mean-2sd outlier filter are not applied"),
        Preset("ocr_heads", ScoringDesign("gold_token_rows", "argmax_prompt", "pooled", grade_weight=True,
                                          min_zero_share=0.1),
               "OCR Heads (baekingeol/OCR_Head @7715819, step2_ocr_retrieval_head.py without --fine_grained, "
               "step3_extracted_heads.py): the row OF each generated token whose id occurs in the gold answer; "
               "argmax over prompt keys 0..P-2 on an evidence patch carries the answer's graded correctness (longest "
               "common run of gold ids in the sequence / gold length), else 0; mean pooled over all token entries; a "
               "head keeps its mean only if > 10 % of its entries are 0",
               "evidence patches are the visual tokens overlapping the box at all (the code: tiles covering > 0.1 % "
               "of the box area, utils.valuable_weights); the gold answer is the box in the family's native format; "
               "the README's --fine_grained mode (row of the i-th gold token for the i-th evidence box: with one "
               "box, the first gold token only) is not what is ported; a sample whose last gold token was never fed "
               "back (cut at max_new_tokens) is skipped whole (the code: IndexError, the sample lands in its error "
               "list after L0H0 got partial entries)"),
        Preset("vera", ScoringDesign("first_output", "ratio", "mean"),
               "VERA (Prongcan/VERA @4cc7a5e, vera/analysis/full_analysis.py): first generated token, evidence "
               "attention / (all visual attention + 1e-9)"),
        Preset("localization_heads", ScoringDesign("last_input", "entropy_mass", "freq", freq_top_k=10,
                                                   elbow="per_sample"),
               "Kang et al. CVPR 2025, released code (seilk/LocalizationHeads @8ce33b0, localization_heads_finder.py "
               "analyze_attention_file / spatial_entropy / find_elbow_point): last input token; per sample, heads at "
               "or above the image-attention elbow ranked by spatial entropy of relu(A - mean A) > 0.001 "
               "components weighted by relu mass; frequency in per-sample top-10",
               "the elbow cuts by attention-sum value, not by flat head index (the code's issue #12 is not copied); "
               "the per-sample top-10 frequency is the paper's (the code ranks one sample and stops); the grid is the "
               "family's real token grid (VisualLayout.grid_block), not sqrt(N) x sqrt(N); entropies in float64 (the "
               "code: the map's dtype); the bottom-row-focus flag the code records is not used (it ranks by entropy "
               "alone)"),
        Preset("localization_heads_paper", ScoringDesign("last_input", "entropy", "freq", freq_top_k=10,
                                                         elbow="mean"),
               "Kang et al. CVPR 2025 as this library read the paper: last input token, heads above the elbow of the "
               "samples' mean image-attention sums, spatial entropy of relu(A - mean A) > 0 components weighted by "
               "cell count, frequency in per-sample top-10",
               "not the released code (see localization_heads: mass weighting, 0.001 threshold, per-sample elbow); "
               "the cell-count weighting is the library's earlier reading, not re-checked against the paper text"),
        Preset("gaze", ScoringDesign("last_input", "sum", "mean"),
               "Gaze Heads (rohitgandikota/gaze-heads): last prompt token, raw attention sum on the region"),
    )
}


def resolve_design(design: "ScoringDesign | str") -> ScoringDesign:
    """A design from a preset name or a ScoringDesign."""
    if isinstance(design, ScoringDesign):
        return design
    if design not in PRESETS:
        raise ValueError(f"unknown preset {design!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[design].design


def design_space_variants(base: ScoringDesign | None = None) -> dict[str, ScoringDesign]:
    """The paper's 2^3 variants: Q in {output, input} x Phi in {sum, argmax} x Omega in {mean, freq}."""
    base = base or ScoringDesign()
    variants = {}
    for q in ("output", "input"):
        for phi in ("sum", "argmax"):
            for omega in ("mean", "freq"):
                d = replace(base, query_set=q, key_aggregation=phi, sample_aggregation=omega)
                variants[d.label] = d
    return variants
