"""Reference training harness: config, model, data, engines, checkpoints, metrics.

Public API (import the submodules; this package imports nothing heavy):
    config.load_config(path, overrides) / config.from_dict(data) -> RunConfig
    config.require_config(what, cfg): the extras a run config needs, named before any rank starts
    trainer.run_training(cfg, out_dir, stop_at=None, capture_state=False) -> TrainResult
    trainer.Trainer(cfg, out_dir): train(), train_step(), save(), engine, stream, close()
    engines.Engine: step(), full_parameters(), full_optimizer_state(), lr(), save(), load()
    engine_table.ENGINES: the engine table (an EngineSpec per engine); engine_table.register(spec)
    checkpoint.find / verify / check_compatible;  metrics.StepMetrics (read back with lockstep.track.read)
    deepspeed_config.generate / problems
"""
