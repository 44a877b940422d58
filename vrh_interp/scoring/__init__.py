"""Head scoring over the paper's design space (``design``), its statistics collected in one pass per sample
(``collect``, ``aggregate``), ``detect.score_heads``, the ``HeadScores`` table (``scores``), analyses of the
design space, sparsity and stability (``analysis``) and grading against known heads (``grading``)."""
