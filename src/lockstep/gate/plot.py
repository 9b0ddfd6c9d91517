"""PNG plots of each metric: the golden's center and band against the run, the first failing
step marked. matplotlib with the Agg backend: no display needed, the same on a CI runner."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lockstep.gate.compare import Finding
from lockstep.gate.golden import Golden
from lockstep.gate.run_result import Run


def plot_all(golden: Golden, run: Run, findings: list[Finding], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    first_fail = {}
    for f in findings:
        if f.failed and f.step is not None and f.metric not in first_fail:
            first_fail[f.metric] = f.step
    index = {s: i for i, s in enumerate(run.steps)}
    written = []
    for metric, center in golden.centers.items():
        current = np.array(
            [run.series(metric)[index[s]] if s in index else np.nan for s in golden.steps.tolist()]
        )
        if not np.isfinite(current).any() and not np.isfinite(center).any():
            continue
        tol = golden.header["curves"].get(metric)
        if tol is not None:
            band = np.maximum(tol["tol_rel"] * np.abs(center), tol["tol_abs"])
            label = "golden (exact)" if tol["exact"] else f"golden ± {tol['tol_rel']:.3g} rel"
        else:  # per-step performance series: the spread the repeats showed
            band = golden.spreads[metric]
            label = "golden ± repeat spread"
        fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
        ax.fill_between(
            golden.steps,
            center - band,
            center + band,
            color="tab:blue",
            alpha=0.25,
            linewidth=0,
            label=label,
        )
        ax.plot(golden.steps, center, color="tab:blue", linewidth=1.2)
        ax.plot(
            golden.steps,
            current,
            color="tab:orange",
            linewidth=1.2,
            marker=".",
            markersize=3,
            label="this run",
        )
        if metric in first_fail:
            step = first_fail[metric]
            ax.axvline(step, color="tab:red", linestyle="--", linewidth=1)
            if step in index:
                ax.plot(
                    [step],
                    [run.series(metric)[index[step]]],
                    "o",
                    color="tab:red",
                    label=f"first failing step {step}",
                )
        status = "FAIL" if metric in first_fail else "pass"
        ax.set_title(f"{golden.name}: {metric} [{status}]")
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"{golden.name}-{metric}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
