"""What the model is: typed heads and the head grid (``heads``), boxes (``boxes``), the family adapters that
know each architecture's visual layout, prompt and box format (``families``), the model handle and its loading
(``model``, ``model_source``), the head lists the paper and others published with their data files (``published``),
the mapping of heads between two grids (``head_mapping``) and the tiny random-weight models of every family
(``tiny``). Nothing here runs an intervention: the handle knows the execution backends by name only
(``execution.backends.BACKENDS``), and a described family probes the attention readout once to learn a layout.
"""
