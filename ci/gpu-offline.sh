#!/usr/bin/env bash
# The GPU checks of issue 40 on an offline machine with one GPU and a Python of its own
# (torch, transformers, pytest there; lockstep and its other needs carried as wheels in .whl/,
# which ci/gpu-wheels.sh makes here: carry .whl to the machine).
# Each step has a time limit and the whole run a budget (BUDGET seconds); a step that fails or
# runs out is logged and the next one runs. Everything lands in $OUT: log.txt (all output) and
# artifacts.tgz (fingerprints, preflight report, golden, gate results, flight-recorder dump,
# benchmark output, JUnit of the smoke tier).
# STEPS picks and orders the parts (default: all, in order of value for a first run); a part
# is one of: lockstep fr floor smoke-ddp smoke-zero bench gate. ENGINES names the bench's engines,
# ROUNDS the bench's rounds, REPEATS the gate golden's repeats, GATE_SETS more `--set`s for the
# gate's job (space-separated, no space inside one), SLOW_KINDS the planted waits (spin sleep),
# GATE_CONFIG the gate's job (default smoke/gpu-ddp.toml; the GPU runners' own gate is
# smoke/gpu-ddp-100m.toml). OUT defaults to a fresh folder (`mktemp -d`, named at the start);
# the wheels go to another, removed at the end: never a fixed path in /tmp, which another user
# of the machine could have made first (ci/check-tmp-paths.py).
#   OUT=$HOME/gpu-out BUDGET=500 bash ci/gpu-offline.sh
#   OUT=$HOME/gpu-out BUDGET=300 STEPS="fr smoke-zero bench" ENGINES=ddp,fsdp bash ci/gpu-offline.sh
set -u
STEPS=${STEPS:-lockstep fr floor smoke-ddp smoke-zero bench gate}
REPEATS=${REPEATS:-10}
ENGINES=${ENGINES:-ddp,fsdp,zero3}
ROUNDS=${ROUNDS:-5}
GATE_SETS=${GATE_SETS:-}
SLOW_KINDS=${SLOW_KINDS:-spin sleep}
GATE_CONFIG=${GATE_CONFIG:-smoke/gpu-ddp.toml}
OUT=${OUT:-$(mktemp -d -t gpu-out.XXXXXX)} || exit 1
BUDGET=${BUDGET:-500}
START=$(date +%s)
A=$(mktemp -d) && SITE=$(mktemp -d) || exit 1
LOG="$OUT/log.txt"
mkdir -p "$OUT"
exec > >(tee -a "$LOG") 2>&1

want() { [[ " $STEPS " == *" $1 "* ]]; }

left() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME LIMIT CMD...: run CMD with at most LIMIT seconds (less if the budget is short)
step() {
  local name=$1 limit=$2 rest t0 rc
  shift 2
  rest=$(left)
  if [ "$rest" -lt 25 ]; then
    echo "=== $name: NOT RUN (budget spent)"
    return
  fi
  [ "$limit" -gt "$rest" ] && limit=$rest
  echo "=== $name (limit ${limit}s) at $(date +%T)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@"
  rc=$?
  echo "=== $name: rc=$rc in $(($(date +%s) - t0))s"
}

finish() {
  tar -czf "$OUT/artifacts.tgz" -C "$A" . 2>/dev/null
  rm -rf "$A" "$SITE"
}
trap finish EXIT
echo "=== output in $OUT"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH="$PWD/src:$SITE" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
# DeepSpeed's op builder cannot read an arch suffix (the image's own `9.0a`): lockstep's ZeRO
# engine refuses it in one line (deepspeed_config.arch_list_problem); build for plain 9.0.
ARCHS=${TORCH_CUDA_ARCH_LIST:-9.0}
export TORCH_CUDA_ARCH_LIST=${ARCHS//a/} MAX_JOBS=${MAX_JOBS:-16}
export WANDB_MODE=offline WANDB_DIR="$A/wandb"
mkdir -p "$WANDB_DIR"

echo "=== versions"
nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv
python3 - <<'EOF'
import platform, deepspeed, numpy, pydantic, torch, transformers, wandb
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(), "nccl", ".".join(map(str, torch.cuda.nccl.version())))
print("deepspeed", deepspeed.__version__, "transformers", transformers.__version__,
      "numpy", numpy.__version__, "pydantic", pydantic.__version__, "wandb", wandb.__version__)
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
EOF

# DeepSpeed's FusedAdam (ZeRO on a GPU) and CPUAdam (optimizer offload) are JIT builds: start
# them now when a ZeRO part runs, beside the parts that time nothing (never beside bench or gate).
BUILD=
if want smoke-zero; then
  python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder as F, CPUAdamBuilder as C
F().load(); C().load(); print('deepspeed ops built')" >"$A/ds-build.log" 2>&1 &
  BUILD=$!
fi

# 1. preflight on NCCL, NVML fields, matmul checksum; fingerprints and their diff; the lock
if want lockstep; then
  step preflight 90 lockstep preflight --nproc 1 --json "$A/preflight.json"
  step fingerprint 60 lockstep fingerprint --json "$A/fp.json"
  step fingerprint-nccl-debug 60 env NCCL_DEBUG=INFO lockstep fingerprint --json "$A/fp-debug.json"
  step diff 30 lockstep diff "$A/fp.json" "$A/fp-debug.json"
  step fingerprint-lock 60 lockstep fingerprint --lock requirements/cuda.txt
  python3 - "$A/fp.json" <<'EOF'
