#!/usr/bin/env bash
# Build /opt/lockstep/venv from one hashed lock; then, in a later layer, install lockstep itself
# from source into it, so a change to the code does not rebuild the locked venv.
# Usage (inside the image build):
#   install-lock.sh LOCK_FILE --part torch                 that part of the lock alone
#   install-lock.sh LOCK_FILE [--deepspeed-build FILE]     the rest of the lock (what is installed is kept)
#   install-lock.sh --source DIR                           lockstep itself
# Which pins make which part is docker/lock-parts.py's (noxfile.py reads the same file):
# `--part torch` gives the largest pin (half the venv) a layer of its own: a push compresses
# layers side by side, one per core, so one 1.4 GB layer took as long as all the others.
#
# Every third-party file is checked against the lock's hashes (--require-hashes), so nothing
# unlocked can slip in. pip, setuptools and wheel are in the lock too (pip-compile
# --allow-unsafe); they go in first so that the lock's one sdist (deepspeed) is built with those
# locked tools (--no-build-isolation) rather than with whatever a build environment would fetch.
# --deepspeed-build names DeepSpeed's build switches (docker/deepspeed-build.env), set for that
# build alone. Where the build has no index (the CPU docker tier), pip's own PIP_NO_INDEX /
# PIP_FIND_LINKS build arguments point it at a wheelhouse; the hashes are checked all the same.
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
# One part of the lock, from docker/lock-parts.py beside this script (stdlib, isolated).
part() { python3 -I "$(dirname "$0")/lock-parts.py" "$lock" "$1" >"/tmp/$1.txt"; }
part build-tools
"${pip[@]}" --require-hashes --no-deps -r /tmp/build-tools.txt
if [[ ${2:-} == --part ]]; then
	part "$3"
	"${pip[@]}" --no-compile --require-hashes --no-deps -r "/tmp/$3.txt"
	compile_venv
	rm -f /tmp/build-tools.txt "/tmp/$3.txt"
	exit 0
fi
switches=()
if [[ ${2:-} == --deepspeed-build ]]; then
	mapfile -t switches < <(python3 -I "$(dirname "$0")/lock-parts.py" --switches "$3")
	((${#switches[@]})) || { echo "install-lock.sh: no switches read from $3" >&2; exit 2; }
fi
part without-sdist
part sdist
"${pip[@]}" --no-compile --require-hashes --no-build-isolation -r /tmp/without-sdist.txt
# DeepSpeed last, against the torch now installed, so its build switches (the CPU image: its
# shared-memory op) compile ops into the wheel instead of at job start. The venv's bin/ on PATH:
# DS_ENABLE_NINJA builds with the lock's ninja installed there.
env "${switches[@]}" PATH="$venv/bin:$PATH" "${pip[@]}" --no-compile --require-hashes --no-deps \
	--no-build-isolation -r /tmp/sdist.txt
compile_venv
"$venv/bin/pip" check
rm -rf /tmp/build-tools.txt /tmp/sdist.txt /tmp/without-sdist.txt
