"""The family registry is the one list: every other list of families agrees with it.

A family in the registry but missing elsewhere (or the reverse) fails here: adapter modules, the adapters'
names and model types, the tiny fixtures, the spec rows of the parametrised tests, docs/families.md, and the
TransformerLens flag (checked against TransformerLens' own table of supported architectures).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import vrh_interp.core.description.families
from tests.families.specs import SPECS
from vrh_interp.core.description.families import BUILTIN_ADAPTERS, FamilyAdapter, adapter_class, adapter_for_config
from vrh_interp.core.description.families.registry import FAMILIES, TINY_RECIPES, family_row, row_for_model_type
from vrh_interp.core.description.tiny import TINY_BACKBONE_VARIANTS, TINY_FAMILIES, build_tiny, resolve

NAMES = [row.name for row in FAMILIES]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "families.md"


def concrete_adapters_in_package() -> set[type[FamilyAdapter]]:
    """Every non-abstract adapter class defined in a module of vrh_interp.core.description.families that serves a
    model type."""
    found = set()
    for module_info in pkgutil.iter_modules(vrh_interp.core.description.families.__path__):
        module = importlib.import_module(f"vrh_interp.core.description.families.{module_info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (issubclass(obj, FamilyAdapter) and obj.__module__ == module.__name__ and not inspect.isabstract(obj)
                    and getattr(obj, "model_types", ())):
                found.add(obj)
    return found


def test_registry_keys_are_unique_and_model_types_map_to_one_row() -> None:
    assert len(set(NAMES)) == len(NAMES)
    model_types = [t for row in FAMILIES for t in row.model_types]
    assert len(set(model_types)) == len(model_types)
    assert all(row_for_model_type(t).name == row.name for row in FAMILIES for t in row.model_types)
    assert row_for_model_type("no_such_model") is None


def test_every_adapter_module_is_a_row_and_every_row_names_its_adapter() -> None:
    assert concrete_adapters_in_package() == {adapter_class(row) for row in FAMILIES}
    assert BUILTIN_ADAPTERS == tuple(f"{cls.__module__}:{cls.__name__}" for cls in map(adapter_class, FAMILIES))
    assert all(adapter_class(row).__module__.endswith(f".families.{row.name}") for row in FAMILIES)
    for row in FAMILIES:
        cls = adapter_class(row)
        assert (cls.name, cls.display_name, cls.model_types) == (row.name, row.display_name, row.model_types)


@pytest.mark.parametrize("name", NAMES)
def test_model_classes_serve_the_rows_model_types(name: str) -> None:
    row = family_row(name)
    for class_name in row.model_classes:
        config_class = resolve(class_name).config_class
        assert config_class.model_type in row.model_types
        assert type(adapter_for_config(config_class())) is adapter_class(row)


def test_tiny_fixtures_spec_rows_and_docs_follow_the_registry() -> None:
    assert TINY_FAMILIES == tuple(NAMES)
    assert list(SPECS) == NAMES
    assert all(spec.adapter is adapter_class(family_row(name)) for name, spec in SPECS.items())
    assert set(TINY_RECIPES) == {*NAMES, *TINY_BACKBONE_VARIANTS}
    assert all(TINY_BACKBONE_VARIANTS[variant] in NAMES for variant in TINY_BACKBONE_VARIANTS)
    docs = DOCS.read_text(encoding="utf-8")
    for row in FAMILIES:
        assert row.layout and row.caveats, f"row {row.name} needs a layout summary and caveats for the docs"
        assert f'<a id="{row.name}"></a>' in docs and f"## {row.display_name}\n" in docs


@pytest.mark.parametrize("name", sorted(TINY_RECIPES))
def test_every_recipe_names_real_classes_of_its_family(name: str) -> None:
    recipe = TINY_RECIPES[name]
    family = next(row for row in FAMILIES if name == row.name or name in row.tiny_variants)
    for target in (recipe.model, recipe.config.target, recipe.image_processor.target, recipe.processor.target):
        assert resolve(target) is not None
    assert recipe.model in family.model_classes or name in family.tiny_variants


def test_unknown_tiny_fixture_names_the_available_ones() -> None:
    with pytest.raises(ValueError, match="available: qwen2_vl, "):
        build_tiny("no_such_family")


def test_transformer_lens_flag_matches_transformer_lens_own_table() -> None:
    factory = pytest.importorskip("transformer_lens.factories.architecture_adapter_factory")
    from vrh_interp.core.execution.backends.transformer_lens import SUPPORTED_FAMILIES

    assert SUPPORTED_FAMILIES == tuple(row.name for row in FAMILIES if row.transformer_lens)
    for row in FAMILIES:
        assert (row.model_classes[0] in factory.SUPPORTED_ARCHITECTURES) == row.transformer_lens, row.name
