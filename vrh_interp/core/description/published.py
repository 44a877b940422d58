"""The paper's published Visual Retrieval Heads: appendix D (Tables A2-A6), entered once as data.

Park, Choi, Lee, Sung (2026) list, for four VLMs x five grounding benchmarks, the top-20 ``(layer, head)``
indices of their default score (output query tokens, sum over the referent region, mean over samples), in
descending score order. ``heads(model, benchmark)`` returns one list as a ``PublishedHeadSet`` (an ordered
``HeadSet`` that carries its ``PublishedSource``); ``catalog()`` tabulates them; the text form
``published:MODEL/BENCHMARK`` (``parse_spec``) is accepted wherever a head set is given as text, because
``HeadSet.parse`` defers to it (``vrh sweep --vrhs``, ``vrh patch --vrhs``, ``vrh scan --heads``).

Names are forgiving: case, the organisation prefix, ``-Instruct`` (Qwen) or ``-hf`` (the transformers-native
InternVL conversions), ``_`` for ``.`` in a version (``InternVL3_5``) and hyphens are ignored. Only the
paper's checkpoints resolve: ``OpenGVLab/InternVL3-8B-Instruct`` (the SFT stage before MPO) is another model.

Text ancestors (QRHead). The same registry holds the query-focused retrieval heads that QRHead (Zhang, Yin, Yen,
Chen, Ye 2025; github.com/princeton-pli/QRHead, MIT licence, ``published_qrhead.json`` with its licence file
beside this module) publishes for text LLMs, two of which are the paper's VLMs' backbones (Qwen2.5-7B-Instruct,
Qwen3-8B). ``qrhead_heads(model, data="NQ")`` returns one list in QRHead's rank order (``layer-head`` strings,
0-based query heads, read as ``Head(layer, head)``), its source a ``TextAncestorSource`` (config path, commit,
licence); the text form is ``published:qrhead/MODEL`` or ``published:qrhead/MODEL/DATA`` (``lme``). There is no
top-k form: ``--ks`` masks the top-k prefixes of a set, ``heads[:k]`` is the top k in Python. Such a list is
refused (``PublishedGeometryError``) on any model whose grid differs from the text LLM's, even when every head is
in range; ``text_ancestor_overlap`` compares each list with the appendix-D lists of the VLMs of the same grid
(docs/results/text-ancestors.md, ``docs/_generate_text_ancestors.py``).

Index transfer (``check_geometry``). A published set names heads of the paper's checkpoint. Masking it on a
model whose grid lacks one of them is refused (``PublishedGeometryError``, naming both grids); when every head
is in range but the grids differ it is allowed with a ``PublishedGeometryWarning``, since indices carry
meaning only between models sharing a language backbone (the paper's sec. 5.3). ``sweep`` records the
source (``PublishedSource.to_dict``) as ``heads_source`` in its run folder's ``manifest.json``.

Geometry. Layers x heads per layer are the paper's Table A7, equal to the public configs of the language
backbones (Qwen2.5-7B: 28 x 28; Qwen3-8B: 36 x 32).

Analyses from the tables alone (no model):

* ``same_backbone_overlap``: heads shared by the two lists of a same-backbone pair on each benchmark, against
  two nulls. Uniform: sets of ``a`` and ``b`` heads drawn uniformly from the ``N = L*H`` grid share ``a*b/N``
  heads on average (hypergeometric; ``overlap_tail`` is the exact P(X >= observed)). Layer-matched: each set
  keeps its heads-per-layer counts and only the head indices within a layer are random; the overlap is a sum
  of independent per-layer hypergeometrics (``layer_matched_overlap``). Both lists crowd into a few middle
  layers, so the uniform null flatters any overlap; the layer-matched one asks whether the same HEADS, not
  just the same layers, are picked.
* ``benchmark_stability``: per model, the overlap and Jaccard of its lists on every pair of benchmarks.
* ``layer_histogram``: heads per layer with the relative depth ``layer / (L - 1)`` (0 = first layer, 1 = last),
  so 28- and 36-layer models share an axis; ``depth_summary`` condenses it per model.

``python -m vrh_interp.core.description.published`` prints these tables as Markdown (docs/published-heads.md embeds
them).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:  # the tables import it: parsing a head spec (the CLI, before a model loads) does not
    import pandas as pd

from vrh_interp.core.description.heads import Head, HeadGeometry, HeadOutOfRangeError, HeadSet

CITATION = ("Park, Choi, Lee, Sung (2026), \"Retrieval Heads Meet Vision: Uncovering How VLMs Locate and "
            "Extract Visual Information\", appendix D")
SPEC_PREFIX = "published:"


class UnknownPublishedSetError(KeyError, ValueError):
    """No published list for this model or benchmark name (the message lists the ones that exist)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


