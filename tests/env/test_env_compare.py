"""Grouping by section digests, majority, outlier fields, ignored fields, duplicate GPUs."""

from __future__ import annotations

import copy

from lockstep.env.compare import (
    DIGEST_BYTES,
    Ignored,
    compare_ranks,
    differing_fields,
    section_digests,
)
from lockstep.env.fingerprint import SECTIONS


def synthetic(host: str = "node0", rank: int = 0) -> dict:
    sections = {name: {} for name in SECTIONS}
    sections["system"] = {"hostname": host, "kernel": "6.1", "cores": 8}
    sections["env"] = {"RANK": str(rank), "NCCL_DEBUG": "WARN"}
    sections["packages"] = {"installed": {"torch": "2.13.0", "numpy": "2.4.6"}, "lock": None}
    sections["gpus"] = {"devices": [{"name": "H100", "uuid": f"u-{host}-{rank}"}]}
    return {"schema": 1, "sections": sections}


def identity(rank: int, host: str = "node0", uuid: str | None = None) -> dict:
    gpu = {"index": 0, "name": "H100", "uuid": uuid or f"u-{host}-{rank}"}
    return {"rank": rank, "host": host, "node": 0, "local_rank": rank, "gpu": gpu}


def run(fps: list[dict], ignored: Ignored | None = None, identities=None) -> dict:
    ignored = ignored or Ignored()
    digests = [section_digests(fp, ignored) for fp in fps]
    identities = identities or [identity(r) for r in range(len(fps))]
    return compare_ranks(digests, dict(enumerate(fps)), identities, ignored)


def test_digest_size_is_constant():
    small, big = synthetic(), synthetic()
    big["sections"]["packages"]["installed"].update({f"p{i}": "1.0" for i in range(5000)})
    assert len(section_digests(small, Ignored())) == len(section_digests(big, Ignored()))
    assert len(section_digests(small, Ignored())) == DIGEST_BYTES * len(SECTIONS)


def test_hostnames_and_rank_variables_do_not_split_groups():
    result = run([synthetic(f"node{r}", r) for r in range(4)])
    assert result["groups"] == [[0, 1, 2, 3]] and result["outliers"] == []


def test_outlier_named_with_each_field_and_both_values():
    fps = [synthetic(rank=r) for r in range(4)]
    fps[1]["sections"]["env"]["NCCL_ALGO"] = "Ring"
    fps[1]["sections"]["packages"]["installed"]["torch"] = "2.12.0"
    result = run(fps)
    assert result["majority"] == [0, 2, 3]
    (outlier,) = result["outliers"]
    assert [i["rank"] for i in outlier["ranks"]] == [1]
    assert {f["field"]: (f["value"], f["expected"]) for f in outlier["fields"]} == {
        "env.NCCL_ALGO": ("Ring", "<absent>"),
        "packages.installed.torch": ("2.12.0", "2.13.0"),
    }


def test_allow_ignores_a_field_and_everything_under_a_prefix():
    fps = [synthetic(rank=r) for r in range(3)]
    fps[2]["sections"]["env"]["NCCL_DEBUG"] = "INFO"
    fps[2]["sections"]["packages"]["installed"]["numpy"] = "1.0"
    assert run(fps, Ignored(["env.NCCL_DEBUG"]))["outliers"][0]["fields"] == [
        {"field": "packages.installed.numpy", "value": "1.0", "expected": "2.4.6"}
    ]
    assert run(fps, Ignored(["env.NCCL_*", "packages"]))["outliers"] == []


def test_groups_ordered_by_size_then_lowest_rank():
    fps = [synthetic(rank=r) for r in range(7)]
    for r in (0, 1):
        fps[r]["sections"]["system"]["kernel"] = "5.15"
    for r in (5, 6):
        fps[r]["sections"]["system"]["cores"] = 4
    result = run(fps)
    assert result["groups"] == [[2, 3, 4], [0, 1], [5, 6]]
    assert [[i["rank"] for i in o["ranks"]] for o in result["outliers"]] == [[0, 1], [5, 6]]


def test_duplicate_gpu_on_one_host_is_reported():
    fps = [synthetic(rank=r) for r in range(3)]
    identities = [identity(0, uuid="A"), identity(1, uuid="A"), identity(2, "node1", uuid="A")]
    assert run(fps, identities=identities)["duplicate_gpus"] == [
        {"host": "node0", "uuid": "A", "ranks": [0, 1]}
    ]


def test_differing_fields_of_identical_fingerprints_is_empty():
    fp = synthetic()
    assert differing_fields(fp, copy.deepcopy(fp), Ignored()) == []


def test_two_h200_fingerprints_differ_in_the_one_variable_set(capsys):
    """Two `lockstep fingerprint --json` of a lent H200, the second with NCCL_DEBUG=INFO: the
    diff names that field alone (exit 1), and the GPU section came from NVML with the driver,
    each device's UUID and PCI bus id."""
    import json
    from pathlib import Path

    from lockstep.cli import main

    h200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
    a, b = h200 / "fingerprint.json", h200 / "fingerprint-nccl-debug.json"
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "1 differing fields" in out and "env.NCCL_DEBUG" in out and "INFO" in out
    gpus = json.loads(a.read_text())["sections"]["gpus"]
    assert gpus["source"] == "nvml" and gpus["driver"] == "580.159.04"
    (device,) = gpus["devices"]
    assert device["name"] == "NVIDIA H200" and device["compute_capability"] == "9.0"
    assert len(device["uuid"]) == 36 and device["pci_bus_id"].startswith("00000000:")
