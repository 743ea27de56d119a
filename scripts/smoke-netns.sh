#!/usr/bin/env bash
# End-to-end check of the namespace testbed itself (not of Polycorn): builds
# the topology and the origin, checks every property the integration tests
# rely on, tears it all down and checks nothing is left behind.
#
# Uses its own PC_PREFIX (default "pcsmoke") so that it never tears down a
# topology a demo or test run is using. Needs root. About 5 s.
set -euo pipefail
export PC_PREFIX=${PC_PREFIX:-pcsmoke}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
netns=$root/testbed/netns
# shellcheck source=testbed/netns/lib.sh
source "$netns/lib.sh"
pc_require_root

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "  ok   $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL $*"; }
# check "description" cmd...: passes when cmd succeeds.
check() { local d=$1; shift; if "$@" >/dev/null 2>&1; then ok "$d"; else bad "$d"; fi; }
# check_fails "description" cmd...: passes when cmd fails.
check_fails() { local d=$1; shift; if "$@" >/dev/null 2>&1; then bad "$d"; else ok "$d"; fi; }

tmp=$(mktemp -d)
cleanup() { "$netns/down.sh" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
CURL=(curl -fsS --max-time 20)

echo "== up ($PC_PREFIX, $PC_CARRIERS carriers)"
"$netns/up.sh" >"$tmp/up.log"
"$root/testbed/origin/start.sh" >/dev/null
# shellcheck source=/dev/null
source "$PC_STATE/netns.env"
check "netns.env written" test "$NS_TRAIN" = "$PC_PREFIX-train"

echo "== origin, seen from $NS_CLOUD"
check "GET / answers 200" in_ns "$NS_CLOUD" "${CURL[@]}" -o /dev/null "http://$ORIGIN_ADDR/"
in_ns "$NS_CLOUD" "${CURL[@]}" -o "$tmp/1MiB.bin" "http://$ORIGIN_ADDR/files/1MiB.bin" || true
want=$(awk '$2 == "1MiB.bin" {print $1}' "$PC_STATE/origin/www/files/SHA256SUMS")
check "GET /files/1MiB.bin matches SHA256SUMS" test "$(sha256sum <"$tmp/1MiB.bin" | cut -d' ' -f1)" = "$want"
head -c 10485760 /dev/urandom >"$tmp/up.bin"
check "PUT 10 MiB to /upload/" in_ns "$NS_CLOUD" "${CURL[@]}" -T "$tmp/up.bin" "http://$ORIGIN_ADDR/upload/smoke.bin"
in_ns "$NS_CLOUD" "${CURL[@]}" -o "$tmp/down.bin" "http://$ORIGIN_ADDR/upload/smoke.bin" || true
check "GET of the upload has the same sha256" cmp -s "$tmp/up.bin" "$tmp/down.bin"
check "DELETE /upload/smoke.bin" in_ns "$NS_CLOUD" "${CURL[@]}" -X DELETE "http://$ORIGIN_ADDR/upload/smoke.bin"
check "iperf3 10 MB to $ORIGIN_ADDR:5201" in_ns "$NS_CLOUD" timeout 20 iperf3 -c "$ORIGIN_ADDR" -p 5201 -n 10M
check "echo server returns what it gets" in_ns "$NS_CLOUD" timeout 5 python3 - "$ORIGIN_ADDR" <<'PY'
import socket, sys
s = socket.create_connection((sys.argv[1], 7), timeout=3)
msg = b"hello from the train\n" * 100
s.sendall(msg)
s.shutdown(socket.SHUT_WR)
got = b""
while chunk := s.recv(65536):
    got += chunk
sys.exit(0 if got == msg else 1)
PY

echo "== isolation"
check_fails "$NS_TRAIN cannot reach $ORIGIN_ADDR" in_ns "$NS_TRAIN" curl -fsS --connect-timeout 2 -o /dev/null "http://$ORIGIN_ADDR/"
check_fails "$NS_PAX cannot reach $ORIGIN_ADDR without interception" in_ns "$NS_PAX" curl -fsS --connect-timeout 2 -o /dev/null "http://$ORIGIN_ADDR/"
check_fails "$NS_TRAIN forwards nothing (ip_forward=0)" test "$(in_ns "$NS_TRAIN" sysctl -n net.ipv4.ip_forward)" = 1

echo "== carriers"
for ((i = 0; i < PC_CARRIERS; i++)); do
    check "car$i reaches $(cpx_addr "$i") bound to car$i" in_ns "$NS_TRAIN" ping -c1 -W2 -I "$(car_if "$i")" "$(cpx_addr "$i")"
done
last=$((PC_CARRIERS - 1))
"$netns/link.sh" down "$last"
check_fails "link.sh down $last cuts carrier $last" in_ns "$NS_TRAIN" ping -c1 -W1 -I "$(car_if "$last")" "$(cpx_addr "$last")"
if ((last > 0)); then
    check "link.sh down $last leaves carrier 0 alone" in_ns "$NS_TRAIN" ping -c1 -W2 -I car0 "$(cpx_addr 0)"
fi
"$netns/link.sh" up "$last"
check "link.sh up $last restores it" in_ns "$NS_TRAIN" ping -c1 -W3 -I "$(car_if "$last")" "$(cpx_addr "$last")"
"$netns/link.sh" drop "$last"
check_fails "link.sh drop $last blackholes carrier $last" in_ns "$NS_TRAIN" ping -c1 -W1 -I "$(car_if "$last")" "$(cpx_addr "$last")"
"$netns/link.sh" undrop "$last"
check "link.sh undrop $last restores it" in_ns "$NS_TRAIN" ping -c1 -W2 -I "$(car_if "$last")" "$(cpx_addr "$last")"

if ((PC_CARRIERS > 1)) && [[ $MPTCP == 1 ]]; then
    # Kernel MPTCP: the subflow endpoints must make the kernel join over the
    # other carriers, on its own, for a connection opened over car0.
    in_ns "$NS_CLOUD" timeout 20 python3 - <<'PY' &
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_MPTCP)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 15099)); s.listen(1)
c, _ = s.accept()
while c.recv(1 << 16):
    pass
