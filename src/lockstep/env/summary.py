"""Human-readable views of one fingerprint and of a diff between two."""

from __future__ import annotations

from collections.abc import Sequence

from lockstep.env import cuda_stack
from lockstep.redact import scrub_text


def cell(value: object) -> str:
    """Scrubbed, with rich markup escaped: values like `[W]` are text, not styles (preflight's
    tables use it too)."""
    from rich.markup import escape

    return escape(scrub_text(str(value)))


def _headline(name: str, body: dict) -> str:
    match name:
        case "python":
            return f"{body['version']} {body['implementation']} ({body['executable']})"
        case "system":
            return f"{body['os']}, kernel {body['kernel']}, {body['glibc']}, {body['cores']} cores"
        case "torch":
            return (
                f"{body['version']} cuda={body['cuda']} nccl={body['nccl']} cudnn={body['cudnn']}"
            )
        case "gpus":
            names = sorted({d["name"] for d in body["devices"]})
            return f"{len(body['devices'])} ({', '.join(names) or 'none'}) driver={body['driver']}"
        case "packages":
            lock = body["lock"]
            state = (
                "no lock"
                if lock is None
                else f"lock {lock['path']}: "
                + (
                    "matches"
                    if lock["matches"]
                    else f"{len(lock['extra'])} extra, "
                    f"{len(lock['missing'])} missing, {len(lock['different'])} different"
                    + "".join(f"; {d}" for d in cuda_stack.differences(lock.get("cuda_stack")))
                )
            )
            return f"{body['count']} distributions, {state}"
        case "container":
            return (
                f"in container: {body['in_container']} ({body['runtime']}), image {body['image']}"
            )
        case "env":
            return f"{len(body)} variables"
        case "resources":
            return f"/dev/shm {body['shm_gib']} GiB, memory {body['memory_total_gib']} GiB"
        case _:
            return ", ".join(f"{k}={v}" for k, v in body.items())


def print_fingerprint(fp: dict, warnings: Sequence[str] = ()) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"lockstep fingerprint (schema {fp['schema']})")
    for col in ("section", "digest", "summary"):
        table.add_column(col)
    for name, body in fp["sections"].items():
        table.add_row(name, fp["digests"][name][7:19], cell(_headline(name, body)))
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {cell(warning)}")


def print_diff(fields: list[dict], a: str, b: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    if not fields:
        console.print(cell(f"{a} and {b} match (ignoring the default per-rank fields)"))
        return
    table = Table(title=f"{len(fields)} differing fields")
    for col in ("field", a, b):
        table.add_column(col)
    for f in fields:
        table.add_row(cell(f["field"]), cell(f["expected"]), cell(f["value"]))
    console.print(table)
