#!/usr/bin/env bash
# The docker tier, end to end, both images, with a real Docker engine and no registry on the
# network:
#   1. engine: use a running one, else install Debian's docker.io and start dockerd
#      (no iptables, own data root, sockets and pidfile; stopped again on exit);
#   2. base: debootstrap a minimal Debian bookworm, `docker import` it and push it to a
#      throwaway local registry, so the build gets its base as tag@sha256:<manifest digest>
#      through CPU_BASE_IMAGE, exactly as docker/base.lock pins debian:bookworm-slim (both
#      images start from it);
#   3. wheelhouses: `pip download --require-hashes` against requirements/cpu.txt and cuda.txt
#      for CPython 3.11 manylinux x86_64, served on loopback; pip inside the build checks every
#      hash again;
#   4. `docker buildx build` of the cpu target with docker-bake.hcl's variables (docker/build-args.sh
#      gives the content-addressed tag) pushes to the local registry and writes --metadata-file;
#      ci/image-digest.py names the digest (buildx comes from Debian trixie, pinned by sha256);
#   5. run by that digest: the image's lock is byte-identical to requirements/cpu.txt and its
#      manifest and labels agree; `lockstep preflight --nproc 2`; a 2-rank ZeRO smoke training;
#   6. the cuda target, built the same way but loaded into the engine (not pushed: its ~3 GB of
#      layers would be compressed for nothing the tier checks) and run by its image ID: lock,
#      manifest (the minimum driver too), labels, the NVIDIA toolkit's variables; exactly one
#      libnccl.so*; `lockstep fingerprint` reports the CUDA, cuDNN and NCCL the lock pins;
#      `lockstep preflight --nproc 2` (gloo, no GPU here). Then that each CUDA check can fail:
#      a lock naming another NCCL fails the fingerprint check, and a test build that plants a
#      second libnccl.so.2 fails with one line naming both copies.
# Where Docker cannot start, this fails loudly; it never skips.
#
# `ci/docker-tier.sh --prepare` does steps 1 to 3 (the CPU wheelhouse only) and builds the images' shared first stage (its
# apt packages) into the build cache and the registry, then stops: what waits on the network, so
# that `.ci/run` can do it while the tests' venv installs; the tier proper finds it all there.
#
# Cached between runs under $LOCKSTEP_DOCKER_CACHE (default ~/.cache/lockstep/docker): the
# base rootfs tarball, the wheelhouses (keyed by each lock's digest), buildx, the engine's data
# root (its build cache) and the local registry's storage. A fresh machine has none of it.
# buildx's .deb is checked against its pinned sha256 and the binary unpacked from it on every
# run; the rootfs tarball against the sha256 recorded when it was made, and the engine's base
# image against that same sha256 (a label); see ci/cache-verify.sh.
# Environment knobs: LOCKSTEP_DOCKER_CACHE, LOCKSTEP_DOCKER_STORAGE (overlay2, else vfs), LOCKSTEP_REGISTRY_PORT (5099),
# LOCKSTEP_WHEELHOUSE_PORT (5098), LOCKSTEP_DOCKER_SMOKE (smoke/cpu-zero2.toml), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PREPARE=
case ${1:-} in
--prepare) PREPARE=1 ;;
"") ;;
*)
	echo "usage: ci/docker-tier.sh [--prepare]" >&2
	exit 2
	;;
esac
# shellcheck source=ci/cache-verify.sh
source ci/cache-verify.sh

