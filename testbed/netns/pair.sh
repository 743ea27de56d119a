#!/usr/bin/env bash
# The relay/proxy pair on the bare namespace testbed (veth carriers, no link
# emulator): namespace plumbing for the harness (polycorn_harness.pair), which
# drives it from Python. Each subcommand does one thing and returns:
#
#   pair.sh up                       namespaces, the origin servers, the
#                                    development PKI, the proxy, the main relay
#   pair.sh up-bare                  the same without the proxy and the relay
#   pair.sh start-proxy [ARG]...     the proxy (extra flags appended)
#   pair.sh start-main-relay [ARG]...
#                                    the usual relay: transparent capture,
#                                    SOCKS5, DNS through the tunnel
#   pair.sh start-relay NAME TRAIN [ARG]...
#                                    another relay, as TRAIN (log, pid, spool
#                                    named NAME)
#   pair.sh stop NAME                SIGTERM, SIGKILL after 3 s (proxy, relay,
#                                    or a NAME given to start-relay)
#   pair.sh down                     everything stopped and removed, whatever
#                                    state up left
#
# PC_PREFIX, PC_CARRIERS, BIN and TRAIN_ID as for testbed/netns/up.sh and
# testbed/netns/lib-pair.sh. Logs: $PC_STATE/logs/NAME.log, appended across
# restarts within one `up` (which starts them empty).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=testbed/netns/lib.sh
source testbed/netns/lib.sh
# shellcheck source=testbed/netns/lib-pair.sh
source testbed/netns/lib-pair.sh

cmd=${1:-}
shift || true
case $cmd in
    up | up-bare)
        testbed/netns/up.sh >/dev/null
        testbed/origin/start.sh >/dev/null
        rm -rf "$PC_STATE/logs"
        pair_pki
        if [[ $cmd == up ]]; then
            start_proxy
            start_main_relay
        fi
        ;;
    start-proxy) start_proxy "$@" ;;
    start-main-relay) start_main_relay "$@" ;;
    start-relay)
        [[ $# -ge 2 ]] || { echo "usage: pair.sh start-relay NAME TRAIN [ARG]..." >&2; exit 2; }
        start_relay "$@"
        ;;
    stop)
        [[ $# -eq 1 ]] || { echo "usage: pair.sh stop NAME" >&2; exit 2; }
        stop_pid "$1"
        ;;
    down)
        testbed/origin/stop.sh >/dev/null 2>&1 || true
        # The relays and the proxy, whatever their names (down.sh also kills
        # anything left inside the namespaces).
        for f in "$PC_STATE"/run/*.pid; do
            [[ -e $f ]] || continue
            name=${f##*/}
            stop_pid "${name%.pid}" || true
        done
        testbed/netns/down.sh >/dev/null 2>&1 || true
        ;;
    *)
        echo "usage: pair.sh up|up-bare|start-proxy|start-main-relay|start-relay|stop|down [ARG]..." >&2
        exit 2
        ;;
esac
