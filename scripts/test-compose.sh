#!/usr/bin/env bash
# The docker-compose fleet-in-a-box (docker-compose.yml), run for real on this
# machine: podman serves the Docker API, Debian's docker-compose drives it,
# and every image is built here from a local debootstrap base
# (testbed/images/build-base.sh) because no image can be pulled.
#
#   scripts/test-compose.sh [--keep-up] [--purge-cache]
#
#   1. builds the local bases, the stand-ins for the official third-party
#      images (testbed/images/{kafka,postgis,prometheus,nginx}) and the six
#      Polycorn images from their Dockerfiles (base images as build args);
#   2. `docker-compose up -d` (without the grafana profile: no Grafana server
#      can be installed here) and waits for every service's health and every
#      one-shot's success;
#   3. moves passenger traffic through the train: a download and an upload
#      through the relay's SOCKS5 listener, across the emulated carriers, the
#      proxy and the compose network to the origin, checked by SHA-256, and
#      both carriers carrying data;
#   4. waits for the emulated trip to end and checks LinkDB: every handover
#      and GPS fix of the trip's radio log exactly once (relay -> proxy ->
#      Kafka -> ingest -> PostGIS), and the API serving the train; then
#      signed tables: from the trainer's container, a table signed with the
#      key the pki job gave it reaches the proxy (verify key from the same
#      job), an unsigned one and one of another key are refused;
#   5. checks that Prometheus scrapes every target (up == 1, job names of
#      services/prometheus/prometheus.compose.yml), and that every metric the
#      alert rules and dashboards name is one the services export;
#   6. tears everything down, also on failure (printing the logs of the
#      services that were not healthy): `docker-compose down -v`, the images
#      it built, the podman API service, podman's firewall chains and nft
#      tables that were not there before, net.ipv4.ip_forward as it was.
#
# The local bases (polycorn-base/python/rust) and the build caches (cargo
# registry and target, uv) are machine caches like the Kafka jars and stay
# for the next run; --purge-cache removes them too (the next run is cold).
# --keep-up leaves the fleet running and skips the teardown (then run
# `scripts/test-compose.sh --down` to clean up).
#
# The checks run against seeded faults first (a broken copy of each input
# must fail), so none of them can pass vacuously. Ends with "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."

keep_up=0 purge=0 down_only=0
for a in "$@"; do
    case $a in
        --keep-up) keep_up=1 ;;
        --purge-cache) purge=1 ;;
        --down) down_only=1 ;;
        -h | --help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "test-compose: unknown argument $a" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "test-compose: must run as root (podman, network namespaces)" >&2; exit 1; }

bash scripts/setup.sh containers infra >/dev/null
# shellcheck source=testbed/images/lib.sh
source testbed/images/lib.sh

T0=$(date +%s)
log() { printf '[test-compose %s +%ss] %s\n' "$(date +%T)" "$(($(date +%s) - T0))" "$*"; }
pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
ko() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else ko "$name"; fi; }
# A check fed a seeded fault must fail; if it passes, the check is broken.
must_fail() { local name=$1; shift; if "$@" >/dev/null 2>&1; then ko "seeded fault not caught: $name"; else ok "seeded fault caught: $name"; fi; }

STATE=${POLYCORN_COMPOSE_STATE:-/run/polycorn-compose-test}
mkdir -p "$STATE"
WORK=$STATE/work
SOCK=$STATE/podman.sock
export DOCKER_HOST=unix://$SOCK
export COMPOSE_PROJECT_NAME=polycorncompose
export COMPOSE_HTTP_TIMEOUT=300
# Images of this run: their own tag, so that nothing a developer built as
# polycorn/*:dev is replaced or removed.
export POLYCORN_IMAGE_PREFIX=localhost/polycorn POLYCORN_TAG=compose-test
export POLYCORN_KAFKA_IMAGE=localhost/polycorn-standin/kafka:compose-test
export POLYCORN_POSTGIS_IMAGE=localhost/polycorn-standin/postgis:compose-test
export POLYCORN_PROMETHEUS_IMAGE=localhost/polycorn-standin/prometheus:compose-test
export POLYCORN_NGINX_IMAGE=localhost/polycorn-standin/nginx:compose-test
# Host ports apart from scripts/infra.sh's (25432, 29092, 29090) and the
# compose defaults a developer may be using.
export POLYCORN_API_PORT=${TEST_COMPOSE_API_PORT:-28180} POLYCORN_PROMETHEUS_PORT=${TEST_COMPOSE_PROM_PORT:-28190}
API_KEY=polycorn-compose-dev-read-key
SERVICE_IMAGES=(relay-agent proxy emu ingest trainer linkdb-api)
STANDINS=(kafka postgis prometheus nginx)
LONG_RUNNING=(postgis kafka proxy emu relay-agent ingest trainer linkdb-api origin prometheus)
ONE_SHOTS=(pki migrate kafka-init)

