"""Execution backends: the seam the pipelines run through (``backends.base``: ``Backend``; ``backends.select``:
``backend_for(vlm)``, the backend a model handle's placement names, ``vlm.on(backend=...)``).

``nnsight`` (``NnsightBackend``, the default): ``vrh_interp.core.execution.interventions``' trace templates.
``transformer-lens``: ``backends.transformer_lens.TransformerLensBackend``, the same head operations through a
TransformerLens 4.3 ``TransformerBridge`` built in memory from a ``VLM`` (imported when asked for: it pulls in
transformer_lens). docs/recipes/transformer-lens.md says what runs where and within which tolerances.
"""

# the names ``Placement`` / ``VLM.on`` and ``--backend`` accept; ``core.description.model`` imports this module (it
# imports nothing)
BACKENDS: tuple[str, ...] = ("nnsight", "transformer-lens")
# the backends whose handles run nnsight traces (``core.execution.interventions``' runners, the patching study's
# templates, probes, overlays): a handle placed on another backend is refused there (``VLM.runs_nnsight_traces``)
NNSIGHT_TRACES: frozenset[str] = frozenset({"nnsight"})
