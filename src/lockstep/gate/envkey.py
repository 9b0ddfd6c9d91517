"""Which environment a golden belongs to: the fields that change numerics, as a file name; the
machine is kept beside the key, for speed gates. Design: docs/design/gates.md."""

from __future__ import annotations

import re

# The key's fields, in the order they appear in the file name.
KEY_FIELDS = (
    "device",
    "torch",
    "cuda",
    "cudnn",
    "nccl",
    "deepspeed",
    "engine",
    "world_size",
    "precision",
    "deterministic",
)


def environment(fingerprint: dict, job: dict) -> dict:
    """The key fields and the machine, from a fingerprint (`lockstep.env.fingerprint`) and the
    job's own settings (engine, world_size, precision, deterministic)."""
    sections = fingerprint["sections"]
    torch_section = sections["torch"]
    devices = sections["gpus"]["devices"]
    system = sections["system"]
    if devices and job.get("device", "cuda") != "cpu":
        device = devices[0]["name"]
        machine = f"{len(devices)} x {device}"
    else:
        device = f"cpu-{sections['determinism'].get('cpu_capability') or 'unknown'}"
        machine = f"{system.get('cpu_model') or 'unknown cpu'}, {system.get('usable_cores')} cores"
    installed = sections["packages"].get("installed", {})
    on_gpu = bool(devices) and job.get("device", "cuda") != "cpu"
    fields = {
        "device": device,
        "torch": torch_section["version"] if on_gpu else torch_section["version"].split("+")[0],
        "cuda": torch_section.get("cuda") if on_gpu else None,
        "cudnn": torch_section.get("cudnn") if on_gpu else None,
        "nccl": torch_section.get("nccl") if on_gpu else None,
        "deepspeed": installed.get("deepspeed") if job.get("deepspeed", True) else None,
        "engine": job.get("engine", "script"),
        "world_size": job["world_size"],
        "precision": job.get("precision"),
        "deterministic": job.get("deterministic"),
    }
    legacy = fields | {  # the key as lockstep wrote it before keys held only what a job uses
        "torch": torch_section["version"],
        "deepspeed": installed.get("deepspeed"),
        **{
            name: torch_section.get(name) if devices else None for name in ("cuda", "cudnn", "nccl")
        },
    }
    return {"key_fields": fields, "machine": machine, "legacy_key": key(legacy)}


def key(fields: dict) -> str:
    """`cpu-avx512_torch2.13.0+cpu_ds0.19.8_ddp_w2_fp32_det`: readable, safe as a file name."""
    short = {"torch": "torch", "cuda": "cuda", "cudnn": "cudnn", "nccl": "nccl", "deepspeed": "ds"}
    parts = []
    for name in KEY_FIELDS:
        value = fields.get(name)
        if value is None:
            continue
        if name == "world_size":
            parts.append(f"w{value}")
        elif name == "deterministic":
            parts.append("det" if value else "nondet")
        elif name in short:
            parts.append(f"{short[name]}{value}")
        else:
            parts.append(str(value))
    return "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", part).lower() for part in parts)


def differences(recorded: dict, current: dict) -> list[str]:
    """`torch 2.13.0 → 2.14.0` for each key field that differs."""
    out = []
    for name in KEY_FIELDS:
        a, b = recorded.get(name), current.get(name)
        if a != b:
            out.append(f"{name} {_show(a)} → {_show(b)}")
    return out


def _show(value) -> str:
    return "none" if value is None else str(value)


def nearest(current: dict, candidates: dict[str, dict]) -> tuple[str, list[str]] | None:
    """Among {key: key_fields} the key whose fields differ least from `current`."""
    if not candidates:
        return None
    best = min(candidates, key=lambda k: (len(differences(candidates[k], current)), k))
    return best, differences(candidates[best], current)
