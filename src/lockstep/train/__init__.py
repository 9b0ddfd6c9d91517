"""The reference training harness: config, model, data, engines, checkpoints, metrics.

Import the submodules; this package imports nothing heavy. Design: docs/design/train.md.
"""