CACHE=${LOCKSTEP_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/docker}
REGISTRY_PORT=${LOCKSTEP_REGISTRY_PORT:-5099}
WHEELHOUSE_PORT=${LOCKSTEP_WHEELHOUSE_PORT:-5098}
SMOKE_CONFIG=${LOCKSTEP_DOCKER_SMOKE:-smoke/cpu-zero2.toml}
DEBIAN_MIRROR=${LOCKSTEP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
BUILDX_DEB=pool/main/d/docker-buildx/docker-buildx_0.13.1+ds1-3_amd64.deb
BUILDX_DEB_SHA256=fcf8c48204d1603c8f209451d7827eb91bf30759578baf7704e9e1a87e5f1d7f
PYTHON=${PYTHON:-python3}
LOCK=requirements/cpu.txt
CUDA_LOCK=requirements/cuda.txt
REGISTRY=127.0.0.1:${REGISTRY_PORT}
# CPU_BASE_IMAGE / CPU_TAG / ... arrive from docker/build-args.sh; anything set outside is dropped.
unset CPU_BASE_IMAGE CUDA_BASE_IMAGE

T0=$SECONDS
step() { printf '\n== docker-tier [%3ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() {
	echo "docker-tier: error: $*" >&2
	exit 1
}

mkdir -p "$CACHE"
exec 9>"$CACHE/tier.lock"
flock -w 1200 9 || die "another docker tier holds $CACHE/tier.lock"
RUN_DIR=$(mktemp -d /tmp/lockstep-docker.XXXXXX) # short: dockerd's sockets live under it
BG_PIDS=()
DOCKERD_PID=

cleanup() {
	local status=$?
	set +e
	for pid in "${BG_PIDS[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
	if [[ -n $DOCKERD_PID ]]; then
		# Keep this run's image (the next run's layers); drop superseded tags, whatever that
		# leaves dangling, and BuildKit cache beyond a bound. A --prepare run leaves its tags to the tier proper.
		[[ -n $PREPARE ]] || docker images --format '{{.Repository}}:{{.Tag}}' |
			grep -E '(^|/)lockstep-(cpu|cuda)(-build|-base)?:' |
			grep -vxF -e "${image:-none}" -e "${cuda_image:-none}" |
			xargs -r docker rmi >/dev/null 2>&1
		docker buildx prune -f --keep-storage 24gb >/dev/null 2>&1
		docker image prune -f >/dev/null 2>&1
		kill "$DOCKERD_PID" 2>/dev/null
		for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
		kill -0 "$DOCKERD_PID" 2>/dev/null && kill -9 "$DOCKERD_PID"
		mountpoint -q "$RUN_DIR/exec/netns/default" && umount "$RUN_DIR/exec/netns/default"
	fi
	rm -rf "$RUN_DIR"
	step "finished with exit status $status"
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The tier's Python steps (port, HTTP wait, bake and identity checks): ci/docker-tier.py.
tier_py() { "$PYTHON" ci/docker-tier.py "$@"; }
port_free() { tier_py port-free "$1"; }
wait_http() { tier_py wait-http "$1" "$2"; } # URL SECONDS

# ------------------------------------------------------------------------------- 1. engine
step "engine"
missing=()
command -v docker >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v docker-registry >/dev/null || missing+=(docker-registry)
if ! docker info >/dev/null 2>&1; then
	command -v dockerd >/dev/null || missing+=(docker.io)
fi
if ((${#missing[@]})); then
	((EUID == 0)) || die "need ${missing[*]} (apt-get install them, or run as root)"
	echo "installing ${missing[*]} from Debian"
	apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		"${missing[@]}" >"$RUN_DIR/apt.log" 2>&1 || {
		tail -20 "$RUN_DIR/apt.log" >&2
		die "apt-get install ${missing[*]} failed"
	}
fi
if docker info >/dev/null 2>&1; then
	echo "using the running engine ($(docker info --format '{{.ServerVersion}}, {{.Driver}}'))"
else
	((EUID == 0)) || die "no Docker engine answers and starting dockerd needs root"
	export DOCKER_HOST=unix://$RUN_DIR/docker.sock
	for driver in ${LOCKSTEP_DOCKER_STORAGE:-overlay2 vfs}; do
		dockerd --iptables=false --ip-masq=false --bridge=none --storage-driver="$driver" \
			--data-root "$CACHE/engine-$driver" --exec-root "$RUN_DIR/exec" \
			--pidfile "$RUN_DIR/dockerd.pid" -H "$DOCKER_HOST" >"$RUN_DIR/dockerd.log" 2>&1 &
		DOCKERD_PID=$!
		for _ in $(seq 60); do
			docker info >/dev/null 2>&1 && break
			kill -0 "$DOCKERD_PID" 2>/dev/null || break
			sleep 1
		done
		docker info >/dev/null 2>&1 && break
		echo "dockerd with $driver did not start:" >&2
		tail -5 "$RUN_DIR/dockerd.log" >&2
		kill "$DOCKERD_PID" 2>/dev/null && wait "$DOCKERD_PID" 2>/dev/null
		DOCKERD_PID=
		mountpoint -q "$RUN_DIR/exec/netns/default" && umount "$RUN_DIR/exec/netns/default"
	done
	[[ -n $DOCKERD_PID ]] || die "Docker's engine did not start (log above); the docker tier cannot run"
	echo "started dockerd $(docker info --format '{{.ServerVersion}} ({{.Driver}})') pid $DOCKERD_PID"
fi

# The registry's storage is cached (a warm push uploads only new layers) and dropped whenever
# the docker/ files or the lock change, so old image layers do not pile up.
registry_key=$(cat docker/Dockerfile docker/*.sh docker/*.py docker/*.env "$LOCK" | sha256sum | cut -c1-16)
if [[ $(cat "$CACHE/registry.key" 2>/dev/null) != "$registry_key" ]]; then
	rm -rf "$CACHE/registry"
	echo "$registry_key" >"$CACHE/registry.key"
fi
port_free "$REGISTRY_PORT" || die "port $REGISTRY_PORT is taken: set LOCKSTEP_REGISTRY_PORT"
cat >"$RUN_DIR/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $CACHE/registry}}
http: {addr: "$REGISTRY"}
EOF
docker-registry serve "$RUN_DIR/registry.yml" >"$RUN_DIR/registry.log" 2>&1 &
BG_PIDS+=($!)
wait_http "http://$REGISTRY/v2/" 30

# ------------------------------------------------------------ 2. wheelhouses (in background)
# pip download and debootstrap all mostly wait on the network: run them side by side.
wheelhouse_of() { echo "$CACHE/wheelhouse/$1-$(sha256sum "requirements/$1.txt" | cut -c1-16)"; }
make_wheelhouse() { # VARIANT
	local variant=$1 lock=requirements/$1.txt wheelhouse
	wheelhouse=$(wheelhouse_of "$variant")
	if [[ ! -f $wheelhouse/.complete ]]; then
		local platforms=() download
		for minor in $(seq 5 36); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
		download=("$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --require-hashes
			--python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none
			"${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux2010_x86_64
			--platform manylinux1_x86_64 -r "$lock" -d "$wheelhouse.partial")
		rm -rf "$wheelhouse.partial"
		# torch's CPU build is on PyTorch's own index, not PyPI (this machine has it in find-links).
		"${download[@]}" 2>"$RUN_DIR/pip-$variant.log" ||
			"${download[@]}" --extra-index-url "$TORCH_CPU_INDEX" 2>>"$RUN_DIR/pip-$variant.log" || {
			grep -v '^WARNING: Location' "$RUN_DIR/pip-$variant.log" | tail -20 >&2
			die "pip download against $lock failed"
		}
		touch "$wheelhouse.partial/.complete"
		rm -rf "$wheelhouse"
		mv "$wheelhouse.partial" "$wheelhouse"
		find "$CACHE/wheelhouse" -mindepth 1 -maxdepth 1 -name "$variant-*" ! -name "${wheelhouse##*/}" -exec rm -rf {} +
	else
		echo "cached $wheelhouse"
	fi
	echo "$lock: $(find "$wheelhouse" -type f -name '*.*' ! -name .complete | wc -l) files, $(du -sh "$wheelhouse" | cut -f1)"
}
WHEELHOUSE_PIDS=()
# The CUDA wheelhouse (2.8 GB, hashed as it comes) is fetched by the tier proper, not by the
# --prepare that runs beside the CPU tier's tests: on 2 cores that load made a timing test flake.
VARIANTS=(cpu cuda)
[[ -z $PREPARE ]] || VARIANTS=(cpu)
for variant in "${VARIANTS[@]}"; do
	step "wheelhouse for requirements/$variant.txt (in the background)"
	make_wheelhouse "$variant" >"$RUN_DIR/wheelhouse-$variant.log" 2>&1 &
	WHEELHOUSE_PIDS+=($!)
	BG_PIDS+=($!)
done

# --------------------------------------------------------------------------------- 3. base
step "base image (debootstrap bookworm minbase, docker import, push for its digest)"
rootfs_tar=$CACHE/base/debian-bookworm-minbase.tar
if [[ -e $rootfs_tar ]]; then
	verify_recorded "$rootfs_tar" || case $? in
	2)
		echo "making the rootfs again (the cached one predates recorded hashes)"
		rm -f "$rootfs_tar"
		;;
	*) die "the cached rootfs is not the one this tier made: delete $CACHE/base to make it again" ;;
	esac
fi
if [[ ! -e $rootfs_tar ]]; then
	mkdir -p "$CACHE/base"
	debootstrap --variant=minbase bookworm "$RUN_DIR/rootfs" "$DEBIAN_MIRROR" \
		>"$RUN_DIR/debootstrap.log" 2>&1 || {
		tail -20 "$RUN_DIR/debootstrap.log" >&2
		die "debootstrap failed"
	}
	# As slim as debian:bookworm-slim: no package lists, no downloaded .debs.
	rm -rf "$RUN_DIR"/rootfs/var/lib/apt/lists/* "$RUN_DIR"/rootfs/var/cache/apt/archives/*.deb
	tar --numeric-owner -C "$RUN_DIR/rootfs" -cf "$rootfs_tar.partial" .
	rm -f "$rootfs_tar.sha256"
	mv "$rootfs_tar.partial" "$rootfs_tar"
	record_sha256 "$rootfs_tar"
	rm -rf "$RUN_DIR/rootfs"
else
	echo "cached rootfs $rootfs_tar (sha256 as recorded)"
fi
rootfs_sha256=$(<"$rootfs_tar.sha256")
base_name=$REGISTRY/lockstep-base/debian:bookworm-minbase
# The engine's data root is cached too: its base image counts only if imported from this tarball.
label=io.lockstep.rootfs.sha256
if [[ $(docker image inspect --format "{{index .Config.Labels \"$label\"}}" "$base_name" 2>/dev/null) != "$rootfs_sha256" ]]; then
	docker import --change 'CMD ["/bin/bash"]' --change "LABEL $label=$rootfs_sha256" \
		"$rootfs_tar" "$base_name" >/dev/null
fi
base_digest=$(docker push "$base_name" | sed -n 's/.*digest: \(sha256:[0-9a-f]\{64\}\).*/\1/p')
[[ -n $base_digest ]] || die "pushing the base image gave no digest"
export CPU_BASE_IMAGE=$base_name@$base_digest
echo "CPU_BASE_IMAGE=$CPU_BASE_IMAGE"

step "wheelhouses ready?"
for i in "${!VARIANTS[@]}"; do
	variant=${VARIANTS[$i]}
	wait "${WHEELHOUSE_PIDS[$i]}" || {
		cat "$RUN_DIR/wheelhouse-$variant.log" >&2
		die "the $variant wheelhouse could not be made"
	}
	cat "$RUN_DIR/wheelhouse-$variant.log"
done
port_free "$WHEELHOUSE_PORT" || die "port $WHEELHOUSE_PORT is taken: set LOCKSTEP_WHEELHOUSE_PORT"
# One server for both; each build's pip gets its own wheelhouse's folder as find-links.
wheel_links() { echo "http://127.0.0.1:$WHEELHOUSE_PORT/$(basename "$(wheelhouse_of "$1")")/"; }
"$PYTHON" -m http.server --bind 127.0.0.1 --directory "$CACHE/wheelhouse" "$WHEELHOUSE_PORT" \
	>"$RUN_DIR/wheelhouse.log" 2>&1 &
BG_PIDS+=($!)
wait_http "$(wheel_links cpu)" 30

# -------------------------------------------------------------------------------- 4. build
# buildx, as for a real registry: BuildKit (the engine's own, through buildx's docker driver)
# builds the `cpu` target from the repository root (BuildKit honours
# docker/Dockerfile.dockerignore, so .venv and .git stay out), pushes it to the loopback
# registry and writes --metadata-file, from which ci/image-digest.py takes the digest.
step "buildx"
install_buildx() {
	# Debian bookworm has no buildx; trixie's package is one static binary (needs glibc >= 2.34).
	# Pinned by version and sha256. The .deb is cached; on every run it is checked against the
	# pin and the binary unpacked from it into this run's folder (never installed), so what runs
	# is always the pinned build, whatever happened to the cache since.
	local deb=$CACHE/buildx/${BUILDX_DEB##*/}
	rm -rf "$CACHE/buildx/root" # where earlier versions of the tier unpacked it, unchecked
	if [[ ! -f $deb ]]; then
		mkdir -p "$CACHE/buildx"
		curl -fsS --retry 3 -o "$deb.partial" "$DEBIAN_MIRROR/$BUILDX_DEB" ||
			die "cannot download $DEBIAN_MIRROR/$BUILDX_DEB (superseded in Debian? update BUILDX_DEB and BUILDX_DEB_SHA256)"
		verify_pinned "$deb.partial" "$BUILDX_DEB_SHA256" ||
			die "$BUILDX_DEB does not match its pinned sha256"
		mv "$deb.partial" "$deb"
	fi
	verify_pinned "$deb" "$BUILDX_DEB_SHA256" ||
		die "the cached $deb does not match its pinned sha256: delete it to download it again"
	dpkg-deb -x "$deb" "$RUN_DIR/buildx"
	mkdir -p "$DOCKER_CONFIG/cli-plugins"
	ln -sf "$RUN_DIR/buildx/usr/libexec/docker/cli-plugins/docker-buildx" \
		"$DOCKER_CONFIG/cli-plugins/docker-buildx"
}
export DOCKER_CONFIG=$RUN_DIR/docker-config
mkdir -p "$DOCKER_CONFIG"
if ! docker buildx version >/dev/null 2>&1; then
	install_buildx
fi
docker buildx version || die "docker buildx does not run"

set -a
# shellcheck source=/dev/null
source <(docker/build-args.sh)
set +a
image=$REGISTRY/lockstep-cpu:$CPU_TAG
cuda_image=$REGISTRY/lockstep-cuda:$CUDA_TAG
step "docker buildx bake --print: docker/docker-bake.hcl resolves to the build below"
REGISTRY=$REGISTRY/ docker buildx bake -f docker/docker-bake.hcl --print cpu cuda \
	>"$RUN_DIR/bake-print.json" 2>"$RUN_DIR/bake-print.log" || {
	cat "$RUN_DIR/bake-print.log" >&2
	die "docker buildx bake cannot read docker/docker-bake.hcl"
}
tier_py bake "$RUN_DIR/bake-print.json" --image "$image" --base-image "$CPU_BASE_IMAGE" \
	--lock-sha256 "$CPU_LOCK_SHA256" --cuda-image "$cuda_image" \
	--cuda-lock-sha256 "$CUDA_LOCK_SHA256" ||
	die "docker-bake.hcl disagrees with the tier's build"
if [[ -n $PREPARE ]]; then
	# Pushed too: the tier's push then mounts that layer (about 0.5 GB) instead of compressing it.
	step "docker buildx build, the cpu-base stage (apt packages, both images'), pushed"
	docker buildx build --progress plain --network host -f docker/Dockerfile --target cpu-base \
		--platform linux/amd64 --build-arg CPU_BASE_IMAGE -t "$REGISTRY/lockstep-cpu-base:$CPU_TAG" \
		--push . >"$CACHE/last-prepare.log" 2>&1 || {
		tail -20 "$CACHE/last-prepare.log" >&2
		die "docker buildx build --target cpu-base failed (log: $CACHE/last-prepare.log)"
	}
	step "prepared: engine, base image, wheelhouses, buildx and the cpu-base stage"
	exit 0
fi
step "docker buildx build, the cpu target ($image)"
: >"$CACHE/last-build.log"
# Bake's HCL is the interface for real registries; buildx 0.13 (Debian's) has no `network` key
# for bake, and the wheelhouse is reachable only on the host's loopback, so the tier runs the
# same build as `docker buildx build` with the variables of docker/docker-bake.hcl's cpu target.
docker buildx build --progress plain --network host -f docker/Dockerfile --target cpu \
	--platform linux/amd64 -t "$image" --push --metadata-file "$RUN_DIR/bake-metadata.json" \
	--build-arg CPU_BASE_IMAGE --build-arg CPU_BASE_DIGEST \
	--build-arg LOCK_SHA256="$CPU_LOCK_SHA256" --build-arg LOCKSTEP_IMAGE="$image" \
	--build-arg GIT_REVISION --build-arg BUILD_TIME \
	--build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS="$(wheel_links cpu)" \
	. >>"$CACHE/last-build.log" 2>&1 || {
	tail -40 "$CACHE/last-build.log" >&2
	die "docker buildx build --target cpu failed (log: $CACHE/last-build.log)"
}
echo "built and pushed ($(grep -c ' CACHED$' "$CACHE/last-build.log" || true) steps from the build cache)"
ref=$("$PYTHON" ci/image-digest.py "$RUN_DIR/bake-metadata.json" cpu --name "$image") || {
	echo "metadata written by buildx:" >&2
	cat "$RUN_DIR/bake-metadata.json" >&2
	die "no launch reference in the build metadata"
}
echo "launch reference: $ref"

# --------------------------------------------------------------------------- 5. run by digest
in_image() { docker run --rm --network host --shm-size=1g "$@"; }

# check_identity REF IMAGE LOCK PREFIX: the lock in the image byte for byte, and the manifest
# (what docker/write-manifest.py makes of the tier's inputs) as its labels carry it; both images.
check_identity() {
	local ref=$1 image=$2 lock=$3 prefix=$4
	in_image "$ref" cat "/etc/lockstep/$lock" | cmp - "$lock" ||
		die "the lock in the ${prefix:+CUDA }image differs from $lock"
	in_image "$ref" cat /etc/lockstep/image-manifest.json >"$RUN_DIR/${prefix}manifest.json"
	docker image inspect --format '{{json .Config.Labels}}' "$ref" >"$RUN_DIR/${prefix}labels.json"
	tier_py identity "$RUN_DIR/${prefix}manifest.json" "$RUN_DIR/${prefix}labels.json" \
		--image "$image" --base-image "$CPU_BASE_IMAGE" --base-digest "$CPU_BASE_DIGEST" \
		--lock "$lock" --git-revision "$GIT_REVISION" --build-time "$BUILD_TIME" ||
		die "${prefix:+CUDA }image identity check failed"
}

step "identity: lock, manifest and labels"
check_identity "$ref" "$image" "$LOCK" ""
in_image "$ref" lockstep --version

step "lockstep preflight --nproc 2 (in the image)"
in_image "$ref" lockstep preflight --nproc 2

step "lockstep train $SMOKE_CONFIG --nproc 2 (ZeRO smoke, in the image)"
[[ -f $SMOKE_CONFIG ]] || die "$SMOKE_CONFIG is missing: set LOCKSTEP_DOCKER_SMOKE"
in_image -v "$ROOT/smoke:/home/lockstep/smoke:ro" "$ref" \
	lockstep train "$SMOKE_CONFIG" --nproc 2

# ----------------------------------------------------------------------- 6. the CUDA image
# shellcheck source=ci/docker-tier-cuda.sh
source ci/docker-tier-cuda.sh
step "docker tier passed"
