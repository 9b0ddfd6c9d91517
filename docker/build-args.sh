#!/usr/bin/env bash
# Print the build arguments and content-addressed tags of both images as KEY=value lines.
# Used by bake (`set -a; source <(docker/build-args.sh); set +a`) and by ci/docker-tier.sh, so
# the tag logic lives in one place. Run from anywhere; paths are the repository's.
#
# A tag is env-<16 hex>: the sha256 over the lock, every file under docker/ that shapes the
# image, and the base image reference (one base for both: CPU_BASE_IMAGE). Same tag means same environment; the source revision
# is in the image's labels and manifest, and a launch goes by digest anyway.
# CPU_BASE_IMAGE from the environment overrides docker/base.lock.
set -euo pipefail
cd "$(dirname "$0")/.."

base_lock() { sed -n "s/^$1=//p" docker/base.lock; }
sha256() { sha256sum | cut -d' ' -f1; }

CPU_BASE_IMAGE=${CPU_BASE_IMAGE:-$(base_lock CPU_BASE_IMAGE)}
image_files=(docker/Dockerfile docker/install-lock.sh docker/write-manifest.py docker/check-one-nccl.sh
	docker/lock-parts.py docker/deepspeed-build.env)

base=$CPU_BASE_IMAGE
if [[ $base != *@sha256:* ]]; then
	echo "build-args: CPU_BASE_IMAGE=$base is not pinned by digest (NAME:TAG@sha256:...)" >&2
	exit 2
fi
echo "CPU_BASE_IMAGE=${base}"
echo "CPU_BASE_DIGEST=${base##*@}"
for variant in cpu cuda; do
	upper=${variant^^}
	lock=requirements/$variant.txt
	tag=$({ sha256sum "$lock" "${image_files[@]}"; echo "$base"; } | sha256 | cut -c1-16)
	echo "${upper}_LOCK_SHA256=sha256:$(sha256 <"$lock")"
	echo "${upper}_TAG=env-${tag}"
done

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && ! git diff --quiet HEAD -- 2>/dev/null; then
	revision="${revision}-dirty"
fi
echo "GIT_REVISION=${revision}"
if [[ -n ${SOURCE_DATE_EPOCH:-} ]]; then
	echo "BUILD_TIME=$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)"
else
	echo "BUILD_TIME=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
fi