class PublishedGeometryError(HeadOutOfRangeError):
    """A published head set names heads that the model it is applied to does not have."""


class PublishedGeometryWarning(UserWarning):
    """A published head set fits a model whose head grid differs from the paper's checkpoint."""


@dataclass(frozen=True)
class PublishedModel:
    """One of the paper's four VLMs: its name in the paper, hub checkpoint, language backbone and head grid."""

    name: str
    checkpoint: str
    backbone: str
    num_layers: int
    num_heads: int
    aliases: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The lower-case name used in specs: ``qwen2.5-vl-7b``."""
        return self.name.lower()

    @property
    def total_heads(self) -> int:
        return self.num_layers * self.num_heads

    @property
    def grid(self) -> str:
        return f"{self.num_layers} layers x {self.num_heads} heads"


MODELS: tuple[PublishedModel, ...] = (
    PublishedModel("Qwen2.5-VL-7B", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen2.5-7B", 28, 28,
                   ("Qwen2.5-VL-7B-Instruct",)),
    PublishedModel("Qwen3-VL-8B", "Qwen/Qwen3-VL-8B-Instruct", "Qwen3-8B", 36, 32, ("Qwen3-VL-8B-Instruct",)),
    PublishedModel("InternVL3-8B", "OpenGVLab/InternVL3-8B", "Qwen2.5-7B", 28, 28, ("InternVL3-8B-hf",)),
    PublishedModel("InternVL3.5-8B", "OpenGVLab/InternVL3_5-8B", "Qwen3-8B", 36, 32, ("InternVL3_5-8B-HF",)),
)

# The paper's same-backbone pairs among the four (sec. 5.3, appendix E.1).
SAME_BACKBONE_PAIRS: tuple[tuple[str, str], ...] = (("Qwen2.5-VL-7B", "InternVL3-8B"),
                                                    ("Qwen3-VL-8B", "InternVL3.5-8B"))


@dataclass(frozen=True)
class _Benchmark:
    name: str
    table: str
    section: str
    aliases: tuple[str, ...] = ()


BENCHMARKS: tuple[_Benchmark, ...] = (
    _Benchmark("RefCOCO", "Table A2", "D.1"),
    _Benchmark("RefCOCO+", "Table A3", "D.2", ("refcocoplus", "refcoco-plus")),
    _Benchmark("RefCOCOg", "Table A4", "D.3", ("refcoco-g",)),
    _Benchmark("Toloka", "Table A5", "D.4", ("toloka-vqa", "tolokavqa")),
    _Benchmark("RefSpatialBench", "Table A6", "D.5", ("refspatial", "refspatial-bench")),
)

# Appendix D, transcribed: benchmark -> model -> top-20 heads (``L<layer>H<head>``), best first. Kept as a data
# file beside this module (shipped in the wheel) so the 400 transcribed indices are one table, not code.
_LISTS_FILE = Path(__file__).resolve().parent / "published_heads.json"
_LISTS: dict[str, dict[str, list[str]]] = json.loads(_LISTS_FILE.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class PublishedSource:
    """Where a published list comes from: the model it was detected in, the benchmark, the table."""

    model: PublishedModel
    benchmark: str
    table: str
    section: str
    citation: str = CITATION

    @property
    def spec(self) -> str:
        return f"{SPEC_PREFIX}{self.model.key}/{self.benchmark.lower()}"

    def describe(self) -> str:
        return (f"top-20 VRHs of {self.model.name} on {self.benchmark} ({self.table}, appendix {self.section} of "
                f"Park et al. 2026)")

    def to_dict(self) -> dict[str, Any]:
        """The provenance record a result stores: heads transferred by index from this published list."""
        return {"kind": "published", "spec": self.spec, "model": self.model.name,
                "checkpoint": self.model.checkpoint, "backbone": self.model.backbone, "benchmark": self.benchmark,
                "table": self.table, "section": f"appendix {self.section}", "citation": self.citation,
                "geometry": {"layers": self.model.num_layers, "heads": self.model.num_heads}}


class PublishedHeadSet(HeadSet):
    """A ``HeadSet`` (ranking order) that remembers which published list it is; equal to a plain ``HeadSet``
    of the same heads in the same order. Slices and set operations return plain ``HeadSet`` objects."""

    __slots__ = ("source",)

    def __init__(self, heads: Iterable[Head | str], source: PublishedSource) -> None:
        super().__init__(heads)
        self.source = source

    def __repr__(self) -> str:
        return f"PublishedHeadSet({self.source.spec!r}: {', '.join(str(h) for h in self)})"


# --------------------------------------------------------------------- text ancestors: QRHead's lists

# QRHead (Zhang, Yin, Yen, Chen, Ye 2025; github.com/princeton-pli/QRHead, MIT) publishes the query-focused retrieval
# heads of text LLMs as QRRetriever configs (``attn_head_set: "16-19,16-2,..."``: ``layer-head``, 0-based, query
# heads, best first). The lists, each with its config path and source commit, and the licence are data beside this
# module (``published_qrhead.json``, ``published_qrhead_LICENSE.txt``); the geometry of each text LLM is here.
QRHEAD = "qrhead"
_QRHEAD_FILE = Path(__file__).resolve().parent / "published_qrhead.json"
QRHEAD_DATA: dict[str, Any] = json.loads(_QRHEAD_FILE.read_text(encoding="utf-8"))
QRHEAD_LICENCE_FILE = _QRHEAD_FILE.parent / QRHEAD_DATA["licence"]["file"]
QRHEAD_DEFAULT_DATA = "NQ"  # every model has an NQ list; Llama ones also have an LME (LongMemEval) one

# The text LLMs QRHead lists heads for: layers x (query) heads per layer from each checkpoint's config.json
# (num_hidden_layers, num_attention_heads). ``backbone`` names the pretrained model the paper's VLMs are built on,
# so a text list and a VLM list meet when backbone and grid agree (Qwen2.5-7B: Qwen2.5-VL-7B and InternVL3-8B;
# Qwen3-8B: Qwen3-VL-8B and InternVL3.5-8B). Qwen3-Embedding-8B is Qwen3-8B further trained as an embedder.
TEXT_MODELS: tuple[PublishedModel, ...] = (
    PublishedModel("Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B", 28, 28),
    PublishedModel("Qwen3-8B", "Qwen/Qwen3-8B", "Qwen3-8B", 36, 32),
    PublishedModel("Qwen3-Embedding-8B", "Qwen/Qwen3-Embedding-8B", "Qwen3-8B", 36, 32),
    PublishedModel("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B", 32, 32),
    PublishedModel("Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "Llama-3.1-70B", 80, 64),
    PublishedModel("Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B-Instruct", "Llama-3.2-1B", 16, 32),
    PublishedModel("Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", "Llama-3.2-3B", 28, 24),
)


@dataclass(frozen=True)
class TextAncestorSource(PublishedSource):
    """Where a text LLM's published list comes from (QRHead): the model, its detection data (``benchmark``:
    ``NQ`` or ``LME``), the config file and commit it was copied from, and the licence. ``table`` holds the
    config path and ``section`` the commit, so code that reads a ``PublishedSource`` finds them too."""

    collection: str = QRHEAD
    size: int = 0
    repository: str = ""
    licence: str = ""

    @property
    def config(self) -> str:
        return self.table

    @property
    def commit(self) -> str:
        return self.section

    @property
    def spec(self) -> str:
        data = "" if self.benchmark == QRHEAD_DEFAULT_DATA else f"/{self.benchmark.lower()}"
        return f"{SPEC_PREFIX}{self.collection}/{self.model.key}{data}"

    def describe(self) -> str:
        return (f"top-{self.size} QRHead query-focused retrieval heads of the text LLM {self.model.name}, detected on "
                f"{self.benchmark} ({self.repository.removeprefix('https://github.com/')} {self.config} at "
                f"{self.commit[:7]}, {self.licence} licence)")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "published", "collection": self.collection, "spec": self.spec, "model": self.model.name,
                "checkpoint": self.model.checkpoint, "backbone": self.model.backbone, "benchmark": self.benchmark,
                "config": self.config, "repository": self.repository, "commit": self.commit,
                "licence": self.licence, "citation": self.citation, "heads": "query heads, 0-based",
                "geometry": {"layers": self.model.num_layers, "heads": self.model.num_heads}}


def _key(text: str) -> str:
    """Lower case, organisation prefix dropped, ``3_5`` read as ``3.5``, separators (``-``, ``_``, spaces) ignored."""
    name = str(text).strip().lower().rsplit("/", 1)[-1]
    name = re.sub(r"(?<=\d)_(?=\d)", ".", name)
    return re.sub(r"[-_\s]", "", name)


def _model_keys(model: PublishedModel) -> set[str]:
    return {_key(n) for n in (model.name, model.checkpoint, *model.aliases)}


def _available() -> str:
    models = ", ".join(f"{m.key} ({m.checkpoint})" for m in MODELS)
    benchmarks = ", ".join(b.name.lower() for b in BENCHMARKS)
    return (f"published lists exist for models {models} on benchmarks {benchmarks}; text-LLM lists as "
            f"'{SPEC_PREFIX}{QRHEAD}/MODEL[/DATA]': {_available_text()}")


def _available_text() -> str:
    return ", ".join(_text_source(entry).spec.removeprefix(SPEC_PREFIX) for entry in QRHEAD_DATA["lists"])


def resolve_model(name: str) -> PublishedModel:
    """The paper's model called ``name`` (forgiving, see the module docstring)."""
    wanted = _key(name)
    for model in MODELS:
        if wanted in _model_keys(model):
            return model
    raise UnknownPublishedSetError(f"no published VRHs for model {name!r}: {_available()}")


