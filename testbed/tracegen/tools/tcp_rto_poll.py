#!/usr/bin/env python3
"""Polls the kernel's tcp_info of every TCP socket with a given local port (run it
inside the sender's network namespace) and reports the RTO counters per socket.

Used by tcp_run.sh (make validate-tracegen: validate_tracegen.py) for
hsr-facts §15.8 item 12 (RTO share under
BBR iPerf). It reads tcp_info through NETLINK_SOCK_DIAG (INET_DIAG_INFO), because
iproute2's ss of this Debian does not print the RTO fields of Linux >= 6.7:
tcpi_total_rto (RTO firings, recurring ones included) and tcpi_total_rto_recoveries
(RTO episodes). Polling every INTERVAL seconds lets it attribute the firings to
episodes: an episode with >= 2 firings is one whose head segment was retransmitted
more than once by the retransmission timer (exponential backoff).

Usage: tcp_rto_poll.py PORT DURATION_S [INTERVAL_S]  -> JSON on stdout, one object
per socket that sent data, plus "kernel_ok": whether tcp_info has the RTO fields.
"""

import json
import socket
import struct
import sys
import time

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLM_F_DUMP = 0x300
NLMSG_DONE = 3
NLMSG_ERROR = 2
INET_DIAG_INFO = 2
TCP_INFO_MIN_LEN = 248  # up to tcpi_total_rto_time (Linux >= 6.7)


def request(seq):
    # struct inet_diag_req_v2: family, protocol, ext, pad, states, inet_diag_sockid (48 bytes)
    req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, 0xFFFFFFFF)
    req += b"\0" * 48
    hdr = struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
    return hdr + req


def dump(sock, seq):
    """Yields (sport, dport, cookie, tcp_info bytes) for every IPv4 TCP socket."""
    sock.send(request(seq))
    while True:
        data = sock.recv(1 << 20)
        off = 0
        while off + 16 <= len(data):
            length, mtype, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, off)
            if mtype == NLMSG_DONE:
                return
            if mtype == NLMSG_ERROR:
                raise OSError("sock_diag error")
            body = data[off + 16 : off + length]
            sport, dport = struct.unpack_from("!HH", body, 4)
            cookie = struct.unpack_from("=Q", body, 4 + 40)[0]
            a = 72
            info = None
            while a + 4 <= len(body):
                alen, atype = struct.unpack_from("=HH", body, a)
                if alen < 4:
                    break
                if atype == INET_DIAG_INFO:
                    info = body[a + 4 : a + alen]
                a += (alen + 3) & ~3
            if info is not None:
                yield sport, dport, cookie, info
            off += (length + 3) & ~3


def fields(info):
    padded = info + b"\0" * max(0, TCP_INFO_MIN_LEN - len(info))
    return {
        "ca_state": padded[1],
        "retransmits": padded[2],
        "backoff": padded[4],
        "unacked": struct.unpack_from("=I", padded, 24)[0],
        "total_retrans": struct.unpack_from("=I", padded, 100)[0],
        "data_segs_out": struct.unpack_from("=I", padded, 156)[0],
        "bytes_sent": struct.unpack_from("=Q", padded, 200)[0],
        "bytes_retrans": struct.unpack_from("=Q", padded, 208)[0],
        "total_rto": struct.unpack_from("=H", padded, 240)[0],
        "total_rto_recoveries": struct.unpack_from("=H", padded, 242)[0],
        "total_rto_time_ms": struct.unpack_from("=I", padded, 244)[0],
    }


def main():
    port = int(sys.argv[1])
    duration = float(sys.argv[2])
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    state = {}  # cookie -> dict
    kernel_ok = None
    seq = 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        seq += 1
        for sport, _dport, cookie, info in dump(sock, seq):
            if sport != port:
                continue
            if kernel_ok is None:
                kernel_ok = len(info) >= TCP_INFO_MIN_LEN
            f = fields(info)
            s = state.setdefault(cookie, {"episodes": [], "last": None, "max_unacked_at_rto": []})
            last = s["last"]
            if last is not None:
                d_rec = f["total_rto_recoveries"] - last["total_rto_recoveries"]
                d_rto = f["total_rto"] - last["total_rto"]
                if d_rec > 0:
                    # New episode(s); the first firing of each is its recovery start.
                    s["episodes"].extend([1] * d_rec)
                    d_rto -= d_rec
                    s["max_unacked_at_rto"].append(f["unacked"])
                if d_rto > 0 and s["episodes"]:
                    s["episodes"][-1] += d_rto
            else:
                s["first"] = f
            s["last"] = f
        time.sleep(interval)
    out = []
    for cookie, s in state.items():
        f = s["last"]
        if f is None or f["data_segs_out"] < 100:
            continue  # iperf3's control connection
        eps = s["episodes"]
        out.append(
            {
                "data_segs_out": f["data_segs_out"],
                "total_retrans": f["total_retrans"],
                "bytes_sent": f["bytes_sent"],
                "bytes_retrans": f["bytes_retrans"],
                "total_rto": f["total_rto"],
                "total_rto_recoveries": f["total_rto_recoveries"],
                "total_rto_time_ms": f["total_rto_time_ms"],
                "episodes_polled": len(eps),
                "episodes_multi_rto": sum(1 for e in eps if e >= 2),
                "firings_per_episode": eps,
                "unacked_at_rto": s["max_unacked_at_rto"],
                "first_seen_total_rto": s["first"]["total_rto"],
            }
        )
    json.dump({"kernel_ok": bool(kernel_ok), "port": port, "interval_s": interval, "sockets": out}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
