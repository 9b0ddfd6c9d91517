#!/usr/bin/env bash
# action.yml's install step: lockstep (from the action's own checkout, $LOCKSTEP_SOURCE, with
# $LOCKSTEP_EXTRAS) into the job's python, beside the job's packages. The torch family already
# installed is held by a constraints file: pip installs around it or fails naming it, and never
# replaces the job's torch or its CUDA wheels.
set -euo pipefail
extras=${LOCKSTEP_EXTRAS:-}
if [[ ! $extras =~ ^[a-z,]*$ ]]; then
  echo "::error::lockstep action: extras '$extras': comma-separated names (train,plot,...)" >&2
  exit 2
fi
held="${RUNNER_TEMP:?the runner sets RUNNER_TEMP}/lockstep-held.txt"
family='^(torch|torchvision|torchaudio|triton|pytorch-triton|nvidia-[a-z0-9-]+)=='
python -m pip list --format=freeze 2>/dev/null | grep -iE "$family" > "$held" || true
spec="$LOCKSTEP_SOURCE${extras:+[$extras]}"
echo "lockstep action: installing $spec, holding $(wc -l < "$held") torch packages as they are"
python -m pip install --disable-pip-version-check --constraint "$held" "$spec"
after="${held%.txt}-after.txt"
python -m pip list --format=freeze 2>/dev/null | grep -iE "$family" > "$after" || true
if ! diff -u "$held" "$after" | grep -E '^-[^-]' >&2; then
  exit 0
fi
echo "::error::lockstep action: the install changed the job's torch packages (above)" >&2
exit 1
