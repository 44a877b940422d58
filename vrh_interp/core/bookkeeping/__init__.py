"""Run records: the run folder with its manifest, record logs, lock and atomic writes (``runs``), what a run
records about its model, libraries and remote service (``provenance``), the shards of a run and what each records
(``shards``) and the checks of the paths an option names, run folders included, before any work (``paths``).
Nothing here runs the model.
"""
