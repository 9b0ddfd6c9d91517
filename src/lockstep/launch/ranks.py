"""The launch functions: ranks started through torchrun's launcher API in this process, as
`torchrun --standalone` does. Design: docs/design/launch.md
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import MutableMapping
from pathlib import Path

from lockstep.launch.cleanup import (
    dying_with_parent,
    end_group,
    keeping_session,
    killer,
    launch_scope,
    spawned_rank,
)
from lockstep.launch.forkserver import Launcher, in_environ, run_script, start_forkserver

# `-P`: a `lockstep/` planted in a shared working folder is never what runs (users' scripts keep
# Python's usual path: they import their sibling files)
OWN_MODULE = ("-P", "-m", "lockstep")


def rank_environment(
    device: str | None, nproc: int | None = None, env: MutableMapping[str, str] | None = None
) -> None:
    """Set in `env` (default os.environ) what ranks need before torch and DeepSpeed start."""
    env = os.environ if env is None else env
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    if nproc:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))


def free_port() -> int:
    """A port the OS has just handed out on the loopback (for MASTER_PORT)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def standalone_config(nproc: int, name: str, **overrides):
    """A LaunchConfig for `nproc` local ranks (`logs_specs`: `cleanup.launch_scope()`'s)."""
    from torch.distributed.launcher.api import LaunchConfig

    fields = {
        "min_nodes": 1,
        "max_nodes": 1,
        "nproc_per_node": nproc,
        "run_id": f"lockstep-{name}-{uuid.uuid4().hex[:8]}",
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:0",
        "max_restarts": 0,
        "monitor_interval": 0.1,
    }
    fields.update(overrides)
    return LaunchConfig(**fields)


def _expiry(forensics: Path | None, nproc: int):
    """A launch's timeout: `expire()` asks for dumps, then kills until `ended` (a busy
    forkserver may fork a rank late)."""
    import threading

    expired, kill, ended = [], killer(), threading.Event()

    def expire():
        expired.append(True)
        if forensics is not None:
            from lockstep.forensics import collect

            collect.request(forensics, nproc)
        while not ended.is_set():
            kill()
            ended.wait(0.2)

    return expired, kill, ended, expire


def run_local(fn, args: tuple, nproc: int, name: str, device: str, preload=(), *,
              timeout: float | None = None, forensics: Path | None = None,
              **overrides):  # fmt: skip
    """Run `fn(*args)` on `nproc` local ranks for `device`; rank 0's return value (a returned
    LockstepError is raised). `preload`: the CPU forkserver's; `forensics`: a dump folder."""
    import threading

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import EXIT_FAIL, LockstepError, RankTimeout
    from lockstep.forensics import recorder
    from lockstep.redact import scrubbed_logger

    rank_environment(device, nproc)
    env = dict(os.environ)
    if forensics is not None:
        from lockstep.forensics import collect, hang

        hang.clear(forensics)
        env = collect.environ(env, forensics, site=False)  # the ranks install it (`recorder.run`)
    if device == "cpu":
        server = start_forkserver(preload)  # before `killer`: it stays
        entry, args = in_environ, (Launcher(server, env), fn, *args)
        overrides["start_method"] = "forkserver"
    else:
        entry, args = spawned_rank, (os.getpid(), recorder.run, fn, *args)
        overrides["start_method"] = "spawn"
    expired, kill, ended, expire = _expiry(forensics, nproc)

    def report(crashed: bool = False) -> str:
        if forensics is None:
            return ""
        return hang.summary(forensics, world=nproc, findings_only=crashed)

    timer = threading.Timer(timeout, expire) if timeout else None
    try:
        with launch_scope() as logs, scrubbed_logger(), _environ(env):
            config = standalone_config(nproc, name, logs_specs=logs, **overrides)
            if timer is not None:
                timer.daemon = True
                timer.start()
            results = elastic_launch(config, entry)(*args)
    except ChildFailedError as exc:
        ended.set()  # the ranks are gone: the expiry's kills stop before the reader starts
        if timer is not None:
            timer.cancel()
            timer.join()
        if expired:
            raise RankTimeout(
                f"{nproc} {name} ranks did not finish within {timeout:g} s and were killed "
                f"(--timeout){report()}"
            ) from None
        rank, failure = exc.get_first_failure()
        raise LockstepError(
            f"rank {rank} failed with exit code {failure.exitcode}; its traceback is above"
            f"{report(crashed=True)}",
            EXIT_FAIL,
        ) from None
    except BaseException:
        kill()  # interrupted: whatever a rank started too
        raise
    finally:
        ended.set()
        if timer is not None:
            timer.cancel()
        if forensics is not None and forensics.is_dir():
            collect.scrub(forensics)
    for rank in sorted(results):
        if isinstance(results[rank], LockstepError):
            raise results[rank]
    return results[0]


