"""Helpers the tests share, imported as `support.NAME` from every test directory (tests/ is on
sys.path: pytest puts the root conftest's folder there).

- `inprocess`: `lockstep.cli.main` inside the test process, as `python -m lockstep` runs it;
- `once`: a session fixture's work done once per test run, not once per pytest-xdist worker;
- `teardown_abort`: the rerun for gloo's known abort at interpreter exit;
- `script_check`: `lockstep check --script` run in-process, with its JSON results;
- `multinode_train`: `lockstep train` on the cluster bed and its comparisons (tests/cluster).
- `configs`: a quiet run's config section and `--set` overrides, `assert_passed`;
- `tiny`: a user's model and data factories that train in milliseconds (`TinyLM`).
- `planted`: the planted secrets, and the one preflight launch with them that two tests read.
"""
