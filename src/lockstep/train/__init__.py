"""Reference training harness: config, model, data, engines, checkpoints, metrics."""
