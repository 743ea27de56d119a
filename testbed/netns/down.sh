#!/usr/bin/env bash
# Tears down everything up.sh (and testbed/origin, intercept.sh, link.sh)
# created for one PC_PREFIX, even after a crash left things half-built.
# Safe to run any number of times, and when nothing exists.
#
# All rules and routes the testbed creates live inside its own namespaces, so
# deleting the namespaces removes them with the veths; nothing is ever added
# to the host's own namespace. What can outlive a namespace is a process
# still inside it (the namespace then lingers, nameless), so those are killed
# first.
set -euo pipefail
# shellcheck source=testbed/netns/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pc_require_root

ns_pids() {
    pc_ns_exists "$1" || return 0
    # Never kill the shell running this script, should it run inside a namespace.
    ip netns pids "$1" 2>/dev/null | grep -vx -e "$$" -e "$BASHPID" || true
}

kill_ns_processes() {
    local ns pids=() sig i
    for sig in TERM KILL; do
        pids=()
        for ns in "${PC_NAMESPACES[@]}"; do
            mapfile -t -O "${#pids[@]}" pids < <(ns_pids "$ns")
        done
        ((${#pids[@]})) || return 0
        kill "-$sig" "${pids[@]}" 2>/dev/null || true
        # Give TERM up to 3 s (nginx and the agents flush logs on exit).
        for ((i = 0; i < 30; i++)); do
            local alive=0 p
            for p in "${pids[@]}"; do
                kill -0 "$p" 2>/dev/null && alive=1 && break
            done
            ((alive)) || break
            sleep 0.1
        done
    done
    for ns in "${PC_NAMESPACES[@]}"; do
        if [[ -n "$(ns_pids "$ns")" ]]; then
            echo "down.sh: processes survive SIGKILL in $ns: $(ns_pids "$ns" | tr '\n' ' ')" >&2
            return 1
        fi
    done
}

kill_ns_processes

for ns in "${PC_NAMESPACES[@]}"; do
    if pc_ns_exists "$ns"; then
        ip netns delete "$ns"
    fi
done

# Pid files of the daemons just killed, and the address file of the topology
# just removed; logs and the generated origin files are kept for post-mortems
# and reuse.
rm -f "$PC_STATE"/run/*.pid "$PC_STATE/netns.env" 2>/dev/null || true
