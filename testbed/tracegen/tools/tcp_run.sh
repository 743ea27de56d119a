#!/usr/bin/env bash
# One run of hsr-facts §15.8 item 12 for validate_tracegen.py (beside it): the
# namespace plumbing only (the Python side starts the runs, waits for them and
# parses what they leave).
#
#   tcp_run.sh TRIP_DIR CARRIER PREFIX CC SECONDS WORK EMU
#
# Builds a one-carrier namespace testbed (PC_PREFIX=PREFIX), replaces its veth
# with EMU (polycorn-emu --replace) driven by TRIP_DIR's c<CARRIER>.down,
# .up and .schedule (4 MB droptail buffer per direction), and runs one
# `iperf3 -R` flow (cloud -> train, like PC's downloads) with congestion
# control CC for SECONDS, while testbed/tracegen/tools/tcp_rto_poll.py polls
# the sender's tcp_info. Writes WORK/PREFIX.{json,poll,nstat} (iperf3 -J, the
# poller's JSON, nstat -asz --json of the sender's namespace) and
# WORK/PREFIX.emu.{out,err}. Exits non-zero when a step fails; tears its
# namespaces and emulator down on any exit, SIGTERM and SIGINT included.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

[[ $# -eq 7 ]] || { echo "usage: tcp_run.sh TRIP_DIR CARRIER PREFIX CC SECONDS WORK EMU" >&2; exit 2; }
dir=$1 c=$2 p=$3 cc=$4 secs=$5 work=$6 emu=$7
train=$p-train cloud=$p-cloud
port=5201
emu_pid='' poll_pid='' iperf_pid=''

say() { echo "tcp_run $p: $*" >&2; }

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # timeout(1) runs iperf3 in a process group of its own: TERM reaches it only from here.
    if [[ -n $iperf_pid ]]; then kill -TERM "$iperf_pid" 2>/dev/null || true; fi
    if [[ -n $poll_pid ]]; then kill -TERM "$poll_pid" 2>/dev/null || true; fi
    if [[ -n $emu_pid ]]; then kill -TERM "$emu_pid" 2>/dev/null || true; fi
    # down.sh also stops the iperf3 server and anything else left in the namespaces.
    PC_PREFIX=$p PC_CARRIERS=1 testbed/netns/down.sh >/dev/null 2>&1 || say "down.sh failed"
    exit "$rc"
}
trap cleanup EXIT
trap 'say interrupted; exit 130' INT TERM

PC_PREFIX=$p PC_CARRIERS=1 testbed/netns/up.sh >/dev/null
"$emu" --train-ns "$train" --cloud-ns "$cloud" --carriers 1 --replace \
    --down-trace "$dir/c$c.down" --up-trace "$dir/c$c.up" --schedule "$dir/c$c.schedule" \
    --buffer-bytes 4000000 --seed "$((c + 1))" >"$work/$p.emu.out" 2>"$work/$p.emu.err" &
emu_pid=$!
for ((i = 0; i < 100; i++)); do
    grep -q ready "$work/$p.emu.out" 2>/dev/null && break
    kill -0 "$emu_pid" 2>/dev/null || break
    sleep 0.1
done
if ! grep -q ready "$work/$p.emu.out"; then
    say "emulator not ready: $(tail -c 600 "$work/$p.emu.err")"
    exit 1
fi
for ns in "$train" "$cloud"; do
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$cc"
done
ip netns exec "$cloud" iperf3 -s -D -B 10.77.0.2 -p "$port"
sleep 0.5
ip netns exec "$cloud" python3 testbed/tracegen/tools/tcp_rto_poll.py "$port" "$((secs + 3))" 0.02 \
    >"$work/$p.poll" &
poll_pid=$!
# In the background and waited for: a trapped signal interrupts `wait` at once, where a
# foreground command would delay the trap until it ends.
timeout "$((secs + 60))" ip netns exec "$train" iperf3 -c 10.77.0.2 -B 10.77.0.1 -p "$port" \
    -t "$secs" -R -C "$cc" -J >"$work/$p.json" &
iperf_pid=$!
rc=0
wait "$iperf_pid" || rc=$?
iperf_pid=''
if ! wait "$poll_pid"; then
    say "tcp_rto_poll.py failed"
    rc=1
fi
poll_pid=''
if ((rc != 0)); then
    say "iperf3 failed (exit status $rc; $work/$p.json)"
    exit 1
fi
# Absolute values (-a): a namespace's counters start at 0 when it is created, and
# the history file nstat keeps is shared between namespaces (-s: not updated).
ip netns exec "$cloud" nstat -asz --json >"$work/$p.nstat"