def resolve_benchmark(name: str) -> str:
    """The paper's name of benchmark ``name`` (``refcoco+``, ``RefCOCO_plus``, ``refspatial`` ...)."""
    wanted = _key(name).replace("plus", "+")
    for bench in BENCHMARKS:
        if wanted in {_key(n).replace("plus", "+") for n in (bench.name, *bench.aliases)}:
            return bench.name
    raise UnknownPublishedSetError(f"no published VRHs for benchmark {name!r}: {_available()}")


def source(model: str, benchmark: str) -> PublishedSource:
    found = resolve_model(model)
    bench = next(b for b in BENCHMARKS if b.name == resolve_benchmark(benchmark))
    return PublishedSource(found, bench.name, bench.table, bench.section)


def heads(model: str, benchmark: str) -> PublishedHeadSet:
    """The published top-20 VRHs of ``model`` on ``benchmark``, best first, e.g.
    ``heads("Qwen/Qwen2.5-VL-7B-Instruct", "refcoco")[0] == Head(19, 17)``."""
    src = source(model, benchmark)
    return PublishedHeadSet(_LISTS[src.benchmark][src.model.name], src)


def resolve_text_model(name: str) -> PublishedModel:
    """The text LLM called ``name`` that QRHead lists heads for (forgiving as ``resolve_model``, but ``-Instruct``
    counts: ``Qwen2.5-7B`` is another checkpoint than ``Qwen2.5-7B-Instruct``)."""
    wanted = _key(name)
    for model in TEXT_MODELS:
        if wanted in _model_keys(model):
            return model
    raise UnknownPublishedSetError(f"no QRHead list for text model {name!r}: lists exist for {_available_text()}")