@contextlib.contextmanager
def _environ(env: dict):
    """While inside: this process's environment is `env`, for spawned ranks to inherit."""
    saved = dict(os.environ)
    if env == saved:
        yield
        return
    try:
        os.environ.clear()
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_local_cli(nproc: int, argv: list[str], forensics: Path | None = None) -> int:
    """Run `python -m lockstep *argv` on `nproc` local ranks; the exit code they agree on, or
    EXIT_TIMEOUT when a rank was killed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import EXIT_FAIL, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE

    # the agent's lines repeat rank 0's
    agent = logging.getLogger("torch.distributed.elastic")
    level = agent.level
    agent.setLevel(logging.CRITICAL)
    program, args = dying_with_parent(sys.executable, [*OWN_MODULE, *argv])
    env = dict(os.environ)
    if forensics is not None:
        from lockstep.forensics import collect, hang

        hang.clear(forensics)
        env = collect.environ(env, forensics)  # new interpreters: `forensics/site/`
    code = EXIT_OK
    try:
        with launch_scope() as logs, _environ(env):
            elastic_launch(standalone_config(nproc, argv[0], logs_specs=logs), program)(*args)
    except ChildFailedError as err:
        codes = {f.exitcode for f in err.failures.values()}
        code = max(codes) if codes <= {EXIT_FAIL, EXIT_USAGE, EXIT_TIMEOUT} else EXIT_TIMEOUT
    finally:
        agent.setLevel(level)  # a later launch reports its ranks' failures
        if forensics is not None and forensics.is_dir():
            collect.scrub(forensics)
    if code == EXIT_TIMEOUT and forensics is not None:
        found = hang.summary(forensics, world=nproc)
        if found:
            print(f"lockstep: {argv[0]} timed out{found}", file=sys.stderr, flush=True)
    return code


def multinode_config(
    nnodes: int,
    nproc_per_node: int,
    endpoint: str,
    run_id: str,
    *,
    is_host: bool,
    join_timeout: float,
    **overrides,
):
    """A LaunchConfig for one node of `nnodes`; `is_host`: this node serves the store."""
    fields = {
        "min_nodes": nnodes,
        "max_nodes": nnodes,
        "nproc_per_node": nproc_per_node,
        "run_id": run_id,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": endpoint,
        "rdzv_configs": {"join_timeout": int(join_timeout) + 1, "is_host": is_host},
        "max_restarts": 0,
        "monitor_interval": 0.1,
    }
    fields.update(overrides)
    return standalone_config(nproc_per_node, "preflight", **fields)


def run_multinode_cli(
    *,
    nnodes: int,
    nproc_per_node: int,
    endpoint: str,
    run_id: str,
    node_rank: int,
    join_timeout: float,
    argv: list[str],
) -> int:
    """`run_local_cli` for one node of a multi-node job, after a rendezvous at `endpoint`."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import EXIT_FAIL, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, RankTimeout

    agent = logging.getLogger("torch.distributed.elastic")
    level = agent.level
    agent.setLevel(logging.CRITICAL)
    program, args = dying_with_parent(sys.executable, [*OWN_MODULE, *argv])
    try:
        with launch_scope() as logs:
            config = multinode_config(
                nnodes,
                nproc_per_node,
                endpoint,
                run_id,
                is_host=node_rank == 0,
                join_timeout=join_timeout,
                logs_specs=logs,
            )
            elastic_launch(config, program)(*args)
    except ChildFailedError as err:
        codes = {f.exitcode for f in err.failures.values()}
        return max(codes) if codes <= {EXIT_FAIL, EXIT_USAGE, EXIT_TIMEOUT} else EXIT_TIMEOUT
    except RendezvousError as err:
        raise RankTimeout(
            f"node {node_rank}: torchrun's rendezvous at {endpoint} failed after a clean "
            f"check-in: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}"
        ) from None
    finally:
        agent.setLevel(level)
    return EXIT_OK


