"""Root of the test tree: pytest puts this directory on sys.path, so the shared helpers under
support/ import as `support.NAME` from every test directory."""

from __future__ import annotations

import atexit
import gc
import os

import pytest

# Each pytest process (xdist's workers) leaves as `lockstep` does (`cli.console`): its heap
# frozen after every other atexit callback, so Python's last collection does not walk torch,
# DeepSpeed and every test module once more (about 1 CPU-s a process, at the tier's end).
atexit.register(gc.freeze)


@pytest.fixture(scope="session", autouse=True)
def forkserver():
    """Start this pytest process's forkserver once, with everything the tier's ranks import
    (otherwise the first test to need it decides what it preloads, the plugin's pools only
    torch): `lockstep.launch.forkserver_context`. The modules are the trainer's, every
    engine's (DeepSpeed only on a machine without GPUs: its import probes for CUDA otherwise,
    which a forked rank could not then use), the default preset's and transformers' Trainer
    (examples/train_hf_trainer.py)."""
    import torch

    from lockstep.launch import forkserver_context
    from lockstep.train.config import ModelConfig
    from lockstep.train.engines import ENGINES, engine_modules
    from lockstep.train.model import model_modules

    gpu = torch.cuda.is_available()
    engines = [e for e, spec in ENGINES.items() if not (gpu and "deepspeed" in spec.requires)]
    modules = ["lockstep.train.trainer", "lockstep.checks.harness", "transformers.trainer"]
    modules += [m for e in engines for m in engine_modules(e)] + model_modules(ModelConfig())
    saved = dict(os.environ)
    if not gpu:
        os.environ["DS_ACCELERATOR"] = "cpu"  # the server's own environment only
    try:
        forkserver_context(list(dict.fromkeys(modules)))
    finally:
        os.environ.clear()
        os.environ.update(saved)


# Modules holding the CPU tier's longest single tests (15-37 s each, docs/benchmarks.md), and
# those of several 5-10 s tests that collection order puts last, first: pytest-xdist deals
# tests out in collection order, and what is dealt last runs on one worker while the others
# sit idle. The harness checks, the 8-rank resume and the engines come before the launches by
# hand: for the first 90 s two workers run WAITING's queues (about 0.6 of a core between them),
# and the third keeps the cores busy only with tests whose two or more ranks train at once;
# the launches (a launcher, then its ranks, then the next command) used about one core there,
# and the cores idled 57-69 core-s a run instead of 42-46 (docs/benchmarks.md). tests/preflight
# sorts near the end: its launches by hand and its forgeries go early all the same.
LONGEST_FIRST = (
    "test_harness_checks.py",
    "test_resume_eight_ranks.py",
    "test_train_engines.py",
    "test_planted_secrets.py",
    "test_gate_reference.py",
    "test_preflight_ranks.py",
    "test_distributed_marker.py",
    "test_preflight_signed.py",
    "test_leftovers.py",
)


# Tests whose wall is mostly waiting, not CPU: a run timed out on purpose (a planted hang, a
# missing rank) or a fixed sleep standing in for a GPU-bound step. Dealt out one by one, three of
# them sometimes waited at once while the two cores idled (a quarter of the time, 80-110 s into
# a run), so they run one after another. In one queue they took 170 s of a 185-s run, and with
# the 9 s before the first test that queue alone was as long as the 180 s the tier must keep
# within: no cut in CPU could shorten the run below it. Two queues of 80-95 s each start on
# workers of their own, and those workers then take the CPU-bound rest (docs/benchmarks.md).
WAITING = {
    "waiting for hangs to be named": (
        "tests/forensics/test_launch_kinds.py::",
        "tests/docker/test_docker_tier_py.py::test_wait_http_waits_for_a_server_and_gives_up_on_none",
    ),
    "waiting for timeouts and steps": (
        "tests/gate/test_gate_reference.py::",
        "tests/preflight/test_preflight_ranks.py::test_missing_ranks_exit_3_within_the_timeout",
        "tests/preflight/test_preflight_heartbeat.py::test_the_others_fail_on_a_stalled_rank_0_and",
        "tests/checks/test_script_checks.py::test_a_hung_run_is_killed_at_the_timeout_in_one_line",
        "tests/testing/test_distributed_marker.py::test_hang_shows_every_stack_and_kills_everything",
    ),
}

# Tests that read one launch of their module's (a module-scoped fixture): the ones of a module
# one unit of work, so that the launch runs once, on one worker.
SHARED = (
    "tests/testing/test_distributed_marker.py::test_passing_tests_share_a_warm_pool",
    "tests/testing/test_distributed_marker.py::test_failures_name_every_failing_rank",
    "tests/testing/test_distributed_marker.py::test_two_xdist_workers",
)


class WaitingApart:
    """Registered only where pytest-xdist is (its hook is unknown to pytest otherwise)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        """Under `--dist load` (xdist's default for -n): each of WAITING's queues one unit of
        work, handed out first (xdist orders units by size, and gives each worker one first),
        SHARED's tests of a module one unit, every other test a unit of its own in collection
        order. (xdist_group would say the same, but `--dist loadgroup` cannot rename node ids
        under pytest 9.2: its groups never form.) Other --dist modes keep xdist's."""
        if config.getvalue("dist") != "load":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                for queue, prefixes in WAITING.items():
                    if nodeid.startswith(prefixes):
                        return queue
                return nodeid.split("::")[0] if nodeid.startswith(SHARED) else nodeid

        return Scheduling(config, log)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(WaitingApart(), "lockstep-waiting-apart")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest in order