import json, sys
fp = json.load(open(sys.argv[1]))
def walk(d, p=""):
    for k, v in d.items():
        if isinstance(v, dict):
            walk(v, f"{p}{k}.")
        elif any(w in (p + k).lower() for w in ("gpu", "nvml", "cuda", "nccl", "driver", "matmul", "pci", "uuid", "cudnn")):
            print(f"  {p}{k} = {str(v)[:100]}")
walk(fp)
EOF
fi

# 5. a one-rank NCCL flight-recorder dump through lockstep's own call, read back by lockstep
# forensics; the sizes of both of torch's dumps say which recorder holds the entries
if want fr; then
  mkdir -p "$A/fr"
  cat >"$A/fr.py" <<'EOF'
import os, pickle, sys, torch, torch.distributed as dist
from lockstep.compat import dump_flight_recorder
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(1024, device="cuda")
dist.all_reduce(x)
dist.broadcast(torch.arange(64, device="cuda", dtype=torch.float32), 0)
out = [torch.empty(256, device="cuda")]
dist.all_gather(out, torch.full((256,), 2.0, device="cuda"))
dist.barrier()
torch.cuda.synchronize()
c10d = torch._C._distributed_c10d
for name in ("_dump_fr_trace", "_dump_nccl_trace"):
    f = getattr(c10d, name, None)
    if f is not None:
        d = pickle.loads(f(includeCollectives=True, includeStackTraces=False, onlyActive=False))
        print(name, "entries", len(d.get("entries", [])), "pgs", len(d.get("pg_config", {})))
open(os.path.join(sys.argv[1], "nccl_trace_rank_0"), "wb").write(dump_flight_recorder())
dist.destroy_process_group()
EOF
  step fr-dump 60 env TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_FR_BUFFER_SIZE=2000 \
    torchrun --standalone --nproc-per-node 1 "$A/fr.py" "$A/fr"
  step fr-read 30 lockstep forensics hang "$A/fr"
fi

# 6. what moves an fp32 run on a GPU: each noise-floor perturbation alone (issue 35)
if want floor; then
  step floor 240 python3 benchmarks/gpu_noise_floor.py --steps 8 --out "$A/floor" \
    --parts "${FLOOR_PARTS:-script,harness}"
fi

# 2a. the smoke tier on ddp (no DeepSpeed op needed)
if want smoke-ddp; then
  step smoke-ddp 150 python3 -m pytest -p no:cacheprovider -m smoke -rs -q \
    tests/checks/test_gpu_tiers.py -k ddp --junitxml "$A/smoke-ddp.xml"
fi

# 2b. the smoke tier on the ZeRO engines and fsdp: determinism, resume, clip
if want smoke-zero; then
  echo "=== waiting for DeepSpeed's op builds (left: $(left)s)"
  wait "$BUILD"
  tail -3 "$A/ds-build.log"
  step smoke-zero 300 python3 -m pytest -p no:cacheprovider -m smoke -rs -q \
    tests/checks/test_gpu_tiers.py -k "fsdp or zero1 or zero2 or zero3" \
    --junitxml "$A/smoke-zero.xml"
fi

# 3. throughput and MFU against a plain torch loop, same model and batch (989: bf16 dense)
if want bench; then
  step bench 150 torchrun --standalone --nproc-per-node 1 benchmarks/bench_harness.py \
    --engines "$ENGINES" --preset gpt2-small-bench --seq-len 128 --micro 16 \
    --rounds "$ROUNDS" --block 10 --peak-tflops 989
fi

# 4. a GPU gate: a golden of 10 repeats (3 gave a 29% threshold on an H200), an A/A check, a
# planted 10% slowdown, once as a sleep and once as a busy wait (CPU work in the input
# pipeline: a sleep that cost 4x its length on the first run may be the CPU's idle states)
if want gate; then
  G=(--nproc 1 --dir "$A/gates" --set 'data.factory="planted_slowdown:planted"')
  for one in $GATE_SETS; do G+=(--set "$one"); done
  export PYTHONPATH="$PYTHONPATH:$PWD/benchmarks"
  GATE=$(basename "$GATE_CONFIG" .toml)
  step gate-record 240 lockstep gate record "$GATE" "$GATE_CONFIG" "${G[@]}" --repeats "$REPEATS"
  step gate-check-aa 50 lockstep gate check "$GATE" "$GATE_CONFIG" "${G[@]}" \
    --json "$A/gate-aa.json"
  WAIT=$(python3 - "$A/gates" <<'EOF'
import glob, json, sys
for f in glob.glob(f"{sys.argv[1]}/*/*.json"):
    print(round(0.10 * json.load(open(f))["perf"]["step_time_s"]["center"], 6))
    break
else:
    print(0)
EOF
  )
  echo "planted wait per step: ${WAIT}s"
  for kind in $SLOW_KINDS; do
    spin=0
    [ "$kind" = spin ] && spin=1
    step "gate-check-$kind" 60 env PLANTED_WAIT_S="$WAIT" PLANTED_EVERY=32 PLANTED_SPIN=$spin \
      lockstep gate check "$GATE" "$GATE_CONFIG" "${G[@]}" --json "$A/gate-$kind.json"
  done
fi

echo "=== done at $(date +%T), $(($(date +%s) - START))s"
