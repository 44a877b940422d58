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
  query side; ``union``: input and output rows; ``last_input``: the last prompt token.

Key aggregation Phi. ``sum``: attention mass on K_s (why a sum and not a mean: a head that retrieves
puts its mass on the referent whatever its size, and the sum is the probability the head reads the
referent); ``argmax``: 1 if the most-attended visible key lies in K_s (Retrieval/OCR heads); ``ratio``:
mass on K_s over mass on all visual tokens (VERA); ``entropy``: minus the spatial entropy of the
last-input row's thresholded attention map over the image grid (Localization Heads: connected
components of relu(A - mean A), 8-connectivity, on the real 2-D token grid; lower entropy = more
localized, so the score is its negative; this one ignores the box).

Sample aggregation Omega. ``mean`` over samples; ``freq``: share of samples in whose per-sample top-k
(``freq_top_k``) the head is.

Presets follow their authors' code where the visual setting allows (peer-methods.md); where a rule has
no visual analogue it is named in ``deviation``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

QuerySet = Literal["output", "input", "union", "random_output", "first_output", "last_input"]
KeyAggregation = Literal["sum", "argmax", "ratio", "entropy"]
SampleAggregation = Literal["mean", "freq"]
OutputSource = Literal["greedy", "teacher_forced"]

QUERY_SETS: tuple[str, ...] = ("output", "input", "union", "random_output", "first_output", "last_input")
KEY_AGGREGATIONS: tuple[str, ...] = ("sum", "argmax", "ratio", "entropy")
SAMPLE_AGGREGATIONS: tuple[str, ...] = ("mean", "freq")


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

    def __post_init__(self) -> None:
        checks = ((self.query_set, QUERY_SETS, "query_set"),
                  (self.key_aggregation, KEY_AGGREGATIONS, "key_aggregation"),
                  (self.sample_aggregation, SAMPLE_AGGREGATIONS, "sample_aggregation"),
                  (self.output_source, ("greedy", "teacher_forced"), "output_source"))
        for value, allowed, name in checks:
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")
        if self.freq_top_k < 1:
            raise ValueError("freq_top_k must be >= 1")

    @property
    def label(self) -> str:
        return f"Q={self.query_set}, Phi={self.key_aggregation}, Omega={self.sample_aggregation}"

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
               "'correct' = IoU >= 0.5 instead of ROUGE-1 recall > 0.5"),
        Preset("qrhead", ScoringDesign("input", "sum", "mean"),
               "Zhang et al. 2025 (princeton-pli/QRHead): query-span tokens, summed attention on the gold span",
               "the null-query ('N/A') calibration and the mean-2sd outlier filter are not applied"),
        Preset("ocr_heads", ScoringDesign("output", "argmax", "mean", correct_only=True),
               "OCR Heads (baekingeol/OCR_Head): argmax of generated tokens on an evidence patch, weighted by "
               "correctness",
               "correctness weighting is a 0/1 filter (IoU >= 0.5); overlap threshold: any positive overlap"),
        Preset("vera", ScoringDesign("first_output", "ratio", "mean"),
               "VERA (Prongcan/VERA): first generated token, evidence attention / all visual attention"),
        Preset("localization_heads", ScoringDesign("last_input", "entropy", "freq", freq_top_k=10),
               "Kang et al. CVPR 2025 (seilk/LocalizationHeads): last input token, spatial entropy of "
               "connected components, frequency in per-sample top-10",
               "the elbow filter on image-attention mass is not applied (the score itself is box-free)"),
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
