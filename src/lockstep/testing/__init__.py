"""The pytest plugin for multi-rank tests (loaded through the `pytest11` entry point)."""
