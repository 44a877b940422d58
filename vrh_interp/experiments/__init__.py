"""Experiment runners: the causal k-sweep, the VQA sweep, the design space, cross-model transfer, the patching study,
merge of sharded runs."""
