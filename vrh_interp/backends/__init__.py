"""Alternative execution backends behind the interface of ``vrh_interp.interventions`` (nnsight).

``transformer_lens``: ``TransformerLensBackend``, the same head operations through a TransformerLens 4.3
``TransformerBridge`` built in memory from a ``VLM``. Imported explicitly (it pulls in transformer_lens).
"""
