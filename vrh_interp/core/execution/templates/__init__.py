"""nnsight trace templates: reusable interventions on the language backbone's attention heads.

Each template is a small frozen dataclass of plain data (module paths, head indices, positions) with
methods that act on an nnsight model envoy INSIDE a trace. Holding no model and no vrh_interp handle,
a template pickles by value into a remote (NDIF) request, and it works inside a user's own
``model.trace(...)`` / ``model.generate(...)`` exactly as inside our one-call helpers.

nnsight requires requests in execution order, so several templates at once are applied layer by layer,
and inside a layer by site: first the attention call's inputs (readout), then the output projection's
input (capture, ablation, patching), then (optional site) the MLP's output. ``apply_in_order`` does that
for any mix of templates. Its result is positional (``values[0][3]``: the first template's value at layer 3)
and named (``values["L3H2"]``, ``values[0]["L3H2"]``: one head's slice, for templates whose values are per head;
``TemplateValues``), the way TransformerLens caches are keyed.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol, Sequence

from vrh_interp.core.description.heads import Head, names_one_head


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


class LayerValues(dict):
    """One template's values, ``{layer: value}``, also read by head: ``values["L3H2"]`` (or ``Head(3, 2)``,
    ``(3, 2)``) is that head's slice of layer 3's value, for a template with ``head_value`` (readouts: ``[batch,
    rows, keys]``; captures: ``[batch, seq, head_dim]``). An int key is a layer, as on a plain dict."""

    def __init__(self, values: Iterable[tuple[int, Any]] | Mapping[int, Any] = (), template: Any = None) -> None:
        dict.__init__(self, values)  # not super(): nnsight re-runs this source remotely, with no __class__ cell
        self.template = template

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (str, Head, tuple)) and names_one_head(key):
            head = Head.coerce(key)
            at = getattr(self.template, "head_value", None)
            if at is None:
                raise KeyError(f"{head}: the values of {type(self.template).__name__} are not per head; index them "
                               "by layer")
            if head.layer not in self:
                raise KeyError(f"{head}: no value at layer {head.layer} (layers: {sorted(dict.keys(self))})")
            return at(dict.__getitem__(self, head.layer), head)
        return dict.__getitem__(self, key)

    def heads(self) -> list[str]:
        """The heads this template's values can be read by (``values[name]``), layer by layer."""
        names = getattr(self.template, "head_names", None)
        return [str(h) for h in names(dict(self))] if names is not None else []

    def __reduce__(self) -> Any:  # pickles (remote results, saved values) with its template
        return (LayerValues, (dict(self), self.template))


class TemplateValues(list):
    """What ``apply_in_order`` returns: per template, its ``LayerValues`` (``values[0]``, positional as before),
    and by head across templates: ``values["L3H2"]`` is that head's slice from the one template that read it
    (several did: ``values[i]["L3H2"]`` picks one)."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (str, Head, tuple)) and names_one_head(key):
            head = Head.coerce(key)
            found = [i for i, values in enumerate(self) if str(head) in values.heads()]
            if len(found) != 1:
                where = f"templates {found} all read it: use values[{found[0]}][{str(head)!r}]" if found else \
                    "no template read it"
                raise KeyError(f"{head}: {where}")
            return list.__getitem__(self, found[0])[head]
        return list.__getitem__(self, key)


def apply_in_order(model: Any, templates: Sequence[LayerTemplate]) -> TemplateValues:
    """Apply every template at its layers, in the order a forward pass reaches each site.

    Returns, per template, ``{layer: value}`` for the sites that produced a value (readouts, captures), read by
    position or by head name (``TemplateValues``); the caller decides what to ``nnsight.save``.
    """
    results = TemplateValues(LayerValues(template=template) for template in templates)
    layers = sorted({layer for t in templates for layer in t.layers()})
    for layer in layers:
        for site in ("at_attention_call", "at_output_projection", "at_mlp_output"):
            for index, template in enumerate(templates):
                if layer in template.layers() and hasattr(template, site):
                    value = getattr(template, site)(model, layer)
                    if value is not None:
                        dict.__setitem__(list.__getitem__(results, index), layer, value)
    return results