PY
    sink=$!
    before=$(in_ns "$NS_TRAIN" nstat -az MPTcpExtMPJoinSynAckRx | awk '/MPJoinSynAckRx/ {print $2}')
    in_ns "$NS_TRAIN" timeout 20 python3 - "$(cpx_addr 0)" <<'PY' || true
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_MPTCP)
for _ in range(50):
    try:
        s.connect((sys.argv[1], 15099)); break
    except ConnectionRefusedError:
        s.close(); time.sleep(0.1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_MPTCP)
buf = b"x" * 65536
for _ in range(320):  # 20 MiB
    s.sendall(buf)
s.close()
PY
    wait "$sink" || true
    after=$(in_ns "$NS_TRAIN" nstat -az MPTcpExtMPJoinSynAckRx | awk '/MPJoinSynAckRx/ {print $2}')
    check "kernel MPTCP joins extra subflows ($before -> $after MP_JOIN SYN/ACKs)" test "$((after - before))" -ge "$((PC_CARRIERS - 1))"
fi

echo "== passenger interception"
"$netns/intercept.sh" add 15001
"$netns/intercept.sh" add 15001  # must stay a single rule
check "intercept.sh add is idempotent" test "$(in_ns "$NS_TRAIN" iptables -t nat -S PREROUTING | grep -c 'REDIRECT --to-ports 15001')" = 1
in_ns "$NS_TRAIN" timeout 10 python3 - "$tmp/origdst" <<'PY' &
import socket, struct, sys
SO_ORIGINAL_DST = 80
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 15001)); s.listen(1)
open(sys.argv[1] + ".ready", "w").close()
c, peer = s.accept()
raw = c.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
port, addr = struct.unpack_from("!2xH4s", raw)
with open(sys.argv[1], "w") as f:
    f.write(f"{socket.inet_ntoa(addr)}:{port} from {peer[0]}\n")
c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\nintercepted")
c.close()
PY
listener=$!
for ((i = 0; i < 50; i++)); do [[ -e $tmp/origdst.ready ]] && break; sleep 0.1; done
body=$(in_ns "$NS_PAX" curl -fsS --max-time 5 "http://$ORIGIN_ADDR:80/" 2>&1 || true)
wait "$listener" || true
check "passenger's connection to $ORIGIN_ADDR:80 lands on the train's :15001" test "$body" = intercepted
check "SO_ORIGINAL_DST is $ORIGIN_ADDR:80 from $PAX_ADDR" test "$(cat "$tmp/origdst" 2>/dev/null)" = "$ORIGIN_ADDR:80 from $PAX_ADDR"
check "passenger UDP 443 (QUIC) is refused at once" in_ns "$NS_PAX" timeout 5 python3 "$netns/udp_refused.py" "$ORIGIN_ADDR" 443
"$netns/intercept.sh" del 15001
check_fails "intercept.sh del removes the REDIRECT" bash -c "ip netns exec '$NS_TRAIN' iptables -t nat -S PREROUTING | grep -q REDIRECT"
check_fails "intercept.sh del removes the UDP reject" in_ns "$NS_TRAIN" nft list table inet pc_intercept

echo "== teardown"
mapfile -t pids < <(for ns in "${PC_NAMESPACES[@]}"; do ip netns pids "$ns"; done)
check "origin processes were running (${#pids[@]})" test "${#pids[@]}" -ge 4
"$netns/down.sh"
"$netns/down.sh"  # twice: must be a no-op
left=0
for ns in "${PC_NAMESPACES[@]}"; do pc_ns_exists "$ns" && left=1; done
check_fails "no namespace left" test "$left" = 1
alive=0
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
check_fails "no process left" test "$alive" = 1
check_fails "no pid file left" compgen -G "$PC_STATE/run/*.pid"

echo "smoke-netns: $passed passed, $failed failed"
((failed == 0))