def _text_source(entry: Mapping[str, Any]) -> TextAncestorSource:
    model = next(m for m in TEXT_MODELS if m.name == entry["model"])
    return TextAncestorSource(model, entry["data"], entry["config"], entry["commit"],
                              citation=QRHEAD_DATA["citation"], size=len(entry["attn_head_set"].split(",")),
                              repository=QRHEAD_DATA["repository"], licence=QRHEAD_DATA["licence"]["name"])


def _qrhead_heads(text: str) -> list[Head]:
    """QRHead's ``attn_head_set`` (``"16-19,16-2"``: layer-head, 0-based) as heads, in its order."""
    return [Head(int(layer), int(head)) for layer, head in (pair.strip().split("-") for pair in text.split(","))]


def qrhead_heads(model: str, data: str = QRHEAD_DEFAULT_DATA) -> PublishedHeadSet:
    """QRHead's query-focused retrieval heads of text LLM ``model`` detected on ``data`` (``NQ``, the default, or
    ``LME``), in QRHead's rank order, e.g. ``qrhead_heads("Qwen/Qwen2.5-7B-Instruct")[0] == Head(16, 19)``."""
    found = resolve_text_model(model)
    entries = [e for e in QRHEAD_DATA["lists"] if e["model"] == found.name]
    for entry in entries:
        if _key(entry["data"]) == _key(data):
            return PublishedHeadSet(_qrhead_heads(entry["attn_head_set"]), _text_source(entry))
    raise UnknownPublishedSetError(f"no QRHead list of {found.name} on {data!r}: it has "
                                   f"{', '.join(e['data'] for e in entries)}; lists exist for {_available_text()}")


def qrhead_sets() -> list[PublishedHeadSet]:
    """Every QRHead list, in the data file's order (Qwen first, then Llama)."""
    return [qrhead_heads(entry["model"], entry["data"]) for entry in QRHEAD_DATA["lists"]]


