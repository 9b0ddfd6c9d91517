#!/usr/bin/env bash
# CI's way to run nox: nox comes from the hashed lock requirements/ci.txt, installed into its own
# venv (never into the host Python, which Ubuntu 24.04 refuses anyway, PEP 668), and re-made
# whenever that lock changes. A person can keep using the README's `python -m pip install nox`.
#
#   ci/nox.sh -s lint            # any nox arguments
#
# LOCKSTEP_CI_VENV sets the venv's folder (default .nox/ci-bootstrap); PYTHON the interpreter
# that creates it (default python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lock=$root/requirements/ci.txt
venv=${LOCKSTEP_CI_VENV:-$root/.nox/ci-bootstrap}
python=${PYTHON:-python3}

command -v "$python" >/dev/null || {
	echo "ci/nox.sh: error: $python not found; set PYTHON to a Python 3.11+ interpreter" >&2
	exit 2
}
digest=$(sha256sum "$lock" | cut -d' ' -f1)
if [[ $(cat "$venv/lockstep-ci.sha256" 2>/dev/null) != "$digest" ]]; then
	rm -rf "$venv"
	"$python" -m venv "$venv"
	# --no-deps: the lock is complete, so nothing outside it can be pulled in; every file is
	# checked against its hash whatever index pip is configured with.
	"$venv/bin/python" -m pip install --disable-pip-version-check -q \
		--require-hashes --no-deps -r "$lock"
	echo "$digest" >"$venv/lockstep-ci.sha256"
fi
exec "$venv/bin/nox" "$@"
