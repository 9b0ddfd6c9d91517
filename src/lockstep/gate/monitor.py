"""Measure a launch from outside: wall time and the peak memory (RSS, and GPU memory through
NVML) of every rank process, for scripts that log neither."""

from __future__ import annotations

import threading
import time

import psutil

INTERVAL_S = 0.05


class TreeMonitor:
    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        # processes it already had (a forkserver, an earlier job's leftovers) are not this job's
        self._before = {p.pid for p in self.root.children(recursive=True)}
        self.rss: dict[str, int] = {}
        self.gpu: dict[str, int] = {}
        self._labels: dict[int, str] = {}
        self._stop = threading.Event()
        self._nvml = _nvml_handles()
        self._thread = threading.Thread(
            target=self._loop, name="lockstep-gate-monitor", daemon=True
        )
        self.started = time.perf_counter()
        self.wall_s: float | None = None

    def __enter__(self) -> TreeMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.perf_counter() - self.started
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(INTERVAL_S)

    def sample(self) -> None:
        try:
            children = self.root.children(recursive=True)
        except psutil.Error:
            return
        children = [p for p in children if p.pid not in self._before]
        for proc in children:
            try:
                label = self._label(proc)
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            if label is not None and rss > self.rss.get(label, 0):
                self.rss[label] = rss
        if self._nvml:
            self._sample_gpu({p.pid for p in children})

    def _label(self, proc: psutil.Process) -> str | None:
        if proc.pid not in self._labels:
            try:
                rank = proc.environ().get("RANK")
            except psutil.Error:
                rank = None
            self._labels[proc.pid] = f"rank {rank}" if rank is not None else f"pid {proc.pid}"
        return self._labels[proc.pid]

    def _sample_gpu(self, pids: set[int]) -> None:
        import pynvml

        for handle in self._nvml:
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                continue
            for p in procs:
                if p.pid in pids and p.usedGpuMemory:
                    label = self._labels.get(p.pid, f"pid {p.pid}")
                    self.gpu[label] = max(self.gpu.get(label, 0), int(p.usedGpuMemory))


def _nvml_handles() -> list:
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no driver, no GPU, no bindings: memory from /proc only
        return []