dc() { docker-compose --no-ansi "$@"; }
# image_of SERVICE: the Dockerfile and target of a service's image.
image_of() {
    case $1 in
        relay-agent) echo "Dockerfile.rust relay" ;;
        proxy | emu) echo "Dockerfile.rust $1" ;;
        *) echo "Dockerfile.python $1" ;;
    esac
}
ctr_of() { dc ps -q "$1" 2>/dev/null | head -n1; }

# ------------------------------------------------------------------ host state

# What the host's firewall and forwarding looked like before podman ran, so
# that teardown removes only what this run added. The snapshot survives a
# crashed run (it is taken once, removed by a clean teardown).
snapshot_host() {
    [[ -f $STATE/ip_forward ]] && return 0
    cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward"
    nft list tables 2>/dev/null | sort >"$STATE/nft-tables" || : >"$STATE/nft-tables"
    for t in filter nat; do
        iptables -t "$t" -S 2>/dev/null | awk '$1 == "-N" {print $2}' | sort >"$STATE/chains-$t" || : >"$STATE/chains-$t"
    done
}

restore_host_net() {
    local t chain line
    # netavark's chains (NETAVARK-*, NETAVARK_*, and per-network ones) that
    # were not there before: unhook them from the built-in chains, flush and
    # delete them.
    for t in filter nat; do
        [[ -f $STATE/chains-$t ]] || continue
        mapfile -t new < <(iptables -t "$t" -S 2>/dev/null | awk '$1 == "-N" {print $2}' | sort | comm -13 "$STATE/chains-$t" -)
        ((${#new[@]})) || continue
        for chain in "${new[@]}"; do
            while read -r line; do
                [[ -n $line ]] || continue
                # A rule as iptables -S prints it (shell-quoted, e.g. its
                # --comment), turned into its own deletion.
                eval "iptables -t \"\$t\" ${line/#-A/-D}" 2>/dev/null || true
            done < <(iptables -t "$t" -S 2>/dev/null | grep -E -- "^-A [A-Z]+ .*-j $chain( |$)" || true)
        done
        for chain in "${new[@]}"; do iptables -t "$t" -F "$chain" 2>/dev/null || true; done
        for chain in "${new[@]}"; do iptables -t "$t" -X "$chain" 2>/dev/null || true; done
    done
    # nft tables created during the run (iptables-nft's `ip filter`/`ip nat`
    # when they did not exist, netavark's own).
    if [[ -f $STATE/nft-tables ]]; then
        while read -r _ fam name; do
            if [[ -n $name ]]; then nft delete table "$fam" "$name" 2>/dev/null || true; fi
        done < <(nft list tables 2>/dev/null | sort | comm -13 "$STATE/nft-tables" -)
    fi
    if [[ -f $STATE/ip_forward ]]; then
        sysctl -qw net.ipv4.ip_forward="$(cat "$STATE/ip_forward")"
    fi
    # Anything still there that the snapshot did not have?
    local left=""
    for t in filter nat; do
        [[ -f $STATE/chains-$t ]] || continue
        left+=$(iptables -t "$t" -S 2>/dev/null | awk '$1 == "-N" {print $2}' | sort | comm -13 "$STATE/chains-$t" - | sed "s/^/iptables $t chain /")
    done
    rm -f "$STATE/ip_forward" "$STATE/nft-tables" "$STATE/chains-filter" "$STATE/chains-nat"
    [[ -z $left ]] || { echo "$left"; return 1; }
}

# ------------------------------------------------------------------ podman API

start_api() {
    stop_api
    : >"$STATE/podman-service.log"
    setsid podman --root "$PC_CTR_ROOT" --runroot "$PC_CTR_RUNROOT" system service --time=0 "unix://$SOCK" \
        </dev/null >>"$STATE/podman-service.log" 2>&1 &
    echo $! >"$STATE/podman-service.pid"
    local i
    for ((i = 0; i < 100; i++)); do
        curl -fsS --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "podman system service did not answer on $SOCK:"; cat "$STATE/podman-service.log"
    return 1
}

stop_api() {
    local pid
    if [[ -s $STATE/podman-service.pid ]]; then
        pid=$(<"$STATE/podman-service.pid")
        if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$STATE/podman-service.pid"
    fi
    rm -f "$SOCK"
}

# podman runs health checks from systemd timers, and there is no systemd
# here: this loop runs every running project container's check instead
# (Docker runs them itself, so real users need nothing like it).
start_health_pump() {
    stop_health_pump
    (
        while :; do
            while read -r id; do
                # </dev/null: podman would read the rest of the id list.
                pc_podman healthcheck run "$id" </dev/null >/dev/null 2>&1 || true
            done < <(pc_podman ps -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" 2>/dev/null)
            sleep 2
        done
    ) </dev/null >/dev/null 2>&1 &
    echo $! >"$STATE/health-pump.pid"
}

stop_health_pump() {
    if [[ -s $STATE/health-pump.pid ]]; then
        kill -TERM "$(<"$STATE/health-pump.pid")" 2>/dev/null || true
        rm -f "$STATE/health-pump.pid"
    fi
}

# ------------------------------------------------------------------ teardown

print_failed_logs() {
    local s id st
    echo "---- services not healthy/complete, with their last log lines"
    for s in "${LONG_RUNNING[@]}" "${ONE_SHOTS[@]}"; do
        id=$(ctr_of "$s") || true
        [[ -n $id ]] || { echo "== $s: no container"; continue; }
        st=$(pc_podman inspect -f '{{.State.Status}} exit={{.State.ExitCode}} health={{.State.Health.Status}}' "$id" 2>/dev/null || echo "?")
        case $st in
            "running exit=0 health=healthy" | "exited exit=0 health=") continue ;;
        esac
        echo "== $s: $st"
        pc_podman logs --tail 40 "$id" 2>&1 | sed 's/^/   /'
    done
}

teardown() {
    local rc=$?
    trap - EXIT INT TERM
    if ((keep_up)) && ((rc == 0)); then
        log "--keep-up: the fleet stays up (DOCKER_HOST=$DOCKER_HOST); clean up with $0 --down"
        return 0
    fi
    if ((rc != 0)) && [[ -S $SOCK ]]; then print_failed_logs || true; fi
    log "teardown"
    stop_health_pump
    if [[ -S $SOCK ]]; then
        # The relay first: podman refuses to remove emu while a container
        # shares its network namespace, and compose v1 removes in parallel.
        timeout 60 docker-compose --no-ansi rm -fsv relay-agent >"$STATE/down.log" 2>&1 || true
        timeout 180 docker-compose --no-ansi down -v --remove-orphans -t 5 >>"$STATE/down.log" 2>&1 \
            || { echo "docker-compose down failed:"; tail -20 "$STATE/down.log"; rc=1; }
    fi
    stop_api
    # Whatever compose could not remove (e.g. after a crash of the API).
    local ids
    mapfile -t ids < <(pc_podman ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" 2>/dev/null || true)
    if ((${#ids[@]})); then pc_podman rm -f -t 2 "${ids[@]}" >/dev/null 2>&1 || true; fi
    mapfile -t ids < <(pc_podman volume ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" 2>/dev/null || true)
    if ((${#ids[@]})); then pc_podman volume rm -f "${ids[@]}" >/dev/null 2>&1 || true; fi
    pc_podman network rm -f "${COMPOSE_PROJECT_NAME}_default" >/dev/null 2>&1 || true
    local img
    for img in "${SERVICE_IMAGES[@]}"; do pc_podman rmi -f "$POLYCORN_IMAGE_PREFIX/$img:$POLYCORN_TAG" >/dev/null 2>&1 || true; done
    for img in "${STANDINS[@]}"; do pc_podman rmi -f "localhost/polycorn-standin/$img:compose-test" >/dev/null 2>&1 || true; done
    # Intermediate layers of this run's builds (the named bases stay).
    pc_podman image prune -f >/dev/null 2>&1 || true
    if ((purge)); then
        log "--purge-cache: removing the local bases, build caches and podman storage"
        pc_podman system reset -f >/dev/null 2>&1 || true
        # buildah keeps RUN --mount=type=cache directories here, by id.
        rm -rf "$PC_CTR_ROOT" "$PC_CTR_DIR/rootfs-bookworm" /var/tmp/buildah-cache/polycorn-*
    fi
    # Nothing of this run may be left behind.
    local left
    left=$(
        restore_host_net
        pc_podman ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" 2>/dev/null
        pc_podman volume ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" 2>/dev/null
    )
    if [[ -n $left ]]; then
        echo "teardown left behind:"; echo "$left"
        rc=1
    fi
    rm -rf "$WORK"
    log "teardown done: containers, volumes, network, images of this run, podman's firewall chains removed; ip_forward=$(cat /proc/sys/net/ipv4/ip_forward)"
    exit "$rc"
}

if ((down_only)); then
    keep_up=0
    trap teardown EXIT
    exit 0
fi

# A previous run killed before its teardown: clean up after it first.
if [[ -S $SOCK || -s $STATE/podman-service.pid ]]; then
    log "cleaning up after an earlier run"
    (keep_up=0; teardown) || true
fi
snapshot_host
trap teardown EXIT
trap 'exit 130' INT TERM
rm -rf "$WORK" && mkdir -p "$WORK"

# ------------------------------------------------------------------ seeded-fault-checked validators

# sha_equal A B: two 64-hex digests, equal.
sha_equal() { [[ $1 =~ ^[0-9a-f]{64}$ && $1 == "$2" ]]; }

# exactly_once EVENTS EPOCH ROWS_HO ROWS_FIX: every handover and GPS fix of
# the trip's log in LinkDB once, nothing else (scripts/trip_exactly_once.py,
# the rule scripts/integration-telemetry.sh applies too). ROWS_* are psql -At
# outputs.
exactly_once() { python3 scripts/trip_exactly_once.py "$@"; }

# targets_all_up TARGETS_JSON JOB...: Prometheus's active targets include
# every JOB, and every target is up.
targets_all_up() {
    python3 - "$@" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
jobs = set(sys.argv[2:])
seen = {}
for t in doc["data"]["activeTargets"]:
    seen.setdefault(t["labels"]["job"], []).append((t["health"], t["scrapeUrl"], t.get("lastError", "")))
for job in sorted(set(seen) | jobs):
    print(f"  {job}: {seen.get(job, 'absent')}")
ok = jobs <= set(seen) and all(h == "up" for ts in seen.values() for h, _, _ in ts)
sys.exit(0 if ok else 1)
PY
}

log "seeded faults for the validators"
must_fail "two different digests" sha_equal "$(echo a | sha256sum | cut -c1-64)" "$(echo b | sha256sum | cut -c1-64)"
must_fail "empty digests" sha_equal "" ""
printf '%s\n' '{"event":"gps","t_ms":1000}' '{"event":"handover_end","carrier":0,"t_ms":5000,"duration_ms":40}' >"$WORK/ev.jsonl"
printf 'carrier-0|4960\n' >"$WORK/ho.ok"; printf '1000\n' >"$WORK/fix.ok"
quiet() { "$@" >/dev/null; }
check "exactly_once accepts a matching toy trip" quiet exactly_once "$WORK/ev.jsonl" 0 "$WORK/ho.ok" "$WORK/fix.ok"
printf '1000\n1000\n' >"$WORK/fix.dup"; printf 'carrier-1|4960\n' >"$WORK/ho.wrong"; : >"$WORK/empty"
must_fail "a duplicated GPS fix" exactly_once "$WORK/ev.jsonl" 0 "$WORK/ho.ok" "$WORK/fix.dup"
must_fail "a handover on the wrong carrier" exactly_once "$WORK/ev.jsonl" 0 "$WORK/ho.wrong" "$WORK/fix.ok"
must_fail "a missing handover" exactly_once "$WORK/ev.jsonl" 0 "$WORK/empty" "$WORK/fix.ok"
echo '{"data":{"activeTargets":[{"labels":{"job":"a"},"health":"up","scrapeUrl":"u"},{"labels":{"job":"b"},"health":"down","scrapeUrl":"v"}]}}' >"$WORK/targets.bad"
must_fail "a target down" targets_all_up "$WORK/targets.bad" a b
must_fail "a job without targets" targets_all_up "$WORK/targets.bad" a c

# ------------------------------------------------------------------ images

log "local base images"
bash testbed/images/build-base.sh
RUST_IMAGE=$(pc_rust_image)
REVISION=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
export BUILDAH_FORMAT=docker   # HEALTHCHECK is kept only in Docker-format images

build_image() { # NAME DOCKERFILE CONTEXT BUILD_ARGS...
    local name=$1 file=$2 ctx=$3 t=$SECONDS
    shift 3
    if ! pc_podman build --format docker --network host --pull=never -f "$file" -t "$name" \
        --build-arg "REVISION=$REVISION" "$@" "$ctx" >"$WORK/build-${name//[\/:]/_}.log" 2>&1; then
        echo "build of $name failed:"; tail -30 "$WORK/build-${name//[\/:]/_}.log"
        return 1
    fi
    printf '  %-55s %4ss  %s\n' "$name" "$((SECONDS - t))" "$(pc_podman image inspect -f '{{.Size}}' "$name" | awk '{printf "%.0f MB", $1 / 1e6}')"
}

log "stand-ins for the official third-party images"
for s in postgis prometheus nginx; do
    build_image "localhost/polycorn-standin/$s:compose-test" "testbed/images/$s/Dockerfile" "testbed/images/$s" \
        --build-arg "BASE_IMAGE=$PC_BASE_IMAGE"
done
# Kafka's context: the stand-in's files, the broker's log4j2 config and the
# jars `make setup` fetched (hard links, no copy).
kctx=$WORK/kafka-ctx
mkdir -p "$kctx"
cp testbed/images/kafka/* services/kafka/log4j2.properties "$kctx/"
kafka_libs=${POLYCORN_CACHE:-/var/cache/polycorn}/kafka-$(sed -n 's/^KAFKA_VERSION=//p' scripts/setup.sh)/libs
cp -al "$kafka_libs" "$kctx/libs" 2>/dev/null || cp -a "$kafka_libs" "$kctx/libs"
build_image "localhost/polycorn-standin/kafka:compose-test" "$kctx/Dockerfile" "$kctx" --build-arg "BASE_IMAGE=$PC_BASE_IMAGE"

log "Polycorn images (Dockerfile.rust: one shared build stage; Dockerfile.python: uv from uv.lock)"
uv_version=$(sed -n 's/^UV_VERSION=//p' scripts/setup.sh)
for s in "${SERVICE_IMAGES[@]}"; do
    read -r file target <<<"$(image_of "$s")"
    build_image "$POLYCORN_IMAGE_PREFIX/$s:$POLYCORN_TAG" "$file" . --target "$target" \
        --build-arg "RUST_IMAGE=$RUST_IMAGE" --build-arg "RUNTIME_IMAGE=$PC_BASE_IMAGE" \
        --build-arg "PYTHON_IMAGE=$PC_PYTHON_IMAGE" --build-arg "UV_VERSION=$uv_version"
done
T_BUILT=$(date +%s)

# ------------------------------------------------------------------ up

log "podman API on $SOCK; docker-compose up -d"
start_api
start_health_pump
if ! timeout 900 docker-compose --no-ansi up -d --no-build >"$WORK/up.log" 2>&1; then
    echo "docker-compose up failed:"; tail -30 "$WORK/up.log"
    exit 1
fi

all_healthy() {
    local s id st i bad
    for ((i = 0; i < 120; i++)); do
        bad=()
        for s in "${LONG_RUNNING[@]}"; do
            id=$(ctr_of "$s")
            st=$([[ -n $id ]] && pc_podman inspect -f '{{.State.Status}}/{{.State.Health.Status}}' "$id" 2>/dev/null || echo absent)
            [[ $st == running/healthy ]] || bad+=("$s=$st")
        done
        for s in "${ONE_SHOTS[@]}"; do
            id=$(ctr_of "$s")
            st=$([[ -n $id ]] && pc_podman inspect -f '{{.State.Status}}/{{.State.ExitCode}}' "$id" 2>/dev/null || echo absent)
            [[ $st == exited/0 ]] || bad+=("$s=$st")
        done
        ((${#bad[@]} == 0)) && break
        sleep 2
    done
    for s in "${LONG_RUNNING[@]}" "${ONE_SHOTS[@]}"; do
        id=$(ctr_of "$s")
        printf '  %-12s %s\n' "$s" "$(pc_podman inspect -f '{{.State.Status}} exit={{.State.ExitCode}} health={{.State.Health.Status}}' "$id" 2>/dev/null)"
    done
    ((${#bad[@]} == 0)) || { echo "  not ready: ${bad[*]}"; return 1; }
}
check "every service healthy, every one-shot (pki, migrate, kafka-init) completed with status 0" all_healthy
T_UP=$(date +%s)

EMU_PID=$(pc_podman inspect -f '{{.State.Pid}}' "$(ctr_of emu)")
in_train() { nsenter -t "$EMU_PID" -n "$@"; }
relay_metric() { # NAME [LABEL_REGEX]: sum of the relay's metric
    in_train curl -fsS --max-time 2 http://127.0.0.1:9465/metrics 2>/dev/null |
        awk -v m="$1" -v l="${2:-}" '$1 ~ "^"m"([{]|$)" && $1 ~ l {s += $2} END {printf "%d", s + 0}'
}

paths_up() {
    local i
    for ((i = 0; i < 60; i++)); do
        (($(relay_metric polycorn_path_up) >= 2)) && break
        sleep 1
    done
    echo "  relay paths up: $(relay_metric polycorn_path_up) of 2"
    (($(relay_metric polycorn_path_up) >= 2))
}
check "the relay brings both emulated carriers up through the emulator to the proxy" paths_up

# ------------------------------------------------------------------ passenger traffic

# Retried: a name lookup on the compose network can fail while containers
# join it (aardvark-dns reloads).
socks() { in_train curl -fsS --max-time 120 --retry 3 --retry-delay 1 --retry-all-errors --socks5-hostname 127.0.0.1:1080 "$@"; }
traffic() {
    local before0 before1 want got up_sha
    before0=$(relay_metric polycorn_path_received_bytes_total 'carrier-0')
    before1=$(relay_metric polycorn_path_received_bytes_total 'carrier-1')
    socks -o "$WORK/blob" http://origin/blob || { echo "  download through the relay failed"; return 1; }
    want=$(pc_podman exec "$(ctr_of origin)" sha256sum /srv/origin/blob | cut -c1-64)
    got=$(sha256sum "$WORK/blob" | cut -c1-64)
    echo "  download: $(stat -c %s "$WORK/blob") bytes, sha256 ${got:0:16}... (origin ${want:0:16}...)"
    sha_equal "$got" "$want" || return 1
    head -c 4194304 /dev/urandom >"$WORK/up"
    socks -T "$WORK/up" http://origin/upload/from-train || { echo "  upload through the relay failed"; return 1; }
    up_sha=$(pc_podman exec "$(ctr_of origin)" sha256sum /srv/origin/upload/from-train | cut -c1-64)
    echo "  upload: 4194304 bytes, sha256 at the origin ${up_sha:0:16}..."
    sha_equal "$up_sha" "$(sha256sum "$WORK/up" | cut -c1-64)" || return 1
    local d0 d1
    d0=$(($(relay_metric polycorn_path_received_bytes_total 'carrier-0') - before0))
    d1=$(($(relay_metric polycorn_path_received_bytes_total 'carrier-1') - before1))
    echo "  relay received per carrier during the transfer: carrier-0 $d0 B, carrier-1 $d1 B"
    ((d0 + d1 >= 8388608))
}
check "passenger traffic through the train (SOCKS5 -> emulated carriers -> proxy -> origin): 8 MiB down, 4 MiB up, SHA-256 equal" traffic

# ------------------------------------------------------------------ the trip's telemetry in LinkDB

EPOCH=$(pc_podman exec "$(ctr_of emu)" cat /run/polycorn-trip/epoch)
pc_podman exec "$(ctr_of relay-agent)" cat /usr/share/polycorn/trip/events.jsonl >"$WORK/events.jsonl"
TRIP_MS=$(pc_podman exec "$(ctr_of relay-agent)" cat /usr/share/polycorn/trip/trip.json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(int(d.get("duration_s", 120) * 1000))')
psql_q() { pc_podman exec "$(ctr_of postgis)" psql -U polycorn -d linkdb -Atc "$1"; }

linkdb_complete() {
    local now end last="" cur i
    end=$((EPOCH + TRIP_MS))
    now=$(date +%s%3N)
    if ((now < end)); then
        log "waiting $(((end - now) / 1000)) s for the trip to end"
        sleep $(((end - now) / 1000 + 1))
    fi
    # ingest has caught up when the counts stop changing.
    for ((i = 0; i < 90; i++)); do
        cur=$(psql_q "select (select count(*) from handovers), (select count(*) from gps_fixes)")
        [[ $cur == "$last" && $cur != "0|0" ]] && break
        last=$cur
        sleep 2
    done
    psql_q "select carrier, (extract(epoch from start_time) * 1000)::bigint from handovers where train_id = 'train-compose'" >"$WORK/ho.rows"
    psql_q "select (extract(epoch from time) * 1000)::bigint from gps_fixes where train_id = 'train-compose'" >"$WORK/fix.rows"
    echo "  LinkDB rows: $(psql_q "select 'handovers ' || (select count(*) from handovers) || ', gps_fixes ' || (select count(*) from gps_fixes) || ', trips ' || (select count(*) from trips)")"
    exactly_once "$WORK/events.jsonl" "$EPOCH" "$WORK/ho.rows" "$WORK/fix.rows"
}
check "the trip's telemetry lands in LinkDB: every handover and GPS fix exactly once (relay -> proxy -> Kafka -> ingest -> PostGIS)" linkdb_complete

api_serves_train() {
    local body
    body=$(curl -fsS --max-time 5 -H "X-API-Key: $API_KEY" "http://127.0.0.1:$POLYCORN_API_PORT/v1/trains") || return 1
    echo "  GET /v1/trains: ${body:0:200}"
    grep -q '"train-compose"' <<<"$body" || return 1
    # and refuses a request without a key
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$POLYCORN_API_PORT/v1/trains") == 401 ]]
}
check "linkdb-api (published on 127.0.0.1:$POLYCORN_API_PORT) serves the train from LinkDB, 401 without a key" api_serves_train

# ------------------------------------------------------------------ signed failure tables

# The trainer's container signs with the key the pki job gave it
# (POLYCORN_TRAINER_TABLE_SIGNING_KEY) and produces to the table topic as
# the trainer does (polycorn_trainer.kafka.produce_table); the compose trip
# has no failed handover, so the trainer's own runs publish no table. KIND:
# signed (the trainer's key), unsigned, other (a key of its own).
publish_table() { # KIND VERSION
    dc exec -T trainer python3 - "$1" "$2" <<'PYEOF'
import base64, json, os, sys
from pathlib import Path
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from polycorn_trainer.kafka import produce_table
from polycorn_trainer.signing import TableSigner

kind, version = sys.argv[1], int(sys.argv[2])
body = json.dumps({"format": "polycorn-failure-table/1", "version": version, "source": f"compose-{kind}",
                   "entries": [{"cell": 1, "direction": "increasing", "position_m": 100.0}]},
                  separators=(",", ":")).encode()
signer = TableSigner.load(Path(os.environ["POLYCORN_TRAINER_TABLE_SIGNING_KEY"]))
sig = {"signed": signer.sign(body), "unsigned": None,
       "other": base64.b64encode(Ed25519PrivateKey.generate().sign(body)).decode()}[kind]
produce_table(os.environ["POLYCORN_KAFKA_BOOTSTRAP"], "polycorn.failure-tables.v1", body,
              version=version, etag=f'"{kind}-{version}"', signature=sig)
PYEOF
}
proxy_metric() { # NAME [LABEL_REGEX]: sum of the proxy's metric
    nsenter -t "$(pc_podman inspect -f '{{.State.Pid}}' "$(ctr_of proxy)")" -n \
        curl -fsS --max-time 2 http://127.0.0.1:9464/metrics 2>/dev/null |
        awk -v m="$1" -v l="${2:-}" '$1 ~ "^"m"([{]|$)" && $1 ~ l {s += $2} END {printf "%d", s + 0}'
}
wait_metric() { # NAME LABEL_REGEX VALUE: until the proxy's metric is VALUE (30 s)
    local i
    for ((i = 0; i < 60; i++)); do
        (($(proxy_metric "$1" "$2") == $3)) && return 0
        sleep 0.5
    done
    return 1
}
signed_tables() {
    local sig='reason="signature"' refused
    refused=$(proxy_metric polycorn_failure_table_source_rejected_total "$sig")
    publish_table signed 5000 || { echo "  the trainer's container could not sign and produce a table"; return 1; }
    wait_metric polycorn_failure_table_version "" 5000 ||
        { echo "  the proxy did not take the table signed with the trainer's key (version $(proxy_metric polycorn_failure_table_version))"; return 1; }
    echo "  proxy: table v5000 signed with the trainer's key (pki-trainer) taken"
    local kind v=5000
    for kind in unsigned other; do
        v=$((v + 1))
        publish_table "$kind" "$v" || return 1
        refused=$((refused + 1))
        wait_metric polycorn_failure_table_source_rejected_total "$sig" "$refused" ||
            { echo "  the $kind table v$v was not refused for its signature"; return 1; }
        (($(proxy_metric polycorn_failure_table_version) == 5000)) || { echo "  the proxy left v5000 for the $kind v$v"; return 1; }
        echo "  proxy: the $kind table v$v refused (reason=signature); v5000 stays"
    done
}
check "signed failure tables: the proxy (its verify key from the pki job) takes a table signed with the trainer's key and refuses an unsigned one and one of another key" signed_tables

no_dead_letters() {
    local n
    n=$(pc_podman exec "$(ctr_of kafka)" bash -c "java -cp '/opt/kafka/libs/*' org.apache.kafka.tools.GetOffsetShell --bootstrap-server localhost:9092 --topic polycorn.telemetry.dlq 2>/dev/null" |
        awk -F: '{s += $3} END {print s + 0}') || return 1
    echo "  dead letters: $n"
    [[ $n == 0 ]]
}
check "no telemetry record in the dead-letter topic" no_dead_letters

# ------------------------------------------------------------------ Prometheus

prom_targets() {
    local i
    for ((i = 0; i < 40; i++)); do
        curl -fsS --max-time 5 "http://127.0.0.1:$POLYCORN_PROMETHEUS_PORT/api/v1/targets?state=active" >"$WORK/targets.json" 2>/dev/null &&
            targets_all_up "$WORK/targets.json" polycorn-relay polycorn-proxy polycorn-ingest polycorn-trainer polycorn-linkdb-api >/dev/null && break
        sleep 2
    done
    targets_all_up "$WORK/targets.json" polycorn-relay polycorn-proxy polycorn-ingest polycorn-trainer polycorn-linkdb-api || return 1
    local q
    q=$(curl -fsS "http://127.0.0.1:$POLYCORN_PROMETHEUS_PORT/api/v1/query" --data-urlencode 'query=min(up)') || return 1
    echo "  min(up) = $(jq -r '.data.result[0].value[1]' <<<"$q")"
    [[ $(jq -r '.data.result[0].value[1]' <<<"$q") == 1 ]]
}
check "Prometheus (published on 127.0.0.1:$POLYCORN_PROMETHEUS_PORT) scrapes every target: relay, proxy, ingest, trainer, linkdb-api up" prom_targets

# Every metric an alert rule or a dashboard names must be one the compose
# services export: Prometheus's metadata API lists each scraped family, with
# or without samples (scripts/check_observability.py; integration-telemetry.sh
# does the same on the namespace testbed from the /metrics dumps).
prom_metric_names() {
    uv run --all-packages --locked --quiet python scripts/check_observability.py metrics \
        --rules services/prometheus/rules/*.yml --dashboards dashboards/*.json \
        --prometheus "http://127.0.0.1:$POLYCORN_PROMETHEUS_PORT"
}
check "the alert rules and dashboards name only metrics that the compose services export" prom_metric_names

T_END=$(date +%s)
echo
echo "timings: images $((T_BUILT - T0)) s, up+healthy $((T_UP - T_BUILT)) s, checks $((T_END - T_UP)) s, total before teardown $((T_END - T0)) s"
echo "test-compose: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