def _parse_qrhead(text: str, body: str) -> PublishedHeadSet:
    """``MODEL`` or ``MODEL/DATA`` after ``published:qrhead/`` (``MODEL`` may be a hub id with its ``/``)."""
    parts = [part for part in body.split("/") if part.strip()]
    if not parts:
        raise UnknownPublishedSetError(f"cannot read {text!r}: expected '{SPEC_PREFIX}{QRHEAD}/MODEL[/DATA]', e.g. "
                                       f"'{SPEC_PREFIX}{QRHEAD}/qwen2.5-7b-instruct'; lists exist for "
                                       f"{_available_text()}")
    data_names = {_key(name) for name in QRHEAD_DATA["data_names"]}
    if len(parts) > 1 and _key(parts[-1]) in data_names:
        return qrhead_heads("/".join(parts[:-1]), parts[-1])
    return qrhead_heads("/".join(parts))


def all_sets() -> list[PublishedHeadSet]:
    """Every published list, in table order (benchmark), then the paper's model order."""
    return [heads(m.name, b.name) for b in BENCHMARKS for m in MODELS]


def parse_spec(text: str) -> PublishedHeadSet:
    """``published:MODEL/BENCHMARK`` (``MODEL`` may be a hub id with its ``/``: the benchmark is after the last),
    or a text LLM's QRHead list ``published:qrhead/MODEL`` (``published:qrhead/MODEL/DATA`` for another
    detection set than NQ, e.g. ``published:qrhead/llama-3.1-8b-instruct/lme``)."""
    body = text.strip()
    if not body.lower().startswith(SPEC_PREFIX):
        raise ValueError(f"{text!r} is not a published head-set spec: expected '{SPEC_PREFIX}MODEL/BENCHMARK', "
                         f"e.g. '{SPEC_PREFIX}qwen2.5-vl-7b/refcoco'")
    collection, slash, rest = body[len(SPEC_PREFIX):].partition("/")
    if collection.strip().lower() == QRHEAD:
        return _parse_qrhead(text, rest if slash else "")
    model, sep, benchmark = body[len(SPEC_PREFIX):].rpartition("/")
    if not sep or not model or not benchmark:
        raise UnknownPublishedSetError(f"cannot read {text!r}: expected '{SPEC_PREFIX}MODEL/BENCHMARK', e.g. "
                                       f"'{SPEC_PREFIX}qwen2.5-vl-7b/refcoco'; {_available()}")
    return heads(model, benchmark)



def parse_heads(text: str) -> HeadSet:
    """A head set from text, in every form a head-set option takes: ``"L1H2,L3H0"`` (``HeadSet.parse``) or a
    published list ``"published:MODEL/BENCHMARK"`` (``parse_spec``)."""
    if isinstance(text, str) and text.strip().lower().startswith(SPEC_PREFIX):
        return parse_spec(text)
    return HeadSet.parse(text)


def check_geometry(head_set: HeadSet, geometry: HeadGeometry) -> HeadSet:
    """``head_set`` validated against a model's ``geometry``; for a published set, out-of-range heads raise
    ``PublishedGeometryError`` naming the source's and the target's grids, and a differing grid that still
    holds every head warns (``PublishedGeometryWarning``): index transfer is meaningful between models that
    share a language backbone."""
    if not isinstance(head_set, PublishedHeadSet):
        return geometry.validate(head_set)
    if isinstance(head_set.source, TextAncestorSource):
        return _check_text_geometry(head_set, geometry)
    src = head_set.source.model
    bad = [h for h in head_set if h.layer >= geometry.num_layers or h.head >= geometry.num_heads]
    target = f"{geometry.num_layers} layers x {geometry.num_heads} heads"
    same = [m.checkpoint for m in MODELS if m.backbone == src.backbone]
    if bad:
        raise PublishedGeometryError(
            f"{head_set.source.spec} holds heads of {src.name} ({src.grid}, {src.backbone} backbone), but this "
            f"model has {target}: {len(bad)} of its {len(head_set)} heads ({', '.join(map(str, bad[:4]))}"
            f"{', ...' if len(bad) > 4 else ''}) do not exist in it. Published heads transfer by "
            f"index only to a model with the same language backbone ({src.backbone}: {src.grid}, e.g. "
            f"{' or '.join(same)})")
    if (geometry.num_layers, geometry.num_heads) != (src.num_layers, src.num_heads):
        warnings.warn(f"{head_set.source.spec} comes from {src.name} ({src.grid}); this model has {target}. The "
                      "heads are in range, but indices carry meaning only between models sharing a language "
                      f"backbone ({src.backbone})", PublishedGeometryWarning, stacklevel=2)
    return head_set


