#!/usr/bin/env bash
# Leave a self-hosted GPU runner as the job found it: no stray rank processes holding GPUs,
# no NCCL shared-memory segments, no lockstep containers. Safe to run when nothing is left.
set -uo pipefail
workspace="${GITHUB_WORKSPACE:-$PWD}"

# Rank processes started from this checkout (torchrun, deepspeed, pytest workers).
pkill -TERM -f -- "$workspace/.nox/" 2>/dev/null || true
sleep 2
pkill -KILL -f -- "$workspace/.nox/" 2>/dev/null || true

# NCCL's shared-memory segments outlive a killed rank.
find /dev/shm -maxdepth 1 -user "$(id -u)" -name 'nccl-*' -delete 2>/dev/null || true

if command -v docker >/dev/null 2>&1; then
  docker ps -aq --filter label=org.lockstep.job="${GITHUB_RUN_ID:-local}" | xargs -r docker rm -f
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader || true
fi
exit 0
