#!/usr/bin/env bash
# Local stand-ins for the public base images the Dockerfiles default to, for
# machines that cannot pull images (no registry but the package registries):
#
#   localhost/polycorn-base:bookworm          debian:bookworm-slim: debootstrap
#                                             --variant=minbase, podman import
#   localhost/polycorn-python:3.11-bookworm   python:3.11-slim-bookworm: the
#                                             base + Debian's python3.11 (the
#                                             same CPython minor version)
#   localhost/polycorn-rust:<ver>-bookworm    rust:<ver>-bookworm: the base +
#                                             build-essential + this machine's
#                                             Rust toolchain (rustc --version)
#
# Then scripts/test-compose.sh builds every image with
#   --build-arg RUNTIME_IMAGE=localhost/polycorn-base:bookworm (and the others).
#
#   testbed/images/build-base.sh [--force]
#
# Check-then-build: an image that exists is kept (--force rebuilds all three);
# the debootstrap rootfs is cached in ${POLYCORN_CACHE:-/var/cache/polycorn}/
# containers/rootfs-bookworm. Needs root and `bash scripts/setup.sh containers`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=testbed/images/lib.sh
source "$here/lib.sh"

force=0
case ${1:-} in
    --force) force=1 ;;
    "") ;;
    *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac
[[ $(id -u) -eq 0 ]] || { echo "build-base.sh: must run as root" >&2; exit 1; }
[[ -f $CONTAINERS_CONF ]] || { echo "build-base.sh: $CONTAINERS_CONF missing: run 'bash scripts/setup.sh containers'" >&2; exit 1; }
log() { printf '[build-base %s] %s\n' "$(date +%T)" "$*"; }
have_image() { ((force == 0)) && pc_podman image exists "$1"; }

MIRROR=${POLYCORN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${POLYCORN_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
rootfs=$PC_CTR_DIR/rootfs-bookworm

# ------------------------------------------------------------------ rootfs

build_rootfs() {
    local tmp=$rootfs.tmp
    rm -rf "$tmp"
    log "debootstrap --variant=minbase bookworm ($MIRROR)"
    debootstrap --variant=minbase --include=ca-certificates bookworm "$tmp" "$MIRROR" >"$PC_CTR_DIR/debootstrap.log" 2>&1 \
        || { tail -20 "$PC_CTR_DIR/debootstrap.log" >&2; return 1; }
    cat >"$tmp/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb $SECURITY_MIRROR bookworm-security main
EOF
    # Like the official slim images: no recommends, no docs, no apt caches.
    cat >"$tmp/etc/apt/apt.conf.d/90polycorn" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
EOF
    # The machine's TLS trust anchors that Debian's bundle lacks (e.g. the CA
    # of an egress proxy in front of the package registries), so that builds
    # inside reach PyPI and crates.io exactly as the host does.
    python3 - /etc/ssl/certs/ca-certificates.crt "$tmp/etc/ssl/certs/ca-certificates.crt" \
        "$tmp/usr/local/share/ca-certificates" <<'PY'
import pathlib, re, sys
pem = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
host = pem.findall(pathlib.Path(sys.argv[1]).read_text())
have = set(pem.findall(pathlib.Path(sys.argv[2]).read_text()))
out = pathlib.Path(sys.argv[3])
extra = [c for c in host if c not in have]
for i, c in enumerate(extra):
    (out / f"polycorn-host-{i}.crt").write_text(c + "\n")
print(f"{len(extra)} host trust anchor(s) added")
PY
    chroot "$tmp" update-ca-certificates >/dev/null
    chroot "$tmp" apt-get clean
    rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/*
    rm -rf "$rootfs"
    mv "$tmp" "$rootfs"
    touch "$rootfs/.polycorn-complete"
}

if ((force)) || [[ ! -e $rootfs/.polycorn-complete ]]; then
    build_rootfs
fi

# ------------------------------------------------------------------ images

if ! have_image "$PC_BASE_IMAGE"; then
    log "import $PC_BASE_IMAGE"
    tar --exclude=./.polycorn-complete -C "$rootfs" -c . | pc_podman import \
        --change 'CMD ["bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'LABEL org.opencontainers.image.description="Debian bookworm minbase (debootstrap), local stand-in for debian:bookworm-slim"' \
        - "$PC_BASE_IMAGE" >/dev/null
fi

# The builds below use apt inside the container: host networking reaches the
# Debian mirror as the host does.
if ! have_image "$PC_PYTHON_IMAGE"; then
    log "build $PC_PYTHON_IMAGE"
    pc_podman build --network host --pull=never -q -t "$PC_PYTHON_IMAGE" \
        --build-arg "BASE_IMAGE=$PC_BASE_IMAGE" -f "$here/python.Dockerfile" "$here" >/dev/null
fi

rust_image=$(pc_rust_image)
if ! have_image "$rust_image"; then
    toolchain=$(rustc --print sysroot)
    log "build $rust_image from $toolchain"
    ctr=$(pc_buildah from --pull-never "$PC_BASE_IMAGE")
    trap 'pc_buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
    pc_buildah run --network host "$ctr" -- sh -c \
        'apt-get update -q && apt-get install -y -q build-essential ca-certificates perl python3 libssl-dev pkg-config >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*'
    # The toolchain without its documentation (share/: 0.8 GB of HTML).
    for d in bin lib libexec etc; do
        [[ -d $toolchain/$d ]] && pc_buildah copy "$ctr" "$toolchain/$d" "/usr/local/rust/$d" >/dev/null
    done
    pc_buildah config \
        --env CARGO_HOME=/usr/local/cargo \
        --env PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --label "org.opencontainers.image.description=Debian bookworm + build-essential + rustc $(rustc --version | awk '{print $2}') (host toolchain), local stand-in for rust:bookworm" \
        "$ctr"
    pc_buildah run "$ctr" -- sh -c 'mkdir -p /usr/local/cargo/bin && rustc --version && cargo --version' >/dev/null
    pc_buildah commit -q --rm "$ctr" "$rust_image" >/dev/null
    trap - EXIT
fi

log "ready: $PC_BASE_IMAGE $PC_PYTHON_IMAGE $rust_image"