def vlms_sharing_grid(model: PublishedModel) -> list[PublishedModel]:
    """The paper's VLMs whose language model has ``model``'s grid (layers and query heads per layer)."""
    return [m for m in MODELS if (m.num_layers, m.num_heads) == (model.num_layers, model.num_heads)]


def _check_text_geometry(head_set: PublishedHeadSet, geometry: HeadGeometry) -> PublishedHeadSet:
    """A text LLM's list goes only onto a model with the text LLM's grid: a different grid is refused even when
    every head is in range (a text list is not a VLM's own list; the grid is the least a shared backbone needs)."""
    src = head_set.source.model
    target = f"{geometry.num_layers} layers x {geometry.num_heads} heads"
    if (geometry.num_layers, geometry.num_heads) == (src.num_layers, src.num_heads):
        return head_set
    bad = [h for h in head_set if h.layer >= geometry.num_layers or h.head >= geometry.num_heads]
    missing = (f"{len(bad)} of its {len(head_set)} heads ({', '.join(map(str, bad[:4]))}"
               f"{', ...' if len(bad) > 4 else ''}) do not exist in it" if bad else
               "every head is in range, but the indices name other heads")
    vlms = vlms_sharing_grid(src)
    where = (f"e.g. {' or '.join(m.checkpoint for m in vlms)}" if vlms else
             "none of the paper's VLMs has that grid")
    raise PublishedGeometryError(
        f"{head_set.source.spec} holds query heads of the text LLM {src.name} ({src.grid}, {src.backbone}), but this "
        f"model's language model has {target}: {missing}. A text LLM's heads transfer by index only to a model whose "
        f"language model has the same grid and backbone ({src.backbone}: {src.grid}; {where})")


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows)


def catalog(*, per_head: bool = False) -> pd.DataFrame:
    """One row per published list (``model``, ``checkpoint``, ``backbone``, ``benchmark``, ``table``, ``layers``,
    ``heads_per_layer``, ``total_heads``, ``n_heads``, ``heads`` as ``L19H17,...``, ``spec``); with
    ``per_head=True`` one row per head (``rank`` 1 = best, ``layer``, ``head``, ``depth`` = layer / (L - 1))."""
    rows = []
    for head_set in all_sets():
        src = head_set.source
        base = {"model": src.model.name, "checkpoint": src.model.checkpoint, "backbone": src.model.backbone,
                "benchmark": src.benchmark, "table": src.table, "layers": src.model.num_layers,
                "heads_per_layer": src.model.num_heads, "total_heads": src.model.total_heads}
        if per_head:
            rows += [{**base, "rank": rank, "head_id": str(h), "layer": h.layer, "head": h.head,
                      "depth": h.layer / (src.model.num_layers - 1)} for rank, h in enumerate(head_set, 1)]
        else:
            rows.append({**base, "n_heads": len(head_set), "heads": str(head_set), "spec": src.spec})
    return _frame(rows)


# ----------------------------------------------------------------------------------------------- analyses

def hypergeometric_pmf(total: int, a: int, b: int) -> list[Fraction]:
    """Exact P(|A ∩ B| = x), x = 0..min(a, b), for A of size ``a`` fixed and B a uniform ``b``-subset of ``total``."""
    if not 0 <= a <= total or not 0 <= b <= total:
        raise ValueError(f"set sizes {a}, {b} must lie in 0..{total}")
    denominator = math.comb(total, b)
    return [Fraction(math.comb(a, x) * math.comb(total - a, b - x), denominator) for x in range(min(a, b) + 1)]


def layer_matched_pmf(num_heads: int, per_layer_a: Mapping[int, int],
                      per_layer_b: Mapping[int, int]) -> list[Fraction]:
    """Exact overlap distribution when each set keeps its heads-per-layer counts and the head indices within a
    layer are uniform: the convolution over layers of hypergeometric(num_heads, a_l, b_l)."""
    pmf = [Fraction(1)]
    for layer in set(per_layer_a) & set(per_layer_b):
        layer_pmf = hypergeometric_pmf(num_heads, per_layer_a[layer], per_layer_b[layer])
        out = [Fraction(0)] * (len(pmf) + len(layer_pmf) - 1)
        for i, p in enumerate(pmf):
            for j, q in enumerate(layer_pmf):
                out[i + j] += p * q
        pmf = out
    return pmf


def _mean(pmf: Sequence[Fraction]) -> float:
    return float(sum(x * p for x, p in enumerate(pmf)))


def _tail(pmf: Sequence[Fraction], observed: int) -> float:
    return float(sum(pmf[observed:], Fraction(0)))


