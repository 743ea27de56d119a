#!/usr/bin/env bash
# The demo: a train with two cellular carriers, its passengers and the cloud,
# built from network namespaces; a relay-agent/proxy pair carries real curl
# traffic from a passenger to an nginx origin under each scheduler, then a
# carrier is lost mid-download. Everything is torn down at the end, or on
# Ctrl-C. (The emulated high-speed-rail links arrive with the testbed issue;
# until then the carriers are plain veth links.)
set -euo pipefail
cd "$(dirname "$0")/.."

export PC_PREFIX=${PC_PREFIX:-pcdemo} PC_CARRIERS=${PC_CARRIERS:-2}
# shellcheck source=testbed/netns/lib.sh
source testbed/netns/lib.sh
# shellcheck source=scripts/lib-pair.sh
source scripts/lib-pair.sh

cleanup() {
    stop_pair || true
    testbed/origin/stop.sh >/dev/null 2>&1 || true
    testbed/netns/down.sh >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== building the testbed: $NS_PAX (passengers) -> $NS_TRAIN (relay) =[$PC_CARRIERS carriers]=> $NS_CLOUD (proxy, origin)"
testbed/netns/up.sh >/dev/null
testbed/origin/start.sh >/dev/null
# Logs are appended across restarts within a run; start each run fresh.
rm -rf "$PC_STATE/logs"
pair_pki
ORIGIN=http://$ORIGIN_ADDR
FILES="$PC_STATE/origin/www/files"

printf '\n%-12s %14s %14s %10s\n' scheduler "down 10 MiB" "up 10 MiB" intact
for sched in minrtt roundrobin redundant blest ecf single-path; do
    start_proxy --scheduler "$sched"
    start_main_relay --scheduler "$sched"
    wait_paths_up "$PC_CARRIERS" || { echo "relay did not come up; see $PC_STATE/logs"; exit 1; }
    down=$(ip netns exec "$NS_PAX" curl -fsS -o "$PC_STATE/demo.bin" -w '%{speed_download}' "$ORIGIN/files/10MiB.bin")
    up=$(ip netns exec "$NS_PAX" curl -fsS -o /dev/null -w '%{speed_upload}' -T "$FILES/10MiB.bin" "$ORIGIN/upload/demo.bin")
    same=no
    ip netns exec "$NS_CLOUD" curl -fsS -o "$PC_STATE/demo-up.bin" "$ORIGIN/upload/demo.bin"
    cmp -s "$PC_STATE/demo.bin" "$FILES/10MiB.bin" && cmp -s "$FILES/10MiB.bin" "$PC_STATE/demo-up.bin" && same=yes
    awk -v s="$sched" -v d="$down" -v u="$up" -v ok="$same" \
        'BEGIN { printf "%-12s %9.0f Mb/s %9.0f Mb/s %10s\n", s, d * 8 / 1e6, u * 8 / 1e6, ok }'
    stop_pair
done

echo
echo "== losing carrier 0 in the middle of a 100 MiB download (minrtt)"
start_proxy
start_main_relay
wait_paths_up "$PC_CARRIERS"
ip netns exec "$NS_PAX" curl -fsS --limit-rate 25M -o "$PC_STATE/demo.bin" "$ORIGIN/files/100MiB.bin" &
pid=$!
sleep 1.5
testbed/netns/link.sh down 0 >/dev/null
echo "   carrier 0 down"
wait "$pid"
testbed/netns/link.sh up 0 >/dev/null
if cmp -s "$PC_STATE/demo.bin" "$FILES/100MiB.bin"; then echo "   download completed intact over the remaining carrier"; else echo "   download corrupted"; exit 1; fi
echo
echo "== proxy metrics (excerpt): downlink bytes per carrier, subflow state"
ip netns exec "$NS_CLOUD" curl -fsS "http://$PROXY_METRICS/metrics" |
    grep -E '^polycorn_(path_(up|srtt_seconds|data_bytes_total|reinjected_bytes_total|state_changes_total)|conn_opened_total)' || true
