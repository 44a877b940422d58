"""nnsight trace templates: reusable interventions on the language backbone's attention heads.

Each template is a small frozen dataclass of plain data (module paths, head indices, positions) with
methods that act on an nnsight model envoy INSIDE a trace. Holding no model and no vrh_interp handle,
a template pickles by value into a remote (NDIF) request, and it works inside a user's own
``model.trace(...)`` / ``model.generate(...)`` exactly as inside our one-call helpers.

nnsight requires requests in execution order, so several templates at once are applied layer by layer,
and inside a layer by site: first the attention call's inputs (readout), then the output projection's
input (capture, ablation, patching), then (optional site) the MLP's output. ``apply_in_order`` does that
for any mix of templates.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence


class LayerTemplate(Protocol):
    """A template acting at the attention sites of some layers."""

    def layers(self) -> Sequence[int]: ...

    def at_attention_call(self, model: Any, layer: int) -> Any: ...

    def at_output_projection(self, model: Any, layer: int) -> Any: ...


def module_at(root: Any, path: str) -> Any:
    """Resolve a dotted module path (``model.language_model.layers.3.self_attn``) on a module or envoy."""
    obj = root
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def per_head_view(model: Any, projection_path: str, num_heads: int, head_dim: int) -> Any:
    """The output projection's input at ``projection_path`` viewed ``[batch, seq, heads, head_dim]``.

    A view: in-place edits (ablation, patching) reach the model; ``.clone()`` it to keep values.
    """
    x = module_at(model, projection_path).input
    batch, seq, _ = x.shape
    return x.view(batch, seq, num_heads, head_dim)


class ProjectionTemplate:
    """Base of the templates that act at the output projection's input only (ablation, capture, patching): the
    layers are those of ``projection_paths``, nothing happens at the attention call, and ``per_head`` is the
    ``[batch, seq, heads, head_dim]`` view there. Subclasses are frozen dataclasses with these three fields."""

    projection_paths: Mapping[int, str]
    num_heads: int
    head_dim: int

    def layers(self) -> Sequence[int]:
        return tuple(self.projection_paths)

    def at_attention_call(self, model: Any, layer: int) -> None:
        return None

    def per_head(self, model: Any, layer: int) -> Any:
        return per_head_view(model, self.projection_paths[layer], self.num_heads, self.head_dim)


def apply_in_order(model: Any, templates: Sequence[LayerTemplate]) -> list[dict[int, Any]]:
    """Apply every template at its layers, in the order a forward pass reaches each site.

    Returns, per template, ``{layer: value}`` for the sites that produced a value (readouts, captures);
    the caller decides what to ``nnsight.save``.
    """
    results: list[dict[int, Any]] = [{} for _ in templates]
    layers = sorted({layer for t in templates for layer in t.layers()})
    for layer in layers:
        for site in ("at_attention_call", "at_output_projection", "at_mlp_output"):
            for index, template in enumerate(templates):
                if layer in template.layers() and hasattr(template, site):
                    value = getattr(template, site)(model, layer)
                    if value is not None:
                        results[index][layer] = value
    return results
