"""A PNG heatmap of the link matrix (`preflight --plot DIR`): node x node Gb/s, the slow nodes
and links outlined. matplotlib with the Agg backend, as the gate's plots."""

from __future__ import annotations

from pathlib import Path

from lockstep.preflight.links.stats import matrix, merge_rails

_LABELS_MAX = 64  # host names on the axes up to this many nodes


def heatmap(section: dict, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    hosts = [n["host"] for n in section["nodes"]]
    n = len(hosts)
    grid = matrix(n, merge_rails(section["links"]))
    data = np.array([[np.nan if v is None else v for v in row] for row in grid], dtype=float)
    out_dir.mkdir(parents=True, exist_ok=True)
    size = min(14.0, 4.0 + 0.25 * min(n, 40))
    fig, ax = plt.subplots(figsize=(size + 1.5, size), dpi=100)
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("#dddddd")
    image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, interpolation="nearest")
    fig.colorbar(image, ax=ax, label="Gb/s (slowest rail, slower direction)")
    if n <= _LABELS_MAX:
        ax.set_xticks(range(n), hosts, rotation=90, fontsize=8)
        ax.set_yticks(range(n), hosts, fontsize=8)
        if n <= 16:
            for i in range(n):
                for j in range(n):
                    if not np.isnan(data[i, j]):
                        ax.text(
                            j,
                            i,
                            f"{data[i, j]:.2g}",
                            ha="center",
                            va="center",
                            fontsize=7,
                            color="white",
                        )
    for s in section["slow_nodes"]:
        k = s["node"]
        ax.add_patch(plt.Rectangle((-0.5, k - 0.5), n, 1, fill=False, ec="red", lw=1.5))
        ax.add_patch(plt.Rectangle((k - 0.5, -0.5), 1, n, fill=False, ec="red", lw=1.5))
    for s in section["slow_links"]:
        a, b = s["nodes"]
        for i, j in ((a, b), (b, a)):
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="orange", lw=2))
    typical = section.get("typical_gbps")
    found = len(section["slow_nodes"]) + len(section["slow_links"])
    ax.set_title(
        f"lockstep preflight links: {n} nodes, typical {typical} Gb/s, "
        f"{found} finding{'s' if found != 1 else ''}"
        + (f", exclude {section['exclude_hostlist']}" if section["exclude"] else "")
    )
    fig.tight_layout()
    path = out_dir / "links.png"
    fig.savefig(path)
    plt.close(fig)
    return path
