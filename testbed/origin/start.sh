#!/usr/bin/env bash
# Starts the testbed's "Internet" servers inside NS_INET (testbed/netns/up.sh
# must have run), all on 10.99.0.10:
#   :80    nginx: GET /files/* (make-files.sh), PUT/GET/DELETE /upload/*
#   :5201  iperf3 server
#   :7     TCP echo server (echo.py), for interactive / messaging tests
#   :53    dnsmasq (UDP and TCP): origin.test -> 10.99.0.10, for passengers'
#          DNS carried through the tunnel; and names of addresses no
#          passenger may reach (loopback.test, metadata.test, private.test,
#          proxy-host.test) for the passenger probe suite
#          (testbed/harness/polycorn_harness/probes.py)
# Pid files go to $PC_STATE/run/, logs to $PC_STATE/origin/logs/.
# Restarts anything already running, then returns once all three listen.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=testbed/netns/lib.sh
source "$here/../netns/lib.sh"
pc_require_root

pc_ns_exists "$NS_INET" || { echo "origin/start.sh: namespace $NS_INET does not exist: run testbed/netns/up.sh first" >&2; exit 1; }
for tool in nginx iperf3 python3 dnsmasq; do
    command -v "$tool" >/dev/null || { echo "origin/start.sh: $tool not found: run 'make setup'" >&2; exit 1; }
done

"$here/stop.sh"

origin=$PC_STATE/origin
run=$PC_STATE/run
mkdir -p "$origin/logs" "$origin/tmp" "$origin/www/upload" "$run"
"$here/make-files.sh" "$origin/www/files"

in_inet() { ip netns exec "$NS_INET" "$@"; }

nginx_args=(-p "$origin/" -c "$here/nginx.conf" -e "$origin/logs/error.log" -g "pid $run/nginx.pid;")
# -t first: a config error then reads as one clear message, not a timeout.
in_inet nginx -q -t "${nginx_args[@]}"
in_inet nginx "${nginx_args[@]}"

in_inet iperf3 -s -D -B "$ORIGIN_ADDR" -p 5201 -I "$run/iperf3.pid" --logfile "$origin/logs/iperf3.log"

# setsid: the echo server must not die with the shell (or CI step) that
# started it; it is stopped by pid file or by down.sh.
in_inet setsid python3 "$here/echo.py" --bind "$ORIGIN_ADDR" --port 7 --pidfile "$run/echo.pid" \
    </dev/null >>"$origin/logs/echo.log" 2>&1 &
disown

# No upstream servers: it answers only for its own names, never forwards.
in_inet dnsmasq --keep-in-foreground --no-resolv --no-hosts --bind-interfaces --listen-address="$ORIGIN_ADDR" \
    --port=53 --address=/origin.test/"$ORIGIN_ADDR" \
    --address=/loopback.test/127.0.0.1 --address=/loopback.test/::1 --address=/metadata.test/169.254.169.254 \
    --address=/private.test/10.0.0.1 --address=/proxy-host.test/"$INET_GW_ADDR" --pid-file="$run/dnsmasq.pid" --log-facility=- \
    </dev/null >>"$origin/logs/dnsmasq.log" 2>&1 &
disown

for ((i = 0; i < 50; i++)); do
    listening=$(in_inet ss -Hltn "src $ORIGIN_ADDR and ( sport = :80 or sport = :5201 or sport = :7 or sport = :53 )" | wc -l)
    ((listening >= 4)) && [[ -s $run/echo.pid ]] && break
    sleep 0.1
done
if ((listening < 4)); then
    echo "origin/start.sh: servers did not all start within 5 s; listening:" >&2
    in_inet ss -ltnp >&2
    echo "logs: $origin/logs/" >&2
    exit 1
fi
echo "origin up in $NS_INET: http://$ORIGIN_ADDR/files/ (PUT to /upload/), iperf3 $ORIGIN_ADDR:5201, echo $ORIGIN_ADDR:7, DNS $ORIGIN_ADDR:53"
