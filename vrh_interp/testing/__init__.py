"""Tiny random-weight VLMs built offline from configs, for tests, benchmarks and recipes."""