def overlap_tail(observed: int, total: int, a: int, b: int) -> float:
    """P(|A ∩ B| >= observed) under the uniform (hypergeometric) null."""
    return _tail(hypergeometric_pmf(total, a, b), observed)


def _per_layer(head_set: Iterable[Head]) -> dict[int, int]:
    return {layer: len(hs) for layer, hs in HeadSet(head_set).by_layer().items()}


def overlap_row(a: HeadSet, b: HeadSet, num_layers: int, num_heads: int) -> dict[str, Any]:
    """Overlap of two head sets on one ``num_layers x num_heads`` grid with both nulls (module docstring)."""
    shared = a.intersection(b)
    uniform = hypergeometric_pmf(num_layers * num_heads, len(a), len(b))
    matched = layer_matched_pmf(num_heads, _per_layer(a), _per_layer(b))
    return {"shared": len(shared), "jaccard": len(shared) / len(a.union(b)),
            "chance_uniform": _mean(uniform), "p_uniform": _tail(uniform, len(shared)),
            "chance_layer_matched": _mean(matched), "p_layer_matched": _tail(matched, len(shared)),
            "shared_heads": str(shared)}


def same_backbone_overlap(top: int = 20) -> pd.DataFrame:
    """Per same-backbone pair and benchmark: heads shared by the two models' top-``top`` lists, with the
    uniform and layer-matched chance overlaps and exact tail probabilities."""
    rows = []
    for first, second in SAME_BACKBONE_PAIRS:
        model = resolve_model(first)
        for bench in BENCHMARKS:
            a, b = heads(first, bench.name)[:top], heads(second, bench.name)[:top]
            rows.append({"pair": f"{first} / {second}", "backbone": model.backbone, "benchmark": bench.name,
                         "top": top, "total_heads": model.total_heads,
                         **overlap_row(a, b, model.num_layers, model.num_heads)})
    return _frame(rows)


def text_ancestor_catalog() -> pd.DataFrame:
    """One row per QRHead list: text model, checkpoint, backbone, detection ``data``, grid, ``n_heads``, the
    paper's VLMs with the same grid (``vlms``), the config and commit it was copied from, ``spec`` and ``heads``."""
    rows = []
    for head_set in qrhead_sets():
        src = head_set.source
        rows.append({"model": src.model.name, "checkpoint": src.model.checkpoint, "backbone": src.model.backbone,
                     "data": src.benchmark, "layers": src.model.num_layers, "heads_per_layer": src.model.num_heads,
                     "n_heads": len(head_set), "vlms": ", ".join(m.name for m in vlms_sharing_grid(src.model)) or "-",
                     "config": src.config, "commit": src.commit, "spec": src.spec, "heads": str(head_set)})
    return _frame(rows)


def text_ancestor_overlap(vrh_tops: Sequence[int] = (16, 20)) -> pd.DataFrame:
    """Per QRHead list and paper VLM of the same grid (layers x query heads), benchmark and VRH list size: heads of
    the whole QRHead list (16, best first) among the VLM's top-``vrh_top`` VRHs, with the uniform and
    layer-matched chance overlaps and exact tail probabilities (``overlap_row``)."""
    rows = []
    for ancestor in qrhead_sets():
        text = ancestor.source.model
        for vlm in vlms_sharing_grid(text):
            for bench in BENCHMARKS:
                for top in vrh_tops:
                    vrhs = heads(vlm.name, bench.name)[:top]
                    rows.append({"text_model": text.name, "data": ancestor.source.benchmark, "vlm": vlm.name,
                                 "same_backbone": text.backbone == vlm.backbone, "benchmark": bench.name,
                                 "qrhead_top": len(ancestor), "vrh_top": top, "total_heads": text.total_heads,
                                 **overlap_row(ancestor, vrhs, text.num_layers, text.num_heads)})
    return _frame(rows)


def benchmark_stability(top: int = 20) -> pd.DataFrame:
    """Per model and pair of benchmarks: shared heads and Jaccard of the two top-``top`` lists."""
    rows = []
    for model in MODELS:
        for first, second in itertools.combinations([b.name for b in BENCHMARKS], 2):
            a, b = heads(model.name, first)[:top], heads(model.name, second)[:top]
            shared = len(a.intersection(b))
            rows.append({"model": model.name, "benchmark_a": first, "benchmark_b": second, "shared": shared,
                         "jaccard": shared / len(a.union(b))})
    return _frame(rows)


