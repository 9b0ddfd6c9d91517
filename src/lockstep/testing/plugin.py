"""pytest plugin: run a test's body on several ranks, each with a real default process group.

Loaded through the ``pytest11`` entry point ``lockstep``; nothing to import or configure.

Marker
    ``@pytest.mark.distributed(world_size=2, gpus=False, timeout=None)`` runs the test
    function's body on ``world_size`` ranks (``distributed(4)`` works too). With
    ``gpus=False`` every rank uses gloo on CPU; with ``gpus=True`` every rank uses nccl and
    its own GPU (``cuda:<rank>``), and the test is skipped, with the reason, when fewer than
    ``world_size`` GPUs are visible. ``timeout`` (seconds) overrides ``lockstep_timeout``.
    A ``world_size`` given by ``pytest.mark.parametrize`` wins over the marker's.

Fixtures
    ``rank`` (int), ``world_size`` (int) and ``device`` (``torch.device``: ``cpu``, or
    ``cuda:<rank>`` with gpus) take each rank's own value. Any other argument of the test
    (parametrize values, ``tmp_path``, your own fixtures) is computed once in the pytest
    process and its value is pickled to every rank: ``tmp_path`` is therefore one directory
    shared by all ranks (use ``tmp_path / f"rank{rank}"`` for a private one). Fixtures that act
    on the pytest process itself (``monkeypatch``, ``capsys``, ``caplog``, ``request`` ...)
    are refused with an error; a fixture that runs *around* the test (autouse, or one that is
    not an argument) still runs in the pytest process, and the environment variables, working
    directory and ``sys.path`` it leaves are what every rank sees during the test.

Ini options
    ``lockstep_timeout`` (default 120): seconds a distributed test may run. On a timeout the
    test fails with every rank's Python stack (faulthandler), all rank processes and their
    children are killed, and the session goes on with a fresh pool.
    ``lockstep_start_timeout`` (default 120): seconds for a pool's ranks to start and meet.
    ``lockstep_reuse_pool`` (default true): false starts fresh ranks for every test.

How it runs
    Rank processes start the first time a world size and backend is needed, and serve
    every later test with the same world size and backend: gloo ranks are forked from a
    forkserver that imported torch (with ``torch._dynamo``) and ``torch.distributed`` once
    and never ran a torch op, so a rank starts in a fraction of a second and may still use
    CUDA itself; nccl ranks use the spawn start method (never fork). They meet through a
    FileStore in a per-pool temporary directory, so no port is fixed and pytest-xdist
    workers or concurrent sessions never collide (MASTER_ADDR and MASTER_PORT are still set,
    to a port the OS just handed out, for code that expects torchrun's variables). Before each test every rank takes the pytest process's
    environment (plus RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, and
    OMP_NUM_THREADS=1 unless set), working directory and ``sys.path``, then all ranks meet in
    a barrier. After each test a rank destroys the process groups the test created (and sets
    module globals holding them to None, or empties the dicts and lists holding them, so that
    libraries caching groups, like DeepSpeed, make new ones) and resets the RNG seeds (torch
    to a fresh process's seed, ``random`` and numpy from OS entropy), the default dtype, grad
    mode and deterministic-algorithms mode. A failure, a crash or a hang kills the pool; so
    does a test that destroys the default group (it then still passes). Idle pools of other
    world sizes stay warm up to 8 ranks in all (least recently used stopped first). Each
    rank's stdout and stderr during the test are reported in sections ``rank N output``.
    What ranks report (their output, tracebacks and messages) is redacted by
    ``lockstep.redact`` first, so secrets stay out of the terminal and of JUnit XML.

Failures
    An exception on any rank fails the test with that rank's number and traceback, all
    failing ranks listed; once one rank fails the others get 3 s to finish (they are usually
    stuck in a collective) before their stacks are taken and they are killed. A rank that dies
    is reported with its exit code or signal name. ``pytest.skip``/``pytest.xfail`` inside
    the body skip/xfail the test.

Limitations
    The body runs in rank processes: the test module is imported there by path with the
    pytest process's ``sys.path`` and pytest's assertion rewriting (a failed ``assert`` shows
    the values compared, not pytest's detailed diff), so module-level code runs once per
    rank too and module globals live as long as the pool. Plain test functions and
    methods of plain classes are supported (a fresh instance per rank and test, without
    setup_method); not unittest classes or async tests. Fixture values must be picklable.
    Library state outside the list above (e.g. DeepSpeed's global comm backend) survives
    from one test to the next on a warm pool; set ``lockstep_reuse_pool = false`` to rule
    that out. With several pytest-xdist workers, GPU tests of different workers share GPUs.
    If the pytest process is killed (SIGKILL), ranks die with it (PR_SET_PDEATHSIG) but
    processes the ranks started must notice it themselves. Ranks re-import the main module
    as multiprocessing does (spawn, forkserver), so a script that calls ``pytest.main()``
    needs an ``if __name__ == "__main__":`` guard.
    SIGUSR1 in a rank belongs to the plugin (it asks faulthandler for the stacks).
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
# Fixtures whose value acts on the pytest process: on a rank they would act on a copy.
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
    _seconds(config, "lockstep_timeout")  # a bad value stops the session before any test
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
    # What ranks report passes through `lockstep.redact` (to the terminal, and to JUnit XML).
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
    """This rank's number, 0 to world_size - 1 (a @pytest.mark.distributed test only)."""
    _require_marker(request, "rank")
    return -1  # each rank passes its own value to the test body


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> int:
    """How many ranks run this test (a @pytest.mark.distributed test only)."""
    _require_marker(request, "world_size")
    return _marker_args(request.node)[0]


@pytest.fixture
def device(request: pytest.FixtureRequest):
    """This rank's torch.device: cpu, or cuda:<rank> with gpus=True."""
    _require_marker(request, "device")
    return None  # each rank passes its own value to the test body


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
    """What the ranks need to run `item`: where its function lives and its argument values."""
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
