"""Figures (matplotlib, imported lazily) and attention overlays."""
