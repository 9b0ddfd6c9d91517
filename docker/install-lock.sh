#!/usr/bin/env bash
# Build /opt/lockstep/venv from one hashed lock, then install lockstep itself from source.
# Usage (inside the image build): install-lock.sh LOCK_FILE SOURCE_DIR
#
# Every third-party file is checked against the lock's hashes (--require-hashes), so nothing
# unlocked can slip in. pip, setuptools and wheel are in the lock too (pip-compile
# --allow-unsafe); they go in first so that the lock's one sdist (deepspeed) is built with those
# locked tools (--no-build-isolation) rather than with whatever a build environment would fetch.
# Where the build has no index (the CPU docker tier), pip's own PIP_NO_INDEX / PIP_FIND_LINKS
# build arguments point it at a wheelhouse; the hashes are checked all the same.
set -euo pipefail

lock=$1
src=$2
venv=/opt/lockstep/venv
pip=("$venv/bin/pip" install --no-cache-dir --disable-pip-version-check)

python3 -m venv "$venv"
awk '/^[^ #]/ { keep = /^(pip|setuptools|wheel)==/ } keep' "$lock" >/tmp/build-tools.txt
"${pip[@]}" --require-hashes --no-deps -r /tmp/build-tools.txt
"${pip[@]}" --require-hashes --no-build-isolation -r "$lock"
"${pip[@]}" --no-deps --no-build-isolation "$src"
"$venv/bin/pip" check
rm -rf /tmp/build-tools.txt "$src"
