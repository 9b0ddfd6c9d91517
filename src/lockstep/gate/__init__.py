"""Regression gates: golden metric baselines keyed by environment."""
