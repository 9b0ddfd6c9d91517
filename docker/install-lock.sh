#!/usr/bin/env bash
# Build /opt/lockstep/venv from one hashed lock; then, in a later layer, install lockstep itself
# from source into it, so a change to the code does not rebuild the locked venv.
# Usage (inside the image build):
#   install-lock.sh LOCK_FILE --only REGEX   the lock's pins whose `name==` line matches, alone
#   install-lock.sh LOCK_FILE                the rest of the lock (what is installed is kept)
#   install-lock.sh --source DIR             lockstep itself
# --only gives the largest pin (torch: half the venv) a layer of its own: a push compresses
# layers side by side, one per core, so one 1.4 GB layer took as long as all the others.
#
# Every third-party file is checked against the lock's hashes (--require-hashes), so nothing
# unlocked can slip in. pip, setuptools and wheel are in the lock too (pip-compile
# --allow-unsafe); they go in first so that the lock's one sdist (deepspeed) is built with those
# locked tools (--no-build-isolation) rather than with whatever a build environment would fetch.
# Where the build has no index (the CPU docker tier), pip's own PIP_NO_INDEX / PIP_FIND_LINKS
# build arguments point it at a wheelhouse; the hashes are checked all the same.
set -euo pipefail

venv=/opt/lockstep/venv
pip=("$venv/bin/pip" install --no-cache-dir --disable-pip-version-check)
# pip byte-compiles what it installs one file at a time (38 of 62 s of the lock's install on 2
# cores); compileall does the same files on every core afterwards. As with pip, a file that does
# not compile (test data written for a newer Python) is left for the import that never comes.
compile_venv() { "$venv/bin/python" -m compileall -qq -j 0 "$venv/lib" || true; }

if [[ $1 == --source ]]; then
	src=$2
	"${pip[@]}" --no-deps --no-build-isolation "$src"
	"$venv/bin/pip" check
	rm -rf "$src"
	exit 0
fi

lock=$1
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
# One pinned block of the lock: its `name==` line and the indented hash and via lines under it.
block() { awk -v want="$1" '/^[^ #]/ { keep = ($0 ~ want) } keep' "$lock"; }
block '^(pip|setuptools|wheel)==' >/tmp/build-tools.txt
"${pip[@]}" --require-hashes --no-deps -r /tmp/build-tools.txt
if [[ ${2:-} == --only ]]; then
	block "$3" >/tmp/only.txt
	grep -q '^[^ #]' /tmp/only.txt || { echo "install-lock.sh: no pin of $lock matches $3" >&2; exit 2; }
	"${pip[@]}" --no-compile --require-hashes --no-deps -r /tmp/only.txt
	compile_venv
	rm -f /tmp/build-tools.txt /tmp/only.txt
	exit 0
fi
block '^(deepspeed)==' >/tmp/sdist.txt
awk '/^[^ #]/ { keep = !/^deepspeed==/ } keep' "$lock" >/tmp/without-sdist.txt
"${pip[@]}" --no-compile --require-hashes --no-build-isolation -r /tmp/without-sdist.txt
# DeepSpeed last, against the torch now installed, so the DS_BUILD_* switches the stage sets
# (the CPU image: its shared-memory op) compile ops into the wheel instead of at job start.
# The venv's bin/ on PATH: DS_ENABLE_NINJA builds with the lock's ninja installed there.
PATH="$venv/bin:$PATH" "${pip[@]}" --no-compile --require-hashes --no-deps --no-build-isolation \
	-r /tmp/sdist.txt
compile_venv
"$venv/bin/pip" check
rm -rf /tmp/build-tools.txt /tmp/sdist.txt /tmp/without-sdist.txt
