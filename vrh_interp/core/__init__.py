"""Building blocks, in three parts a reader sees apart: ``description`` (what the model is: heads, boxes,
families, the model handle, published head lists), ``execution`` (running things on it: trace templates,
interventions, backends, ablation kinds, remote timeouts, input limits) and ``bookkeeping`` (run records: run
folders, provenance, shards, option paths). ``_display`` (the compact cards results print) serves all three and
the layers above. Imports nothing above it."""