def stability_summary(top: int = 20) -> pd.DataFrame:
    """Per model: heads in all five lists (``core``), in any (``union``), and the pairwise Jaccard range."""
    pairs = benchmark_stability(top)
    rows = []
    for model in MODELS:
        sets = [heads(model.name, b.name)[:top] for b in BENCHMARKS]
        core = sets[0]
        union = sets[0]
        for other in sets[1:]:
            core, union = core.intersection(other), union.union(other)
        jaccard = pairs.loc[pairs["model"] == model.name, "jaccard"]
        rows.append({"model": model.name, "core": len(core), "union": len(union), "jaccard_min": jaccard.min(),
                     "jaccard_mean": jaccard.mean(), "jaccard_max": jaccard.max(), "core_heads": str(core)})
    return _frame(rows)


def layer_histogram(*, pooled: bool = False) -> pd.DataFrame:
    """Heads per (model, benchmark, layer), or per (model, layer) summed over the five lists with ``pooled``,
    with ``depth`` = layer / (L - 1) and ``share`` of the list's (or the model's pooled) heads; models in the
    paper's order, layers ascending."""
    keys = ["model", "layer", "depth"] if pooled else ["model", "benchmark", "layer", "depth"]
    frame = catalog(per_head=True).groupby(keys, sort=False).size().rename("count").reset_index()
    frame["share"] = frame["count"] / frame.groupby(keys[:-2])["count"].transform("sum")
    order = {name: i for i, name in enumerate([m.name for m in MODELS] + [b.name for b in BENCHMARKS])}
    return frame.sort_values(keys[:-1], key=lambda c: c if c.name == "layer" else c.map(order),
                             kind="stable").reset_index(drop=True)


def depth_summary() -> pd.DataFrame:
    """Per model, pooled over its five lists: the layers used and their relative depth (min, median, max)."""
    per_head = catalog(per_head=True)
    rows = []
    for model in MODELS:
        part = per_head[per_head["model"] == model.name]
        rows.append({"model": model.name, "layers": model.num_layers, "first_layer": int(part["layer"].min()),
                     "last_layer": int(part["layer"].max()), "depth_min": part["depth"].min(),
                     "depth_median": part["depth"].median(), "depth_max": part["depth"].max(),
                     "distinct_layers": int(part["layer"].nunique())})
    return _frame(rows)


def markdown_tables() -> str:
    """The analyses as Markdown (the generated part of docs/published-heads.md)."""
    overlap = same_backbone_overlap().drop(columns=["backbone", "top", "total_heads", "shared_heads"])
    sections = [
        (("Same-backbone overlap of the top-20 lists, per benchmark (chance: expected shared heads; p: exact "
          "P(shared >= observed))"), overlap),
        ("Shared heads of each same-backbone pair", same_backbone_overlap()[["pair", "benchmark", "shared_heads"]]),
        ("Stability of each model's list across the five benchmarks (10 pairs per model)",
         stability_summary().drop(columns=["core_heads"])),
        ("Heads in all five lists of a model", stability_summary()[["model", "core_heads"]]),
        ("Where the heads sit, pooled over the five lists (depth = layer / (L - 1))", depth_summary()),
        ("Layer histogram, pooled over the five lists (100 head slots per model)",
         layer_histogram(pooled=True)),
    ]
    return "\n\n".join(f"**{title}**\n\n{_markdown(frame)}" for title, frame in sections) + "\n"


def text_ancestor_tables() -> str:
    """The text-ancestor analyses as Markdown (the tables of docs/results/text-ancestors.md)."""
    catalog_columns = ["model", "data", "layers", "heads_per_layer", "n_heads", "vlms", "spec"]
    overlap = text_ancestor_overlap()
    sections = [("QRHead's lists (text LLMs) and the paper's VLMs with the same grid", text_ancestor_catalog()[
        catalog_columns])]
    for top in sorted(set(overlap["vrh_top"])):
        part = overlap[overlap["vrh_top"] == top].drop(columns=["same_backbone", "vrh_top", "total_heads",
                                                                "shared_heads"])
        sections.append((f"QRHead's list (qrhead_top heads) among the VLM's top-{top} VRHs (chance: expected shared "
                         "heads; p: exact P(shared >= observed))", part))
    shared = overlap[overlap["vrh_top"] == max(overlap["vrh_top"])]
    sections.append((f"The shared heads (QRHead's list and the VLM's top-{max(overlap['vrh_top'])}), in QRHead's rank "
                     "order", shared[["text_model", "vlm", "benchmark", "shared_heads"]]))
    return "\n\n".join(f"**{title}**\n\n{_markdown(frame)}" for title, frame in sections) + "\n"


def _markdown(frame: pd.DataFrame) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1e-3 and value else f"{value:.3f}".rstrip("0").rstrip(".")
        return str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_tables(), end="")
