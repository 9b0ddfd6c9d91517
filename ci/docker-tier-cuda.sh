# The docker tier's CUDA part (step 6), sourced by ci/docker-tier.sh after the CPU image passed:
# its engine, registry, wheelhouse server, build arguments and helpers (step, die, in_image,
# tier_py, wheel_links) are this file's too. No GPU is needed: what is checked is what the image
# holds and what torch reports as built.
# shellcheck shell=bash disable=SC2154

step "docker buildx build, the cuda target ($cuda_image), loaded into the engine"
: >"$CACHE/last-cuda-build.log"
docker buildx build --progress plain --network host -f docker/Dockerfile --target cuda \
	--platform linux/amd64 -t "$cuda_image" --load \
	--build-arg CPU_BASE_IMAGE --build-arg CPU_BASE_DIGEST \
	--build-arg LOCK_SHA256="$CUDA_LOCK_SHA256" --build-arg LOCKSTEP_IMAGE="$cuda_image" \
	--build-arg GIT_REVISION --build-arg BUILD_TIME \
	--build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS="$(wheel_links cuda)" \
	. >>"$CACHE/last-cuda-build.log" 2>&1 || {
	tail -40 "$CACHE/last-cuda-build.log" >&2
	die "docker buildx build --target cuda failed (log: $CACHE/last-cuda-build.log)"
}
# The image ID is the digest of its configuration, which names every layer by its digest.
cuda_ref=$(docker image inspect --format '{{.Id}}' "$cuda_image")
[[ $cuda_ref =~ ^sha256:[0-9a-f]{64}$ ]] || die "no image ID for $cuda_image"
echo "built ($(grep -c ' CACHED$' "$CACHE/last-cuda-build.log" || true) steps from the build cache): $cuda_ref, $(docker image inspect --format '{{.Size}}' "$cuda_ref" | numfmt --to=iec) uncompressed"

step "CUDA identity: lock, manifest (with the minimum driver), labels, toolkit variables, user"
check_identity "$cuda_ref" "$cuda_image" "$CUDA_LOCK" cuda-
docker image inspect --format '{{json .Config}}' "$cuda_ref" >"$RUN_DIR/cuda-config.json"
tier_py cuda-config "$RUN_DIR/cuda-config.json" || die "the CUDA image's configuration is not as built"

step "CUDA: exactly one libnccl.so* in the image (docker/check-one-nccl.sh, as root)"
in_image --user 0 "$cuda_ref" /opt/lockstep/build/check-one-nccl.sh ||
	die "the CUDA image does not hold exactly one NCCL"

step "CUDA: lockstep fingerprint --json reports the CUDA, cuDNN and NCCL that $CUDA_LOCK pins"
out=$RUN_DIR/cuda-out
mkdir -p "$out"
chmod 0777 "$out" # the image's user (uid 10001) writes the fingerprints
in_image -v "$out:/home/lockstep/out" "$cuda_ref" lockstep fingerprint \
	--lock "/etc/lockstep/$CUDA_LOCK" --json out/fingerprint.json >"$out/fingerprint.txt" || {
	cat "$out/fingerprint.txt" >&2
	die "lockstep fingerprint failed in the CUDA image"
}
cp "$out/fingerprint.json" "$CACHE/last-cuda-fingerprint.json" # kept for a look afterwards
tier_py cuda-stack "$out/fingerprint.json" --lock "$CUDA_LOCK" ||
	die "the CUDA image's stack is not its lock's"

step "CUDA: a lock naming another NCCL than the image holds fails that check"
sed -E 's/^(nvidia-nccl-cu[0-9]+)==[^ ]+/\1==2.0.0/' "$CUDA_LOCK" >"$out/other-nccl.txt"
! cmp -s "$CUDA_LOCK" "$out/other-nccl.txt" || die "found no nvidia-nccl pin in $CUDA_LOCK to change"
in_image -v "$out:/home/lockstep/out" "$cuda_ref" lockstep fingerprint \
	--lock out/other-nccl.txt --json out/other-nccl.json >/dev/null
if tier_py cuda-stack "$out/other-nccl.json" --lock "$out/other-nccl.txt" 2>"$out/other-nccl.err"; then
	die "the fingerprint check passed a lock naming NCCL 2.0.0"
fi
grep -q 'NCCL 2\.[0-9.]* built, 2\.0\.0 locked' "$out/other-nccl.err" || {
	cat "$out/other-nccl.err" >&2
	die "the fingerprint check failed without naming NCCL"
}
echo "failed as it must: $(cat "$out/other-nccl.err")"

step "CUDA: a test build planting a second libnccl.so.2 fails, naming both copies"
mkdir -p "$RUN_DIR/planted"
# The check the image's build runs, after a copy of the wheel's NCCL where a system one would be.
cat >"$RUN_DIR/planted/Dockerfile" <<PLANTED
FROM $cuda_image
USER 0
RUN cp "\$(find /opt/lockstep/venv -name libnccl.so.2)" /usr/lib/x86_64-linux-gnu/libnccl.so.2 \\
    && /opt/lockstep/build/check-one-nccl.sh
PLANTED
if docker buildx build --progress plain --network none -f "$RUN_DIR/planted/Dockerfile" \
	"$RUN_DIR/planted" >"$RUN_DIR/planted.log" 2>&1; then
	die "a build with a second libnccl.so.2 passed check-one-nccl.sh"
fi
planted=$(grep -o 'check-one-nccl: .*' "$RUN_DIR/planted.log" | head -1)
[[ $planted == *"/opt/lockstep/venv/"*"/libnccl.so.2"*" /usr/lib/x86_64-linux-gnu/libnccl.so.2" ]] || {
	tail -20 "$RUN_DIR/planted.log" >&2
	die "the planted build failed, but not with one line naming both copies"
}
echo "failed as it must: $planted"

step "CUDA: lockstep preflight --nproc 2 --lock (the image's own; gloo: no GPU here) in the image"
in_image "$cuda_ref" lockstep preflight --nproc 2 --lock "/etc/lockstep/$CUDA_LOCK"