def _program(argv: list[str]) -> tuple[str, list[str]]:
    """torchrun's entrypoint for `argv`: Python unbuffered, as torchrun runs it, or a program."""
    if argv[:2] == ["-m", "lockstep"]:
        return sys.executable, ["-u", "-P", *argv]
    if argv[0].endswith(".py") or argv[0] == "-m":
        return sys.executable, ["-u", *argv]
    return argv[0], argv[1:]


@contextlib.contextmanager
def _job_process(env: dict, cwd: Path | None, log):
    """While inside: the job's environment and folder, stdout and stderr into `log`."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    sys.stdout.flush(), sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    try:
        os.environ.clear()
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        for fd, saved in zip((1, 2), saved_fds, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def run_command(argv: list[str], nproc: int, log: Path, *, env: dict, timeout: float,
                cwd: Path | None = None, watch=None, run_path: bool = False,
                forensics: Path | None = None) -> int | None:  # fmt: skip
    """Run `argv` on `nproc` local ranks, output redacted into `log`; the first failed rank's
    exit code, 0, or None past `timeout`. `run_path`: as `torchrun --run-path`."""
    import threading

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from lockstep.errors import UsageError
    from lockstep.redact import scrubbed_log, scrubbed_logger

    if run_path:
        if not (argv[0].endswith(".py") or argv[0] == "-m"):
            raise UsageError(f"--run-path runs a Python script (script.py ...), not {argv[0]!r}")
        server = start_forkserver()  # before killer: it stays
        program = in_environ
        args = [Launcher(server, env), run_script, str(log), str(cwd or os.getcwd()), *argv]
        start = {"start_method": "forkserver"}
    else:
        program, args = dying_with_parent(*_program(argv))
        start = {}
    if forensics is not None:
        from lockstep.forensics import collect

        env = collect.environ(env, forensics)
        if run_path:
            args[0] = Launcher(server, env)
    expired, kill, ended, expire = _expiry(forensics, nproc)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    watching = watch(os.getpid()) if watch else contextlib.nullcontext()
    with scrubbed_log(log) as out, launch_scope() as logs, _job_process(env, cwd, out), \
            scrubbed_logger(), watching:  # fmt: skip
        config = standalone_config(nproc, "script", logs_specs=logs, **start)
        timer.start()
        try:
            elastic_launch(config, program)(*args)
            code = 0
        except ChildFailedError as err:
            out.write(f"{err.format_msg()}\n".encode())  # as torchrun prints it
            out.flush()
            code = err.get_first_failure()[1].exitcode or 1
        except BaseException:
            kill()  # interrupted: whatever a rank started too
            raise
        finally:
            ended.set()
            timer.cancel()
            if forensics is not None and forensics.is_dir():
                collect.scrub(forensics)
    return None if expired else code


def run_launcher(command: list[str], log: Path, *, env: dict, timeout: float,
                 cwd: Path | None = None, watch=None) -> int | None:  # fmt: skip
    """Run a launcher command in its own process group, which ends with this process, output
    redacted into `log`; its exit code, or None past `timeout`."""
    from lockstep.redact import scrubbed_log

    command = keeping_session(command)
    with scrubbed_log(log) as out:  # the job's own output may quote a secret
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd, start_new_session=True)  # fmt: skip
        try:
            with watch(proc.pid) if watch else contextlib.nullcontext():
                try:
                    return proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    end_group(proc, grace=0)
                    return None
        except BaseException:
            end_group(proc, grace=10)
            raise
