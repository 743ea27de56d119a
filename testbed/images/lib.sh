# shellcheck shell=bash
# Shared by testbed/images/build-base.sh and scripts/test-compose.sh: one
# podman storage for the local images (outside the repository, in the
# machine cache; override with POLYCORN_CACHE), the containers.conf that
# scripts/setup.d/containers.sh writes, and the names of the local images.
#
# The storage is selected with --root/--runroot flags rather than a
# storage.conf: with CONTAINERS_STORAGE_CONF every `podman run` hung for
# 20 s on our machines ("Exceeded conmon timeout waiting for container to
# exit").

PC_CACHE=${POLYCORN_CACHE:-/var/cache/polycorn}
PC_CTR_DIR=$PC_CACHE/containers
PC_CTR_ROOT=${POLYCORN_PODMAN_ROOT:-$PC_CTR_DIR/storage}
PC_CTR_RUNROOT=${POLYCORN_PODMAN_RUNROOT:-/run/polycorn-podman}
export CONTAINERS_CONF=$PC_CTR_DIR/containers.conf

# The local stand-ins of the public base images (their tags say which);
# used by the scripts that source this file.
# shellcheck disable=SC2034
PC_BASE_IMAGE=localhost/polycorn-base:bookworm
# shellcheck disable=SC2034
PC_PYTHON_IMAGE=localhost/polycorn-python:3.11-bookworm
# The Rust builder is tagged with the host toolchain it was made from.
pc_rust_image() { echo "localhost/polycorn-rust:$(rustc --version | awk '{print $2}')-bookworm"; }

pc_podman() { podman --root "$PC_CTR_ROOT" --runroot "$PC_CTR_RUNROOT" "$@"; }
pc_buildah() { buildah --root "$PC_CTR_ROOT" --runroot "$PC_CTR_RUNROOT" "$@"; }
