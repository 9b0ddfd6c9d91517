# Build both lockstep images with content-addressed tags. From the repository root:
#
#   set -a; source <(docker/build-args.sh); set +a
#   REGISTRY=registry.example.com/team/ docker buildx bake -f docker/docker-bake.hcl \
#       --metadata-file out/bake.json --push cuda
#   python3 ci/image-digest.py out/bake.json cuda    # the NAME@sha256:... every node runs
#
# docker/build-args.sh computes every variable below (the tags hash the lock, docker/ and the
# base reference); an unset tag or base makes bake or the build fail rather than guess. Both
# targets start from the one base of docker/base.lock (CPU_BASE_IMAGE); linux/amd64 only (the
# CUDA lock's nvidia-* wheels are x86_64 builds).

variable "REGISTRY" {
  # Prefix of pushed names, with its trailing slash ("" builds local names only).
  default = ""
}
variable "CPU_TAG" { default = "" }
variable "CUDA_TAG" { default = "" }
variable "CPU_BASE_IMAGE" { default = "" }
variable "CPU_BASE_DIGEST" { default = "" }
variable "CPU_LOCK_SHA256" { default = "" }
variable "CUDA_LOCK_SHA256" { default = "" }
variable "GIT_REVISION" { default = "unknown" }
variable "BUILD_TIME" { default = "unknown" }

group "default" {
  targets = ["cpu", "cuda"]
}

target "_lockstep" {
  context    = "."
  dockerfile = "docker/Dockerfile"
  platforms  = ["linux/amd64"]
  args = {
    GIT_REVISION = GIT_REVISION
    BUILD_TIME   = BUILD_TIME
  }
}

target "cpu" {
  inherits = ["_lockstep"]
  target   = "cpu"
  tags     = ["${REGISTRY}lockstep-cpu:${CPU_TAG}"]
  args = {
    CPU_BASE_IMAGE  = CPU_BASE_IMAGE
    CPU_BASE_DIGEST = CPU_BASE_DIGEST
    LOCK_SHA256     = CPU_LOCK_SHA256
    LOCKSTEP_IMAGE  = "${REGISTRY}lockstep-cpu:${CPU_TAG}"
  }
}

target "cuda" {
  inherits = ["_lockstep"]
  target   = "cuda"
  tags     = ["${REGISTRY}lockstep-cuda:${CUDA_TAG}"]
  args = {
    CPU_BASE_IMAGE  = CPU_BASE_IMAGE
    CPU_BASE_DIGEST = CPU_BASE_DIGEST
    LOCK_SHA256     = CUDA_LOCK_SHA256
    LOCKSTEP_IMAGE  = "${REGISTRY}lockstep-cuda:${CUDA_TAG}"
  }
}
