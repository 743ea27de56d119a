#!/usr/bin/env bash
# Stops the servers testbed/origin/start.sh started, by their pid files.
# Safe when nothing runs. testbed/netns/down.sh kills them too, as it kills
# everything in the namespaces; this is for restarting the origin alone.
set -euo pipefail
# shellcheck source=testbed/netns/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../netns/lib.sh"
pc_require_root

run=$PC_STATE/run

# name:expected-comm. The comm check keeps a stale pid file, whose pid the
# kernel has since given to another process, from killing that process.
for entry in nginx:nginx iperf3:iperf3 echo:python3 dnsmasq:dnsmasq; do
    name=${entry%%:*} comm=${entry#*:}
    pidfile=$run/$name.pid
    [[ -s $pidfile ]] || { rm -f "$pidfile"; continue; }
    pid=$(<"$pidfile")
    if [[ $pid =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm"* ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    rm -f "$pidfile"
done
