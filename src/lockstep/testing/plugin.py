"""pytest plugin: run a test's body on several ranks, each with a real default process group
(`@pytest.mark.distributed`). Manual: docs/pytest-plugin.md; design: docs/design/pytest-plugin.md.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys

import pytest

from lockstep.errors import LockstepError
from lockstep.redact import scrub_text
from lockstep.testing.pool import Pools
from lockstep.testing.worker import PASSED, SKIPPED, XFAILED, Task

RANK_FIXTURES = ("rank", "world_size", "device")
# Their values act on the pytest process; on a rank, on a copy.
PROCESS_BOUND_FIXTURES = frozenset(
    {
        "request",
        "monkeypatch",
        "capsys",
        "capsysbinary",
        "capfd",
        "capfdbinary",
        "caplog",
        "recwarn",
        "pytestconfig",
        "pytester",
        "testdir",
        "record_property",
        "record_testsuite_property",
        "record_xml_attribute",
    }
)
_pools_key = pytest.StashKey[Pools]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "lockstep_timeout", "seconds a distributed test may run (default 120)", default="120"
    )
    parser.addini(
        "lockstep_start_timeout",
        "seconds for a pool of ranks to start and meet (default 120)",
        default="120",
    )
    parser.addini(
        "lockstep_reuse_pool",
        "reuse rank processes across tests (default true)",
        type="bool",
        default=True,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "distributed(world_size=2, gpus=False, timeout=None): run the test body on world_size "
        "ranks with an initialised default process group (lockstep)",
    )
    _seconds(config, "lockstep_timeout")  # a bad value stops the session at once
    config.stash[_pools_key] = Pools(
        start_timeout=_seconds(config, "lockstep_start_timeout"),
        reuse=config.getini("lockstep_reuse_pool"),
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    pools = config.stash.get(_pools_key, None)
    if pools is not None:
        pools.close()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("distributed")
    if marker is None:
        return
    world_size, gpus, _ = _marker_args(item)
    if gpus:
        import torch

        found = torch.cuda.device_count()
        if found < world_size:
            reason = f"needs {world_size} GPUs (gpus=True), found {found}"
            raise pytest.skip.Exception(reason, _use_item_location=True)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker("distributed") is None:
        return None
    world_size, gpus, timeout = _marker_args(pyfuncitem)
    pools = pyfuncitem.config.stash[_pools_key]
    try:
        outcomes = pools.run(world_size, "nccl" if gpus else "gloo", _task(pyfuncitem), timeout)
    except LockstepError as exc:
        pytest.fail(scrub_text(str(exc)), pytrace=False)
    capture = pyfuncitem.config.getoption("capture", "fd") != "no"
    # redacted before the terminal and JUnit XML see it
    outcomes = [
        dataclasses.replace(o, output=scrub_text(o.output), message=scrub_text(o.message))
        for o in outcomes
    ]
    for outcome in outcomes:
        if not outcome.output:
            continue
        if capture:
            pyfuncitem.add_report_section("call", f"rank {outcome.rank} output", outcome.output)
        else:
            sys.stdout.write(f"--- rank {outcome.rank} output ---\n{outcome.output}")
    bad = [o for o in outcomes if o.status not in (PASSED, SKIPPED, XFAILED)]
    if bad:
        header = f"{len(bad)} of {world_size} ranks failed: " + ", ".join(
            f"rank {o.rank} {o.status}" for o in bad
        )
        details = [f"----- rank {o.rank} {o.status} -----\n{o.message.rstrip()}" for o in bad]
        pytest.fail("\n".join([header, *details]), pytrace=False)
    reasons = sorted({o.message for o in outcomes if o.status == XFAILED})
    if reasons:
        pytest.xfail("; ".join(reasons))
    reasons = sorted({o.message for o in outcomes if o.status == SKIPPED})
    if reasons:
        raise pytest.skip.Exception("; ".join(reasons), _use_item_location=True)
    return True


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> int:
    """This rank's number, 0 to world_size - 1."""
    _require_marker(request, "rank")
    return -1  # each rank passes its own value


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> int:
    """How many ranks run this test."""
    _require_marker(request, "world_size")
    return _marker_args(request.node)[0]


@pytest.fixture
def device(request: pytest.FixtureRequest):
    """This rank's torch.device: cpu, or cuda:<rank> with gpus=True."""
    _require_marker(request, "device")
    return None  # each rank passes its own value


def _require_marker(request: pytest.FixtureRequest, name: str) -> None:
    if request.node.get_closest_marker("distributed") is None:
        pytest.fail(
            f"fixture '{name}' needs @pytest.mark.distributed(world_size=N) "
            f"on {request.node.nodeid}",
            pytrace=False,
        )


def _marker_args(item: pytest.Item) -> tuple[int, bool, float]:
    """(world_size, gpus, timeout) of a distributed test, checked."""
    marker = item.get_closest_marker("distributed")
    kwargs = dict(marker.kwargs)
    if marker.args:
        kwargs.setdefault("world_size", marker.args[0])
    unknown = sorted(set(kwargs) - {"world_size", "gpus", "timeout"})
    if unknown or len(marker.args) > 1:
        _usage(item, f"unknown arguments {unknown or list(marker.args[1:])}")
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "world_size" in callspec.params:
        kwargs["world_size"] = callspec.params["world_size"]
    world_size = kwargs.get("world_size", 2)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        _usage(item, f"world_size must be a positive int, got {world_size!r}")
    timeout = kwargs.get("timeout")
    if timeout is None:
        timeout = _seconds(item.config, "lockstep_timeout")
    elif isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        _usage(item, f"timeout must be a positive number of seconds, got {timeout!r}")
    return world_size, bool(kwargs.get("gpus", False)), float(timeout)


def _usage(item: pytest.Item, problem: str) -> None:
    pytest.fail(f"@pytest.mark.distributed on {item.nodeid}: {problem}", pytrace=False)


def _seconds(config: pytest.Config, name: str) -> float:
    value = config.getini(name)
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise pytest.UsageError(f"ini option {name} must be a positive number, got {value!r}")
    return seconds


def _task(item: pytest.Function) -> Task:
    """What the ranks need to run `item`."""
    argnames = tuple(item._fixtureinfo.argnames)
    kwargs = {}
    for name in argnames:
        if name in RANK_FIXTURES:
            continue
        if name in PROCESS_BOUND_FIXTURES:
            pytest.fail(
                f"{item.nodeid}: fixture '{name}' acts on the pytest process and cannot be "
                "used by a distributed test's body; use it in a fixture around the test",
                pytrace=False,
            )
        kwargs[name] = item.funcargs[name]
    try:
        payload = pickle.dumps(kwargs)
    except Exception as exc:
        pytest.fail(
            f"{item.nodeid}: the arguments of a distributed test are sent to the ranks "
            f"by pickle, and one cannot be pickled: {exc}; build it inside the test body",
            pytrace=False,
        )
    return Task(
        module_name=item.module.__name__,
        module_path=item.module.__file__,
        class_name=item.cls.__qualname__ if item.cls is not None else None,
        function_name=item.originalname,
        argnames=argnames,
        kwargs=payload,
        env=dict(os.environ),
        cwd=os.getcwd(),
        sys_path=list(sys.path),
    )
