#!/usr/bin/env bash
# Installs what the build, the tests and the demo need on a Debian 12 machine.
#
# Every run checks first and installs only what is missing, so a second run
# takes well under a second and touches no network. `apt-get update` runs at
# most once, and only when something has to be installed.
#
# Adding a component: write a `component_<name>` function that calls
# `need_apt pkg...` (and registers a check with `after_install fn` if the
# package alone is not proof enough), then list it in COMPONENTS below.
set -euo pipefail

# Order matters only for the summary. `setup.sh NAME...` checks only those
# components, including the optional ones that a plain run skips
# (make bench-api runs `setup.sh bench`).
COMPONENTS=(base net origin radio lint rust python infra)
OPTIONAL=(bench)

PENDING=()       # Debian packages found missing, installed in one batch.
POST_CHECKS=()   # functions run once everything is installed.
SUMMARY=()

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

apt_installed() {
    # `install ok installed` is the only state in which the files are there;
    # `deinstall`/`half-configured` must be treated as missing.
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

need_apt() {
    local pkg
    for pkg in "$@"; do
        apt_installed "$pkg" || PENDING+=("$pkg")
    done
}

after_install() { POST_CHECKS+=("$@"); }

# ---------------------------------------------------------------- components

component_base() {
    # procps: pgrep/sysctl; psmisc: fuser/killall for debugging; jq: parse the
    # JSON the agents and iperf3 print; python3: small test helpers.
    need_apt procps psmisc jq python3 curl
}

component_net() {
    # The network-namespace testbed (testbed/netns): veths, routes, MPTCP
    # endpoints (iproute2), passenger interception (iptables/nftables),
    # reachability checks (ping), throughput (iperf3, mptcpize for kernel
    # MPTCP iperf3 runs: Debian's iperf3 3.12 has no --mptcp).
    need_apt iproute2 iptables nftables iputils-ping iperf3 mptcpize
    after_install check_kernel_net
}

check_kernel_net() {
    local mptcp
    mptcp=$(cat /proc/sys/net/mptcp/enabled 2>/dev/null || echo absent)
    SUMMARY+=("kernel MPTCP: net.mptcp.enabled=${mptcp}")
    # netem is not built into this kernel on our machines; say
    # so once here rather than letting a test discover it. Read from the
    # kernel config so that no qdisc is touched on the host.
    if [[ -r /proc/config.gz ]]; then
        if zgrep -qE '^CONFIG_NET_SCH_NETEM=(y|m)' /proc/config.gz; then
            SUMMARY+=("tc netem: in kernel config")
        else
            SUMMARY+=("tc netem: not in this kernel (link emulation must be user space)")
        fi
    fi
}

component_origin() {
    # The "Internet" origin servers of the testbed (testbed/origin). Debian 12's
    # `nginx` package has http_dav_module built in (PUT uploads);
    # `nginx-light` is only a transitional package that pulls `nginx` plus an
    # unrelated echo module, so it is not used.
    need_apt nginx
    after_install check_nginx_dav
    # A resolver for passengers' DNS through the tunnel (dnsmasq-base: the
    # binary without a service), and a real DNS client to query it.
    need_apt dnsmasq-base bind9-dnsutils
}

check_nginx_dav() {
    nginx -V 2>&1 | grep -q -- '--with-http_dav_module' \
        || die "nginx lacks http_dav_module; testbed/origin needs it for PUT uploads"
    SUMMARY+=("nginx: $(nginx -v 2>&1 | sed 's/^nginx version: //') with http_dav_module")
}

component_radio() {
    # The relay's gpsd source is tested against the real gpsd fed by its own
    # gpsfake (gpsd-clients), replaying relay-agent/tests/data/trip.nmea.
    need_apt gpsd gpsd-clients
}

component_lint() {
    need_apt shellcheck
}

component_rust() {
    # The proxy's Kafka client (rdkafka) builds its vendored librdkafka with
    # the C toolchain and make, against the system OpenSSL (TLS and
    # SASL/SCRAM to Kafka: libssl-dev, found with pkg-config).
    need_apt build-essential libssl-dev pkg-config
    after_install check_rust
}

# Python tools (bench/ analysis and plots; later the cloud services) are
# managed with uv and its lockfiles. uv itself comes from PyPI, pinned.
UV_VERSION=0.13.9

component_python() {
    need_apt python3-pip python3-venv
    after_install check_uv
}

check_uv() {
    local have=""
    command -v uv >/dev/null && have=$(uv --version | awk '{print $2}')
    if [[ $have != "$UV_VERSION" ]]; then
        log "installing uv $UV_VERSION from PyPI"
        python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" \
            || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "uv==$UV_VERSION" \
            || die "could not install uv $UV_VERSION with pip"
        hash -r
        command -v uv >/dev/null || die "uv installed but not on PATH (pip's script directory)"
    fi
    SUMMARY+=("uv: $(uv --version | awk '{print $2}')")
}

check_rust() {
    local cargo_home_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
    if ! command -v cargo >/dev/null && [[ -x "$cargo_home_bin/cargo" ]]; then
        # The Makefile puts this on PATH; a direct run of this script may not.
        PATH="$cargo_home_bin:$PATH"
    fi
    if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
        die "cargo/rustc not found. Install the Rust toolchain with rustup (https://rustup.rs) and put ~/.cargo/bin on PATH; this script does not download toolchains"
    fi

    local want have
    want=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$REPO_ROOT/Cargo.toml" | head -n1)
    have=$(rustc --version | awk '{print $2}')
    if [[ -n "$want" ]] && [[ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]]; then
        die "rustc $have is older than the workspace rust-version $want: run 'rustup update stable'"
    fi

    local comp missing=()
    cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
    cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
    if ((${#missing[@]})); then
        command -v rustup >/dev/null \
            || die "cargo ${missing[*]} missing and rustup not found: install them with your toolchain manager"
        log "rustup component add ${missing[*]}"
        rustup component add "${missing[@]}"
        for comp in "${missing[@]}"; do
            [[ $comp == rustfmt ]] && { cargo fmt --version >/dev/null 2>&1 || die "rustfmt still missing"; }
            [[ $comp == clippy ]] && { cargo clippy --version >/dev/null 2>&1 || die "clippy still missing"; }
        done
    fi
    SUMMARY+=("rust: $(rustc --version | awk '{print $2}') (workspace needs >= ${want:-?}), rustfmt+clippy present")
}

# The fleet's real third-party services, run on loopback by scripts/infra.sh
# for the tests, benchmarks and the demo: PostgreSQL 15 + PostGIS 3, Kafka
# (KRaft; its jars come from Maven Central, pinned in services/kafka/pom.xml,
# because Debian packages no Kafka) and Prometheus with promtool.
KAFKA_VERSION=4.3.1

component_infra() {
    # openssl: scripts/infra.sh makes the test CA and the servers' TLS certificates.
    need_apt postgresql-15 postgresql-15-postgis-3 postgresql-client-15 prometheus openjdk-17-jre-headless maven openssl
    after_install check_kafka
}

# Where the Kafka jars live: a cache outside the repository, shared by every
# clone on the machine (override with POLYCORN_CACHE).
kafka_libs_dir() { echo "${POLYCORN_CACHE:-/var/cache/polycorn}/kafka-$KAFKA_VERSION/libs"; }

check_kafka() {
    local libs stamp
    libs=$(kafka_libs_dir)
    stamp="$libs/.complete-$(sha256sum "$REPO_ROOT/services/kafka/pom.xml" | cut -c1-16)"
    if [[ ! -e $stamp ]]; then
        log "fetching Kafka $KAFKA_VERSION jars from Maven Central into $libs"
        rm -rf "$libs" && mkdir -p "$libs"
        mvn -q -B -f "$REPO_ROOT/services/kafka/pom.xml" \
            -Dmaven.repo.local="${POLYCORN_CACHE:-/var/cache/polycorn}/m2" \
            dependency:copy-dependencies -DoutputDirectory="$libs" \
            || die "could not fetch the Kafka jars with Maven (services/kafka/pom.xml)"
        touch "$stamp"
    fi
    ls "$libs"/kafka_2.13-"$KAFKA_VERSION".jar >/dev/null 2>&1 || die "Kafka jars incomplete in $libs"
    SUMMARY+=("kafka: $KAFKA_VERSION jars in $libs; postgis: $(dpkg-query -W -f='${Version}' postgresql-15-postgis-3); prometheus: $(dpkg-query -W -f='${Version}' prometheus)")
}

# Optional (`setup.sh bench`, run by make bench-api): make bench-api's load
# generator, vegeta, an open-loop constant-rate HTTP load tool, built from its
# Go module (pinned) with the Go toolchain into the machine's cache, shared by
# every clone (override with POLYCORN_CACHE).
VEGETA_VERSION=12.13.0

component_bench() {
    after_install check_vegeta
}

vegeta_bin() { echo "$(go_cache)/bin/vegeta"; }

check_vegeta() {
    go_install_pinned vegeta github.com/tsenart/vegeta/v12 github.com/tsenart/vegeta/v12 "$VEGETA_VERSION"
    SUMMARY+=("vegeta: $VEGETA_VERSION at $(vegeta_bin)")
}

# ---------------------------------------------------------------- Go tools
# Tools built from their Go modules (pinned) with the machine's Go toolchain
# (Debian 12's is too old; the image has one in /usr/local/go), with the
# module and build caches and the binaries in the machine cache, shared by
# every clone: vegeta here, helm, kubeconform and the chart's validators in
# setup.d/chart.sh.

go_cache() { echo "${POLYCORN_CACHE:-/var/cache/polycorn}/go"; }

go_tool() {
    if command -v go >/dev/null; then echo go; elif [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; else
        die "building $1 needs the Go toolchain (go on PATH or /usr/local/go/bin)"
    fi
}

# go_cached WHAT ARGS...: `go ARGS...` with its caches in the machine cache
# (WHAT names what is built, for the error when there is no toolchain).
go_cached() {
    local cache go
    cache=$(go_cache)
    go=$(go_tool "$1")
    shift
    GOPATH=$cache GOMODCACHE=$cache/pkg/mod GOCACHE=$cache/build GOTOOLCHAIN=local "$go" "$@"
}

# go_install_pinned BIN MODULE_PATH PACKAGE VERSION [LDFLAGS [CHECK]]
# Installs PACKAGE@vVERSION as $(go_cache)/bin/BIN. The binary is rebuilt
# unless `go version -m` shows the pinned module version and, if given, the
# command CHECK (which sees the binary's path in $1) succeeds: -ldflags are
# not recorded in a -trimpath build, so a check of their effect stands in
# for them.
go_install_pinned() {
    local bin=$1 mod=$2 pkg=$3 version=$4 ldflags="-s -w ${5:-}" check=${6:-true} dir
    dir=$(go_cache)/bin
    if ! go_cached "$bin" version -m "$dir/$bin" 2>/dev/null | grep -qE "^\s+mod\s+$mod\s+v$version\b" \
        || ! "$check" "$dir/$bin"; then
        log "building $bin $version (go install) into $dir"
        GOBIN=$dir GOFLAGS=-mod=mod CGO_ENABLED=0 go_cached "$bin" install -trimpath -ldflags "$ldflags" "$pkg@v$version" \
            || die "could not build $bin $version with $(go_cached "$bin" version)"
        "$check" "$dir/$bin" || die "$bin $version built, but its check ($check) fails"
    fi
}

# Components kept beside this script (scripts/setup.d/NAME.sh), one file per
# component group: each defines `component_NAME` (and its checks) and adds NAME
# to COMPONENTS or OPTIONAL.
for f in "$(dirname "${BASH_SOURCE[0]}")"/setup.d/*.sh; do
    [[ -e $f ]] || continue
    # shellcheck source=/dev/null
    source "$f"
done

# ---------------------------------------------------------------- install

apt_install_pending() {
    ((${#PENDING[@]})) || return 0
    log "installing: ${PENDING[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # No init system runs here, but maintainer scripts (nginx, iperf3) would
    # still try to start their daemons in the root namespace. A policy-rc.d
    # that answers 101 stops that; the image usually has one, and a temporary
    # one is created (and removed) only if it does not.
    local policy=/usr/sbin/policy-rc.d temp_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        temp_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${PENDING[@]}"
    if ((temp_policy)); then
        rm -f "$policy"
        trap - EXIT
    fi
    SUMMARY+=("installed: ${PENDING[*]}")
}

main() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (apt-get install, network namespaces); try: sudo $0"
    command -v dpkg-query >/dev/null || die "dpkg-query not found: this script supports Debian 12 only"

    REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

    local c
    if (($#)); then
        for c in "$@"; do
            declare -F "component_$c" >/dev/null \
                || die "no component $c (have: ${COMPONENTS[*]} ${OPTIONAL[*]})"
        done
        COMPONENTS=("$@")
    fi
    for c in "${COMPONENTS[@]}"; do "component_$c"; done
    apt_install_pending
    for c in "${POST_CHECKS[@]}"; do "$c"; done

    ((${#PENDING[@]})) || SUMMARY=("apt packages: all present" "${SUMMARY[@]}")
    log "summary"
    local line
    for line in "${SUMMARY[@]}"; do printf '  - %s\n' "$line"; done
}

main "$@"
