"""The docker tier's cache checks (ci/cache-verify.sh), run for real in bash on real files.

The tier itself needs an engine and minutes; these functions decide whether a cached buildx .deb
or rootfs tarball may be used, on every run, so they are tested alone.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "ci" / "cache-verify.sh"


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f'set -euo pipefail; source "{LIB}"; {script}'],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_pinned_file_passes_and_any_change_fails_with_one_line(tmp_path):
    deb = tmp_path / "docker-buildx.deb"
    deb.write_bytes(b"buildx " * 1000)
    pin = hashlib.sha256(deb.read_bytes()).hexdigest()
    assert bash(f'verify_pinned "{deb}" {pin}', tmp_path).returncode == 0

    deb.write_bytes(b"buildx " * 999 + b"evil   ")  # same size, other bytes
    result = bash(f'verify_pinned "{deb}" {pin}', tmp_path)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and f"pinned {pin}" in result.stderr

    deb.unlink()
    result = bash(f'verify_pinned "{deb}" {pin}', tmp_path)
    assert result.returncode == 1 and "missing" in result.stderr


def test_recorded_hash_is_checked_on_every_use(tmp_path):
    tar = tmp_path / "rootfs.tar"
    tar.write_bytes(b"rootfs" * 4096)
    # No record (a cache made before records existed): status 2, so the tier remakes it.
    result = bash(f'verify_recorded "{tar}"', tmp_path)
    assert result.returncode == 2 and "no recorded sha256" in result.stderr

    assert bash(f'record_sha256 "{tar}"', tmp_path).returncode == 0
    record = Path(f"{tar}.sha256").read_text().strip()
    assert record == hashlib.sha256(tar.read_bytes()).hexdigest()
    assert bash(f'verify_recorded "{tar}"; verify_recorded "{tar}"', tmp_path).returncode == 0

    with tar.open("r+b") as f:  # one byte flipped in place, as a bad disk would
        f.seek(100)
        f.write(b"X")
    result = bash(f'verify_recorded "{tar}"', tmp_path)
    assert result.returncode == 1 and record in result.stderr

    Path(f"{tar}.sha256").write_text("not a hash\n")
    result = bash(f'verify_recorded "{tar}"', tmp_path)
    assert result.returncode == 1 and "holds no sha256" in result.stderr


def test_the_tier_uses_the_checks_on_every_run():
    """The tier calls them outside its download/make branches (a cached file is checked too)."""
    tier = (ROOT / "ci" / "docker-tier.sh").read_text()
    assert "source ci/cache-verify.sh" in tier
    install = tier[tier.index("install_buildx() {") :]
    install = install[: install.index("\n}\n")]
    after_download = install[install.index('mv "$deb.partial" "$deb"\n\tfi') :]
    assert 'verify_pinned "$deb" "$BUILDX_DEB_SHA256"' in after_download
    assert 'dpkg-deb -x "$deb" "$RUN_DIR/buildx"' in after_download
    base = tier[tier.index("rootfs_tar=") : tier.index("base_digest=")]
    assert base.index('verify_recorded "$rootfs_tar"') < base.index("debootstrap")
    assert 'record_sha256 "$rootfs_tar"' in base
