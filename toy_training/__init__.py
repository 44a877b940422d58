"""The toy models' trainer: dev tooling at the repository root, not shipped in the wheel.

``python -m toy_training.train`` / ``.recipe`` / ``.regime`` from the repository root (see docs/toy-models.md).
The shipped library keeps what it uses at run time in ``vrh_interp.toy`` (``load``, the checkpoints, the
configs that loading needs, the planted heads' declaration) and never imports this package.
"""
