# shellcheck shell=bash
# Optional component `containers` (`setup.sh containers`, run by
# scripts/test-compose.sh): the container runtime that runs docker-compose.yml
# for real on a Debian 12 machine without a Docker engine.
#
# - podman + buildah (OCI images and containers, Docker-compatible API served
#   by `podman system service`), runc as the OCI runtime (crun 1.8 refuses the
#   hybrid cgroup setup of some VMs), netavark + aardvark-dns (the compose
#   network and its service-name DNS), debootstrap (the local Debian base
#   image: testbed/images/build-base.sh), docker-compose (Debian's v1,
#   1.29.2, which speaks the Docker API and reads compose spec files with
#   profiles and service_completed_successfully), iptables (netavark's NAT).
# - containers.conf with the settings a VM without systemd and without
#   CAP_SYS_RESOURCE needs: ulimits podman can
#   grant, runc, cgroupfs + file events. It lives in the machine cache and is
#   selected with CONTAINERS_CONF by the scripts (never /etc/containers).
#
# Every step checks first; a second run touches no network.

OPTIONAL+=(containers)

component_containers() {
    need_apt podman buildah runc netavark aardvark-dns debootstrap docker-compose iptables uidmap
    after_install check_containers
}

# Where the machine-level container state lives (images, layers, the local
# base's rootfs): outside the repository, shared by every clone.
containers_cache() { echo "${POLYCORN_CACHE:-/var/cache/polycorn}/containers"; }

check_containers() {
    local dir conf want
    dir=$(containers_cache)
    conf="$dir/containers.conf"
    mkdir -p "$dir"
    want='# Written by scripts/setup.d/containers.sh; selected with CONTAINERS_CONF.
[containers]
# podman lowers its own RLIMIT_NPROC at start-up and cannot raise it again
# for the container without CAP_SYS_RESOURCE.
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
# crun 1.8 fails with "cgroups in hybrid mode not supported".
runtime = "runc"
# No systemd as PID 1.
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
# Debian installs a CNI config with podman but not the CNI plugins; without
# this podman may pick CNI (and it warns about the CNI config on every call).
network_backend = "netavark"'
    if [[ ! -f $conf || "$(cat "$conf")" != "$want" ]]; then
        printf '%s\n' "$want" >"$conf"
    fi
    command -v podman >/dev/null || die "podman missing after install"
    command -v docker-compose >/dev/null || die "docker-compose missing after install"
    SUMMARY+=("containers: podman $(podman --version | awk '{print $3}'), buildah $(buildah --version | awk '{print $3}'), docker-compose $(docker-compose version --short 2>/dev/null), runc $(runc --version | awk 'NR==1{print $3}'); config $conf")
}
