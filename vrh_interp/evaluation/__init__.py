"""Causal validation: greedy grounding under head masking, controls, statistics."""
