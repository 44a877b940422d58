"""``--data`` and ``--vqa`` specifications: where samples come from.

A spec is ``KIND:ARG[:ARG...][:key=value...]``; parts holding ``=`` are options, the rest positional.

Grounding samples (``load_data``):

* ``synthetic:SPLIT:N[:LEVEL]`` - N seeded scenes of the synthetic split (``detect``/``eval``/``train``),
  one referent per scene (cycling through the objects so every position and kind occurs), difficulty
  LEVEL 0, 1 or 2 (default 1); N is at most ``MAX_SYNTHETIC_SCENES`` (the scenes are rendered eagerly);
* ``jsonl:PATH`` - a user's own data, one JSON object per line (``vrh_interp.data.datasets.jsonl``);
* ``refcoco:ROOT[:SPLIT]``, ``refcoco+:ROOT[:SPLIT]``, ``refcocog:ROOT[:SPLIT]`` - the refer toolkit layout
  (default split ``val``; options ``per=object|expression``, ``images=COCO_TRAIN2014_DIR``, ``split_by=``);
* ``lmms-refcoco:PARQUET_DIR_OR_FILE[:SPLIT]`` - lmms-lab parquet of RefCOCO / + / g (option ``per=``);
* ``jxu124-refcoco:PARQUET_DIR_OR_FILE[:SPLIT]:images=COCO_DIR`` - jxu124 parquet (options ``images=``,
  ``per=``);
* ``toloka:CSV:IMAGE_DIR`` - a Toloka VQA CSV, images looked up by file name in IMAGE_DIR;
* ``refspatial:PATH[:SPLIT]`` - RefSpatial-Bench parquet or raw folders (split location / placement / unseen).

VQA samples (``load_vqa``): ``NAME:PATH[:key=value...]`` with NAME one of ``VQA_BENCHMARKS``:
``cvbench`` (``part=all|2d|3d``), ``mmstar``, ``countbench``, ``mathvista`` (``subset=mcq|all``),
``spatial457`` (``subset=L1_single``, ``images=``), ``spatialrgpt`` (``images=`` required,
``categories=a,b``), ``vaw`` (``images=`` required, ``attribute_types=``, ``seed=``), and
``synthetic:SPLIT:N[:LEVEL]`` (the VQA items of N synthetic scenes, ``vrh_interp.data.datasets.synthetic_vqa``).

Every file-backed kind also takes ``on_error=skip`` (drop unusable rows, listed in the result's
``skipped``) and ``verify_images=true`` (decode every image while loading, to catch truncated files).
Nothing is downloaded: all paths are local.

Every grounding spec also takes the split options (``SPLIT_OPTIONS``): ``role=detection|evaluation`` keeps one
part of the paper's seeded split of the loaded samples (``datasets.splits.detection_split``): ``detect=N``
detection samples (default 200, ``PAPER_DETECTION_COUNT``) ranked by ``split_seed=S`` (default 0), and the
disjoint rest, or ``eval=M`` of it, for evaluation; the loader's ``skipped`` rows are kept. The split is a
property of the data, not of the experiment reading it: ``vrh detect --data X:role=detection`` and ``vrh sweep
--data X:role=evaluation`` (any experiment, a grid cell, ``vrh reproduce``'s steps) get disjoint samples by
construction. ``detect=``, ``eval=`` and ``split_seed=`` need ``role=``; VQA specs take none of them (``part=``
is CV-Bench's own option, hence ``role=``).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from vrh_interp.core.bookkeeping import paths
from vrh_interp.data.checks import DIFFICULTY_LEVELS

if TYPE_CHECKING:
    from vrh_interp.data.datasets.samples import GroundingSample, SampleSet, VQASample

# The loaders are imported by the kind that uses them (pyarrow, PIL and numpy cost ~0.5 s): parsing and checking a
# spec, which the CLI does before anything heavy loads, imports none of them.
COMMON_OPTIONS: tuple[str, ...] = ("on_error", "verify_images")
# every grounding spec's split options (module doc), read by ``load_data`` and never passed to a loader
SPLIT_OPTIONS: tuple[str, ...] = ("role", "detect", "eval", "split_seed")
SPLIT_ROLES: tuple[str, ...] = ("detection", "evaluation")
SYNTHETIC_SPLITS: tuple[str, ...] = ("detect", "eval", "train")
MAX_SYNTHETIC_SCENES = 100_000  # rendered while loading: ~1 ms each, so the largest spec loads in minutes
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes"), ("0", "false", "no")


class DataSpecError(ValueError):
    """A ``--data`` / ``--vqa`` specification that cannot be read."""


@dataclass(frozen=True)
class ParsedSpec:
    text: str
    kind: str
    positional: tuple[str, ...]
    options: Mapping[str, str]
    read_before: tuple[str, ...] = ()  # options read before the loader (a grounding spec's split): named in usages

    def args(self, minimum: int, maximum: int, usage: str) -> tuple[str, ...]:
        if not minimum <= len(self.positional) <= maximum or any(not p for p in self.positional):
            raise DataSpecError(f"bad spec {self.text!r}: use {usage}")
        return self.positional

    def checked_options(self, allowed: Sequence[str], usage: str, *, required: Sequence[str] = ()) -> dict[str, Any]:
        """Validated options as loader keyword arguments (common ones converted)."""
        unknown = sorted(set(self.options) - set(allowed) - set(COMMON_OPTIONS))
        missing = [r for r in required if r not in self.options]
        if unknown or missing:
            problem = f"unknown options {unknown}" if unknown else f"missing options {missing}"
            raise DataSpecError(f"bad spec {self.text!r}: {problem}; use {usage} "
                                f"[options: {', '.join([*allowed, *COMMON_OPTIONS, *self.read_before])}]")
        options: dict[str, Any] = dict(self.options)
        if "verify_images" in options:
            word = options["verify_images"].lower()
            if word not in TRUE_WORDS + FALSE_WORDS:
                raise DataSpecError(f"bad spec {self.text!r}: verify_images must be true or false")
            options["verify_images"] = word in TRUE_WORDS
        if options.get("on_error", "raise") not in ("raise", "skip"):
            raise DataSpecError(f"bad spec {self.text!r}: on_error must be raise or skip")
        return options


def parse_spec(spec: str) -> ParsedSpec:
    """Split a spec into kind, positional parts and ``key=value`` options (a repeated option is an error)."""
    if not isinstance(spec, str):
        raise DataSpecError(f"a data spec is text such as 'synthetic:eval:200' or 'jsonl:PATH', got "
                            f"{type(spec).__name__} {spec!r}")
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    options: dict[str, str] = {}
    for key, value in (p.split("=", 1) for p in parts if "=" in p):
        if key in options:
            raise DataSpecError(f"bad spec {spec!r}: option {key!r} given twice")
        options[key] = value
    return ParsedSpec(spec, kind, tuple(p for p in parts if "=" not in p), MappingProxyType(options))


@dataclass(frozen=True)
class SplitPart:
    """The split options of a grounding spec: which ``role`` (part) of the seeded split, its ``detect`` count,
    ``eval`` count (None: all the rest) and ``seed``."""

    role: str
    detect: int
    eval: int | None
    seed: int

    def take(self, samples: Any) -> Any:
        """This part of ``samples``' split: a ``SampleSet`` keeps its source and ``skipped`` rows and records the
        split in its ``selection``; a list stays a list."""
        split = self.split(samples)
        part = split.detection if self.role == "detection" else split.evaluation
        from vrh_interp.data.datasets.samples import SampleSet

        if not isinstance(samples, SampleSet):
            return list(part)
        selection = {**samples.selection, "role": self.role, "detect": self.detect, "eval": self.eval,
                     "split_seed": self.seed}
        return SampleSet(tuple(part), samples.source, selection, samples.skipped)

    def split(self, samples: Sequence[Any]) -> Any:
        """Both parts (``datasets.splits.DetectionSplit``); its ``ValueError`` for counts the samples cannot give."""
        from vrh_interp.data.datasets.splits import detection_split

        return detection_split(samples, self.detect, seed=self.seed, evaluation_count=self.eval)


def _whole_number(spec: ParsedSpec, name: str, what: str, *, minimum: int | None) -> int:
    text = spec.options[name]
    pattern = r"-?[0-9]{1,18}" if minimum is None else r"[0-9]{1,18}"
    if not re.fullmatch(pattern, text) or (minimum is not None and int(text) < minimum):
        bound = "a whole number" if minimum is None else f"a whole number >= {minimum}"
        raise DataSpecError(f"bad spec {spec.text!r}: {name}={text!r} must be {bound} ({what})")
    return int(text)


def split_part(spec: ParsedSpec) -> tuple[ParsedSpec, SplitPart | None]:
    """``spec`` without its split options (what its kind's loader reads; same ``text``) and the part they name,
    None without ``role=``. Each bad value is a one-line ``DataSpecError``."""
    given = [name for name in SPLIT_OPTIONS if name in spec.options]
    rest = ParsedSpec(spec.text, spec.kind, spec.positional,
                      MappingProxyType({k: v for k, v in spec.options.items() if k not in SPLIT_OPTIONS}),
                      read_before=SPLIT_OPTIONS)
    if not given:
        return rest, None
    if "role" not in spec.options:
        raise DataSpecError(f"bad spec {spec.text!r}: {', '.join(f'{n}=' for n in given)} set the seeded "
                            "detection / evaluation split but no part of it: add role=detection or role=evaluation")
    role = spec.options["role"]
    if role not in SPLIT_ROLES:
        raise DataSpecError(f"bad spec {spec.text!r}: role={role!r} must be detection (the seeded detection "
                            "samples) or evaluation (the disjoint rest)")
    from vrh_interp.data.datasets.splits import PAPER_DETECTION_COUNT

    detect = _whole_number(spec, "detect", "the detection samples", minimum=1) if "detect" in spec.options \
        else PAPER_DETECTION_COUNT
    count = _whole_number(spec, "eval", "the evaluation samples; leave it out for all the rest", minimum=1) \
        if "eval" in spec.options else None
    seed = _whole_number(spec, "split_seed", "the seed of the split", minimum=None) \
        if "split_seed" in spec.options else 0
    return rest, SplitPart(role, detect, count, seed)


def data_part(spec: str) -> tuple[str, SplitPart | None]:
    """A grounding spec's text without its split options, and the part they name (None: the whole data); a bad
    spec is a ``DataSpecError``."""
    _, part = split_part(check_spec(spec))
    kept = [p for p in spec.split(":") if p.partition("=")[0] not in SPLIT_OPTIONS or "=" not in p]
    return ":".join(kept), part


def check_synthetic(split: object, count: object, difficulty: object) -> None:
    """Refuse a synthetic split, scene count or level outside the documented ranges (DataSpecError)."""
    if split not in SYNTHETIC_SPLITS:
        raise DataSpecError(f"unknown synthetic split {split!r}: use one of {', '.join(SYNTHETIC_SPLITS)}")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SYNTHETIC_SCENES:
        raise DataSpecError(f"synthetic scene count {count!r} out of range: use 1 .. {MAX_SYNTHETIC_SCENES} "
                            "(vrh_interp.data.sources.MAX_SYNTHETIC_SCENES)")
    if isinstance(difficulty, bool) or difficulty not in DIFFICULTY_LEVELS:
        raise DataSpecError(f"synthetic difficulty level {difficulty!r} does not exist: use 0, 1 or 2")


def synthetic_samples(split: str, count: int, difficulty: int = 1) -> list[GroundingSample]:
    """The synthetic grounding loader: one referent of each of scenes ``0..count-1`` (scene ``i``'s referent
    ``i mod n``; scenes without a referable object are skipped), the loaders' ``GroundingSample``s as a list."""
    from vrh_interp.data import grounding_samples

    check_synthetic(split, count, difficulty)
    out = []
    for index in range(count):
        options = grounding_samples(split, index, difficulty)  # type: ignore[arg-type]
        if options:
            out.append(options[index % len(options)])
    return out


def _synthetic_args(spec: ParsedSpec) -> tuple[Any, int, int]:
    """(split, N, LEVEL) of ``synthetic:SPLIT:N[:LEVEL]``, each checked (DataSpecError with the usage)."""
    parts = spec.positional
    usage = (f"use synthetic:SPLIT:N[:LEVEL] with SPLIT one of {'/'.join(SYNTHETIC_SPLITS)}, N scenes "
             f"(1 .. {MAX_SYNTHETIC_SCENES}) and LEVEL 0, 1 or 2 (default 1), e.g. synthetic:eval:200")
    if len(parts) not in (2, 3) or spec.options or not all(p.isascii() and p.isdigit() for p in parts[1:]) \
            or any(len(p) > 9 for p in parts[1:]):
        raise DataSpecError(f"bad synthetic spec {spec.text!r}: {usage}")
    split, count, level = parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 1
    try:
        check_synthetic(split, count, level)
    except DataSpecError as error:
        raise DataSpecError(f"bad synthetic spec {spec.text!r}: {error}; {usage}") from None
    return split, count, level


def _synthetic(spec: ParsedSpec) -> list[GroundingSample]:
    return synthetic_samples(*_synthetic_args(spec))


def _synthetic_vqa(spec: ParsedSpec) -> SampleSet[VQASample]:
    from vrh_interp.data.datasets.synthetic_vqa import synthetic_vqa

    return synthetic_vqa(*_synthetic_args(spec))


def _refer(spec: ParsedSpec) -> SampleSet:
    from vrh_interp.data.datasets.refer import load_refer

    usage = f"{spec.kind}:ROOT[:SPLIT]"
    root, *split = spec.args(1, 2, usage)
    options = spec.checked_options(("per", "images", "split_by"), usage)
    if "images" in options:
        options["image_dir"] = options.pop("images")
    return load_refer(root, spec.kind, split[0] if split else "val", **options)  # type: ignore[arg-type]


def _lmms(spec: ParsedSpec) -> SampleSet:
    from vrh_interp.data.datasets.lmms_refcoco import load_lmms_refcoco

    usage = "lmms-refcoco:PARQUET_DIR_OR_FILE[:SPLIT]"
    path, *split = spec.args(1, 2, usage)
    return load_lmms_refcoco(path, split[0] if split else "val", **spec.checked_options(("per",), usage))


def _jxu124(spec: ParsedSpec) -> SampleSet:
    from vrh_interp.data.datasets.jxu124_refcoco import load_jxu124_refcoco

    usage = "jxu124-refcoco:PARQUET_DIR_OR_FILE[:SPLIT]:images=COCO_DIR"
    path, *split = spec.args(1, 2, usage)
    options = spec.checked_options(("images", "per"), usage, required=("images",))
    return load_jxu124_refcoco(path, split[0] if split else "val", image_root=options.pop("images"), **options)


def _toloka(spec: ParsedSpec) -> SampleSet:
    from vrh_interp.data.datasets.toloka import load_toloka

    usage = "toloka:CSV:IMAGE_DIR"
    csv_path, image_dir = spec.args(2, 2, usage)
    return load_toloka(csv_path, image_dir, **spec.checked_options((), usage))


def _refspatial(spec: ParsedSpec) -> SampleSet:
    from vrh_interp.data.datasets.refspatial import load_refspatial

    usage = "refspatial:PATH[:SPLIT]"
    path, *split = spec.args(1, 2, usage)
    return load_refspatial(path, split[0] if split else "location", **spec.checked_options((), usage))


def _jsonl(spec: ParsedSpec) -> SampleSet:
    from vrh_interp.data.datasets.jsonl import load_jsonl

    usage = "jsonl:PATH"
    (path,) = spec.args(1, 1, usage)
    return load_jsonl(path, **spec.checked_options((), usage))


GROUNDING_KINDS: Mapping[str, Callable[[ParsedSpec], Sequence[Any]]] = MappingProxyType({
    "synthetic": _synthetic, "jsonl": _jsonl, "refcoco": _refer, "refcoco+": _refer, "refcocog": _refer,
    "lmms-refcoco": _lmms, "jxu124-refcoco": _jxu124, "toloka": _toloka, "refspatial": _refspatial,
})


def load_data(spec: str) -> Sequence[Any]:
    """Grounding samples for a ``--data`` spec; with ``role=``, that part of the seeded split (``SplitPart``)."""
    parsed, part = split_part(check_spec(spec))
    loaded = _loaded(GROUNDING_KINDS[parsed.kind], parsed)
    return loaded if part is None else part.take(loaded)


def load_split(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """The split a grounding spec's split options name, both parts (``datasets.splits.DetectionSplit``; its
    ``role=`` picks none, absent options take their defaults), and the rows its loader skipped: what a run records
    of the split (``vrh reproduce``'s ``split.json``)."""
    parsed, part = split_part(check_spec(spec))
    loaded = _loaded(GROUNDING_KINDS[parsed.kind], parsed)
    if part is None:
        from vrh_interp.data.datasets.splits import PAPER_DETECTION_COUNT

        part = SplitPart("detection", PAPER_DETECTION_COUNT, None, 0)
    return part.split(loaded), tuple(getattr(loaded, "skipped", ()))


_READ: dict[tuple[Any, ...], Any] | None = None  # inside ``reading_once``: what each loader call returned


@contextmanager
def reading_once() -> Iterator[None]:
    """Inside, each dataset is read once, whatever the split options of the specs naming it: a run whose steps are
    specs over one file (``vrh reproduce``: the split, the detection, the k-sweep; the VQA count and its sweep)
    reads it once, not once a step. The samples are frozen and open their images when used, so sharing them costs
    no memory; a file changed during the run is read as it was first."""
    global _READ
    outer = _READ
    _READ = {} if outer is None else outer
    try:
        yield
    finally:
        _READ = outer


def _loaded(load: Callable[[ParsedSpec], Any], spec: ParsedSpec) -> Any:
    """``load(spec)``; a loader's plain ValueError about an argument (a split or option value it does not know)
    becomes a DataSpecError naming the spec. The library's own errors (DatasetError: a file or row) pass."""
    key = (load, spec.kind, spec.positional, tuple(sorted(spec.options.items())))
    if _READ is not None and key in _READ:
        read = _READ[key]
        return list(read) if isinstance(read, list) else read  # a caller may change a list, not a frozen SampleSet
    try:
        loaded = load(spec)
    except ValueError as error:
        if type(error).__module__.startswith("vrh_interp"):
            raise
        raise DataSpecError(f"bad spec {spec.text!r}: {error}") from None
    if _READ is not None:
        _READ[key] = loaded
    return loaded


def _comma_list(text: str) -> tuple[str, ...]:
    parts = tuple(part for part in text.split(",") if part)
    if not parts:
        raise ValueError("an empty list")
    return parts


def _vqa_loader(module: str, allowed: Sequence[str] = (), *,
                required: Sequence[str] = (), converters: Mapping[str, Callable[[str], Any]] | None = None
                ) -> Callable[[ParsedSpec], SampleSet[VQASample]]:
    """Spec -> ``vrh_interp.data.datasets.MODULE.load_MODULE(PATH, **options)`` (imported when used); ``images=``
    becomes ``image_dir=``, ``converters`` parse option text."""
    def from_spec(spec: ParsedSpec) -> SampleSet[VQASample]:
        import importlib

        load = getattr(importlib.import_module(f"vrh_interp.data.datasets.{module}"), f"load_{module}")
        usage = f"{spec.kind}:PATH" + "".join(f":{r}=..." for r in required)
        (path,) = spec.args(1, 1, usage)
        options = spec.checked_options(allowed, usage, required=required)
        for name, convert in (converters or {}).items():
            if name in options:
                try:
                    options[name] = convert(options[name])
                except ValueError:
                    raise DataSpecError(f"bad spec {spec.text!r}: cannot read {name}={options[name]!r}") from None
        if "images" in options:
            options["image_dir"] = options.pop("images")
        return load(path, **options)
    return from_spec


VQA_BENCHMARKS: Mapping[str, Callable[[ParsedSpec], SampleSet[VQASample]]] = MappingProxyType({
    "cvbench": _vqa_loader("cvbench", ("part",)),
    "mmstar": _vqa_loader("mmstar", ("split",)),
    "countbench": _vqa_loader("countbench"),
    "mathvista": _vqa_loader("mathvista", ("subset",)),
    "spatial457": _vqa_loader("spatial457", ("subset", "images")),
    "spatialrgpt": _vqa_loader("spatialrgpt", ("images", "categories"), required=("images",),
                               converters={"categories": _comma_list}),
    "vaw": _vqa_loader("vaw", ("images", "attribute_types", "seed"), required=("images",),
                       converters={"seed": int}),
    "synthetic": _synthetic_vqa,
})


def load_vqa(spec: str) -> SampleSet[VQASample]:
    """VQA samples for a ``--vqa NAME:PATH[:key=value...]`` spec."""
    parsed = check_spec(spec, vqa=True)
    return _loaded(VQA_BENCHMARKS[parsed.kind], parsed)


def check_spec(spec: str, *, vqa: bool = False) -> ParsedSpec:
    """Parse a ``--data`` (``--vqa`` with ``vqa``) spec and check what can be checked without reading a file: a
    known kind, synthetic arguments in range, a grounding spec's split options (``split_part``) (DataSpecError
    otherwise). The CLI calls it before loading a model."""
    parsed = parse_spec(spec)
    if vqa and parsed.kind not in VQA_BENCHMARKS:
        raise DataSpecError(f"unknown VQA benchmark in {spec!r}: use NAME:PATH with NAME one of "
                            f"{', '.join(VQA_BENCHMARKS)}")
    if not vqa and parsed.kind not in GROUNDING_KINDS:
        raise DataSpecError(f"unknown data spec {spec!r}: kinds are {', '.join(GROUNDING_KINDS)} "
                            "(e.g. synthetic:SPLIT:N, jsonl:PATH, refcoco:ROOT[:SPLIT])")
    base = parsed if vqa else split_part(parsed)[0]  # the split options are checked here
    if parsed.kind == "synthetic":
        _synthetic_args(base)
    return parsed


# the paths a spec names, checked up front by ``check_paths``: each positional part's role ("file", "folder",
# "path": either; None: not a path), then the options that are folders. Synthetic specs name none.
_PATH_ROLES: Mapping[str, tuple[tuple[str | None, ...], tuple[str, ...]]] = MappingProxyType({
    "jsonl": (("file",), ()), "refcoco": (("folder", None), ("images",)), "refcoco+": (("folder", None), ("images",)),
    "refcocog": (("folder", None), ("images",)), "lmms-refcoco": (("path", None), ()),
    "jxu124-refcoco": (("path", None), ("images",)), "toloka": (("file", "folder"), ()),
    "refspatial": (("path", None), ()), "synthetic": ((), ()),
})
_VQA_PATH_ROLES: tuple[tuple[str | None, ...], tuple[str, ...]] = (("path",), ("images",))
_CHECKERS: Mapping[str, Callable[..., Any]] = MappingProxyType({
    "file": paths.input_file, "folder": paths.input_folder, "path": paths.input_path})


def check_paths(spec: str, option: str = "--data", *, vqa: bool = False) -> ParsedSpec:
    """``check_spec``, then every path the spec names must exist and be readable, a file or a folder as its kind
    needs (``paths.PathOptionError`` naming ``option``, the spec and the path). Only ``stat`` calls: nothing is
    read, so the CLI runs it before the model loads."""
    parsed = check_spec(spec, vqa=vqa)
    if vqa and parsed.kind == "synthetic":
        return parsed
    positional, folder_options = _VQA_PATH_ROLES if vqa else _PATH_ROLES[parsed.kind]
    if parsed.kind != "synthetic" and not sum(r is not None for r in positional) <= len(parsed.positional) \
            <= len(positional):
        raise DataSpecError(f"bad spec {spec!r}: {parsed.kind} takes {sum(r is not None for r in positional)}"
                            f"{'' if None not in positional else ' or ' + str(len(positional))} ':'-separated "
                            f"parts after {parsed.kind}:, got {len(parsed.positional)} (docs/datasets.md)")
    label = f"{option} {spec}:"
    for role, text in zip(positional, parsed.positional):
        if role is not None:
            _CHECKERS[role](text, label, "data file" if role == "file" else f"data {role}")
    for name in folder_options:
        if name in parsed.options:
            paths.input_folder(parsed.options[name], f"{label} {name}=", "image folder")
    return parsed

