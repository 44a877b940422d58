"""Activation patching: what Visual Retrieval Heads read out and write (the paper's open question).

``pairs``: exact clean/corrupted grounding pairs from the synthetic scenes. ``batch``: the pair batch and
the logit-difference metric. ``head_patching``: patch head outputs clean -> corrupted (each head exactly,
or a set; effect on the logit difference and on the generated box). ``attribution``: gradient x
difference estimates of the same, for speed. ``positions``: key/value patching of one head at the visual
tokens of a region. ``mediation``: direct vs total effect. ``probes``: linear read-out probes.
"""
