"""One rank process of the warm pool: runs the test bodies the pytest process sends, and puts
back what each test changed. No torch at import: the pytest process imports it too.
"""

from __future__ import annotations

import ast
import ctypes
import faulthandler
import importlib.machinery
import importlib.util
import os
import pickle
import random
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from lockstep import compat

# to a hung rank: faulthandler answers with every thread's stack
STACKS_SIGNAL = signal.SIGUSR1
PASSED, FAILED, SKIPPED, XFAILED = "passed", "failed", "skipped", "xfailed"


@dataclass(frozen=True)
class Task:
    """One test body for every rank, with the pytest process's context."""

    module_name: str
    module_path: str
    class_name: str | None  # qualified, or None for a plain function
    function_name: str
    argnames: tuple[str, ...]
    kwargs: bytes  # pickled fixture values
    env: dict[str, str]
    cwd: str
    sys_path: list[str]


@dataclass(frozen=True)
class Outcome:
    """What one rank reports for one test."""

    rank: int
    status: str  # passed | failed | skipped | xfailed (the pool adds died | hung)
    message: str = ""  # the traceback, or the reason of a skip
    pool_intact: bool = True  # False once the default group is gone
    output: str = ""  # stdout and stderr during the test, from the pool


def log_path(pool_dir: Path, rank: int) -> Path:
    return pool_dir / f"rank{rank}.log"


def fr_path(pool_dir: Path) -> Path:
    """The folder of the ranks' flight-recorder dumps."""
    return pool_dir / "flight-recorder"


def stacks_path(pool_dir: Path, rank: int) -> Path:
    return pool_dir / f"rank{rank}.stacks"


def main(conn, rank: int, world_size: int, backend: str, pool_dir: str, env: dict,
         parent_pid: int, parent_env: dict):  # fmt: skip
    """A rank process; `env` (its launcher variables) outlives each test's environment, and
    `parent_env` is the pytest process's (not the forkserver's)."""
    _die_with_parent(parent_pid)
    os.setsid()  # the pool kills the rank and its children together
    pool = Path(pool_dir)
    _redirect_output(log_path(pool, rank))
    stacks = open(stacks_path(pool, rank), "w")  # noqa: SIM115 - lives as long as the rank
    faulthandler.enable(stacks, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, stacks, all_threads=True, chain=False)
    os.environ.clear()
    os.environ.update(parent_env)
    os.environ.update(env)
    from lockstep.forensics import recorder

    fr_path(pool).mkdir(exist_ok=True)
    recorder.install(str(fr_path(pool)))  # the pool asks for the dumps on a hang
    try:
        state = _Rank(rank, world_size, backend, pool, env)
    except BaseException:
        conn.send(traceback.format_exc())
        return
    conn.send(None)  # ready
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the pytest process closed the pool
            return
        conn.send(state.run(task))


def _die_with_parent(pytest_pid: int) -> None:
    """End this rank when the pytest process ends, even by SIGKILL (a forked rank's parent,
    the forkserver, outlives it)."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    else:
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    if os.getppid() != pytest_pid:  # forked
        from lockstep.launch import die_with

        die_with(pytest_pid)


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _redirect_output(path: Path) -> None:
    """Send fd 1 and 2 to `path`: each test's output apart."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class _Rank:
    """A rank's process group and the state it restores after every test."""

    def __init__(self, rank: int, world_size: int, backend: str, pool_dir: Path, env: dict):
        import torch
        import torch.distributed as dist

        self.rank, self.world_size, self.pool_dir, self.env = rank, world_size, pool_dir, env
        if backend == "nccl":
            self.device = torch.device("cuda", rank)
            torch.cuda.set_device(self.device)
            device_id = self.device
        else:
            self.device = torch.device("cpu")
            device_id = None
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:  # forked: torch read it at import
            torch.set_num_threads(int(threads))
        store = dist.FileStore(str(pool_dir / "store"), world_size)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, device_id=device_id
        )
        dist.barrier()
        self.group = compat.default_group()
        self.seed = torch.initial_seed()
        self.dtype = torch.get_default_dtype()
        self.deterministic = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )

    def run(self, task: Task) -> Outcome:
        import torch.distributed as dist

        _redirect_output(log_path(self.pool_dir, self.rank))
        os.environ.clear()
        os.environ.update(task.env)
        os.environ.update(self.env)
        sys.path[:] = task.sys_path
        try:
            os.chdir(task.cwd)
            test = _resolve(task)
            kwargs = pickle.loads(task.kwargs)
            given = {"rank": self.rank, "world_size": self.world_size, "device": self.device}
            kwargs.update({k: v for k, v in given.items() if k in task.argnames})
            dist.barrier()  # every rank starts the body together
            test(**kwargs)
            status, message = PASSED, ""
        except pytest.skip.Exception as exc:
            status, message = SKIPPED, exc.msg or ""
        except pytest.xfail.Exception as exc:
            status, message = XFAILED, exc.msg or ""
        except pytest.fail.Exception as exc:
            status, message = FAILED, exc.msg or ""
        except BaseException as exc:
            tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # drop this frame
            status, message = FAILED, "".join(traceback.format_exception(type(exc), exc, tb))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        try:
            intact = self._reset()
        except Exception:  # a state we cannot undo: the pool is replaced
            traceback.print_exc()
            intact = False
        return Outcome(self.rank, status, message, pool_intact=intact)

    def _reset(self) -> bool:
        """Undo what the test changed; False when the default group is gone."""
        import torch
        import torch.distributed as dist

        default = compat.default_group_or_none()
        created = [g for g in compat.process_groups() if g not in (self.group, default)]
        for group in created:
            dist.destroy_process_group(group)
        if created:
            _forget(created)
        torch.manual_seed(self.seed)  # the seed a fresh process starts with
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(True)
        deterministic = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        if deterministic != self.deterministic:  # the setter imports torch._dynamo
            enabled, warn_only = self.deterministic
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        return compat.default_group_or_none() is self.group


def _forget(groups: list) -> None:
    """Drop destroyed groups that libraries cache in module globals (DeepSpeed's), so the next
    test makes new ones."""
    dead = {id(group) for group in groups}
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if id(value) in dead:
                namespace[name] = None
            elif type(value) in (dict, list):
                # plain containers only: a dict subclass (transformers' lazy mappings) may
                # import, or fail, when read
                members = dict.values(value) if type(value) is dict else value
                if any(id(member) in dead for member in members):
                    value.clear()


def _resolve(task: Task):
    """The test callable, its module imported as pytest did."""
    module = sys.modules.get(task.module_name)
    if getattr(module, "__file__", None) != task.module_path:
        module = _import_with_assert_rewriting(task.module_name, task.module_path)
    if task.class_name is None:
        return getattr(module, task.function_name)
    cls = module
    for part in task.class_name.split("."):
        cls = getattr(cls, part)
    return getattr(cls(), task.function_name)


class _AssertRewritingLoader(importlib.machinery.SourceFileLoader):
    """Compiles the test module with pytest's assertion rewriting."""

    def get_code(self, fullname):
        from _pytest.assertion.rewrite import rewrite_asserts

        source = self.get_data(self.path)
        tree = ast.parse(source, filename=self.path)
        rewrite_asserts(tree, source, self.path)
        return compile(tree, self.path, "exec", dont_inherit=True)


def _import_with_assert_rewriting(name: str, path: str):
    loader = _AssertRewritingLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
