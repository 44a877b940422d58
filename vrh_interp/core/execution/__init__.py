"""Running things on the model: the trace templates (``templates``: ablation, head-output capture and patching,
attention readout, redirection), the interventions built from them (``interventions``), the backends they run
through (``backends``: nnsight, TransformerLens), the ablation kinds every layer names (``ablation_kinds``), the
layers shared between the conditions of one pass (``layer_sharing``), the timeouts of remote (NDIF) runs
(``remote``) and the check, before anything runs, that a prompt and its answer fit the model's context
(``limits``).
"""
