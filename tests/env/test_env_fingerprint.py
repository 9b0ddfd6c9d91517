"""One rank's fingerprint: sections, canonical JSON, secrets, image manifest, lock, CLI, diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lockstep.cli import main
from lockstep.env import fingerprint
from lockstep.env.lockfile import compare_lock, find_lock, parse_lock
from lockstep.errors import UsageError

SECRET = "hunter2-planted-value"
URL_PASSWORD = "s3cr3t-url-password"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCKSTEP_IMAGE_MANIFEST", str(tmp_path / "no-manifest.json"))
    monkeypatch.chdir(tmp_path)  # no requirements/ here: no lock unless given
    return tmp_path


def test_sections_digests_and_schema(clean_env):
    fp = fingerprint.collect()
    assert fp["schema"] == fingerprint.SCHEMA
    assert list(fp["sections"]) == list(fingerprint.SECTIONS)
    for name, body in fp["sections"].items():
        assert fp["digests"][name] == fingerprint.digest(body)
    torch_section = fp["sections"]["torch"]
    assert set(torch_section["mapped_libraries"]) == {"libnccl", "libcudnn", "libcudart"}
    packages = fp["sections"]["packages"]
    assert packages["installed"]["torch"] == torch_section["version"]
    assert packages["count"] == len(packages["installed"]) and packages["lock"] is None
    assert "lockstep" in packages["editable"]
    assert fp["sections"]["resources"]["memory_total_gib"] > 0
    assert fp["sections"]["container"]["image_identity"] == "unknown"


def test_gpus_section_says_none_without_a_gpu(clean_env):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present; this checks the GPU-less path")
    assert fingerprint.collect()["sections"]["gpus"] == {
        "source": "none",
        "driver": None,
        "devices": [],
    }


def test_json_is_canonical_and_stable(clean_env):
    fp = fingerprint.collect()
    a, b = clean_env / "a.json", clean_env / "b.json"
    fingerprint.dump(fp, a)
    fingerprint.dump(json.loads(a.read_text()), b)
    assert a.read_bytes() == b.read_bytes()
    assert list(json.loads(a.read_text())["sections"]["env"]) == sorted(fp["sections"]["env"])


def test_secrets_never_appear_but_still_compare(clean_env, monkeypatch):
    monkeypatch.setenv("TORCH_PLANTED_TOKEN", SECRET)
    monkeypatch.setenv("NCCL_PROXY", f"https://alice:{URL_PASSWORD}@proxy.example:3128")
    first = fingerprint.collect()
    text = fingerprint.canonical_json(first)
    assert SECRET not in text and URL_PASSWORD not in text
    assert first["sections"]["env"]["TORCH_PLANTED_TOKEN"].startswith("<redacted:")
    monkeypatch.setenv("TORCH_PLANTED_TOKEN", SECRET + "-other")
    second = fingerprint.collect()
    assert first["digests"]["env"] != second["digests"]["env"]


def test_image_manifest_gives_identity(clean_env, monkeypatch):
    manifest = {
        "schema": 1,
        "image": "lockstep:cpu",
        "base_image": "debian:12@sha256:" + "0" * 64,
        "base_digest": "sha256:" + "0" * 64,
        "locks": {"cpu.txt": "sha256:" + "1" * 64},
        "git_revision": "abc123",
        "build_time": "2026-11-22T00:00:00Z",
    }
    path = clean_env / "manifest.json"
    path.write_text(json.dumps(manifest))
    monkeypatch.setenv("LOCKSTEP_IMAGE_MANIFEST", str(path))
    container = fingerprint.collect()["sections"]["container"]
    assert container["image"] == "lockstep:cpu"
    assert container["image_identity"] == fingerprint.digest(manifest)
    path.write_text("{not json")
    with pytest.raises(UsageError, match="not JSON"):
        fingerprint.collect()


def _installed() -> dict[str, str]:
    return fingerprint.packages_section(None, Path("/nonexistent"), "0")["installed"]


def _write_lock(path: Path, pins: dict[str, str]) -> Path:
    lines = ["# pip-compile --generate-hashes"]
    for name, version in sorted(pins.items()):
        lines += [f"{name}=={version} \\", "    --hash=sha256:" + "a" * 64, "    # via x"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_lock_match_extra_missing_different(clean_env):
    installed = {k: v for k, v in _installed().items() if k != "lockstep"}
    exact = _write_lock(clean_env / "exact.txt", installed)
    assert compare_lock(exact, installed)["matches"]
    pins = dict(installed)
    pins.pop("rich")
    pins["numpy"] = "0.0.1"
    pins["not-installed-pkg"] = "1.0"
    result = compare_lock(_write_lock(clean_env / "off.txt", pins), installed)
    assert not result["matches"]
    assert list(result["extra"]) == ["rich"]
    assert result["missing"] == {"not-installed-pkg": "1.0"}
    assert result["different"] == {"numpy": {"installed": installed["numpy"], "locked": "0.0.1"}}


def test_lock_found_by_torch_local_version(clean_env):
    req = clean_env / "requirements"
    req.mkdir()
    _write_lock(req / "cpu.txt", {"torch": "2.13.0+cpu"})
    _write_lock(req / "cuda.txt", {"torch": "2.13.0"})
    assert find_lock(clean_env, "2.13.0+cpu") == req / "cpu.txt"
    assert find_lock(clean_env, "2.13.0") == req / "cuda.txt"
    assert find_lock(clean_env, "2.13.0+rocm6") is None


def test_malformed_lock_names_file_and_line(clean_env):
    bad = clean_env / "bad.txt"
    bad.write_text("torch>=2\n")
    with pytest.raises(UsageError, match=r"bad.txt:1"):
        parse_lock(bad)


def test_cli_fingerprint_and_diff(clean_env, monkeypatch, capsys):
    a, b = clean_env / "a.json", clean_env / "b.json"
    assert main(["fingerprint", "--json", str(a)]) == 0
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    assert main(["fingerprint", "--json", str(b)]) == 0
    capsys.readouterr()
    assert main(["diff", str(a), str(a)]) == 0
    assert main(["diff", str(a), str(b)]) == 1
    assert "env.NCCL_ALGO" in capsys.readouterr().out
    assert main(["diff", str(a), str(b), "--allow", "env.NCCL_ALGO"]) == 0


@pytest.mark.parametrize("content", [None, "{oops", '{"schema": 99}'])
def test_cli_diff_bad_input_is_one_line_exit_2(clean_env, capsys, content):
    bad = clean_env / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert main(["diff", str(bad), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lockstep: error:") and "\n" not in err


def test_editable_revision_read_from_git_without_git(tmp_path):
    from lockstep.env.fingerprint import vcs_revision

    sha = "0123456789abcdef0123456789abcdef01234567"
    git = tmp_path / "src" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text(sha + "\n")
    assert vcs_revision(f"file://{tmp_path / 'src'}") == sha
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").write_text(f"# pack-refs\n{sha} refs/heads/main\n")
    assert vcs_revision(f"file://{tmp_path / 'src'}") == sha
    assert vcs_revision("https://example.org/x.git") is None
