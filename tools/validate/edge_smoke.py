"""The chart's train path, end to end on loopback, with the real binaries.

    python edge_smoke.py --helm HELM --bin-dir target/release

No Envoy binary can be installed here, so this stands in for it with the
routing table the chart renders. It runs these steps:

1. Render the chart for two trains.
2. Issue the certificates as NOTES.txt tells operators to (``polycorn-pki
   init-ca``, ``issue-train``, and ``issue-proxy --san <the train's server
   name>``), laid out like the Secrets the pods mount.
3. Start the real ``polycorn-proxy`` of train A with the command line from
   the rendered StatefulSet. Only the mount paths and the listen addresses
   change, to loopback. Its failure-table verify keys are the rendered
   ConfigMap's: two public keys made by ``polycorn-pki table-key`` (a
   rotation) given as the value ``tableSigning.verifyKeys``.
4. Run a small TCP front that reads each ClientHello's server name and
   forwards the connection by the rendered Envoy listener's
   ``filter_chain_match.server_names`` (the same table Envoy gets).
5. Start the real ``polycorn-relay`` of train A with ``--proxy-name`` as
   NOTES.txt prints it.

With ``--quic`` (the chart's quic.enabled) the front also stands in for
Envoy's per-train UDP listeners: a UDP proxy at train A's rendered
``quicPort`` (a session and an upstream socket per source address, as
Envoy's udp_proxy keeps them) to the proxy's UDP port of the rendered
cluster, and the relays run ``--transport quic --quic-port`` as NOTES.txt
prints it.

Checks:

- The proxy parses the rendered verify keys, both of them (its start-up log
  line), before it serves.
- The relay sends exactly the server name the chart routes on.
- Train A's proxy gets a path up (/readyz 200).
- Train B's relay, dialing A's name, is refused by A's proxy (mutual TLS).
- A relay dialing a name the chart does not route is closed at the front.
- Where the rendered train cluster has Envoy's ``upstream_proxy_protocol``
  transport socket, the front starts each connection with a PROXY protocol
  v2 header naming the relay's address, and the proxy (with the rendered
  ``--proxy-protocol-from``) logs the relay's own address and port as the
  subflow's peer, not the front's.
- With ``--quic``: the proxy runs ``--transport quic``; train A's rendered
  UDP listener sends to train A's proxy at its --listen port; train A's
  relay gets its subflow up over QUIC (the proxy logs transport quic)
  through the UDP front, not over the TLS fallback; when the front drops
  its sessions (an idle timeout, a NAT rebinding, another Envoy replica),
  the proxy's packets reach the relay through the new session.

Exit status: 0 all checks hold, 1 one fails, 2 bad usage or missing binaries.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "polycorn"
TRAINS = ["train-a", "train-b"]
UNROUTED = "nobody.proxy.polycorn"
VALUES: dict[str, Any] = {
    "kafka": {
        "bootstrap": "kafka:9092",
        "security": {
            "caSecret": {"name": "kafka-ca"},
            "users": {c: {"secret": f"kafka-{c}"} for c in ("proxy", "ingest", "trainer")},
        },
    },
    "postgresql": {
        "users": {
            c: {"secret": f"linkdb-url-{c.lower()}", "key": "database-url"}
            for c in ("migrations", "ingest", "linkdbApi", "trainer")
        },
        "caSecret": {"name": "linkdb-ca"},
    },
    "proxy": {"caSecret": {"name": "pki-ca"}},
    "envoy": {"api": {"tlsSecret": "api-tls"}},
    "trains": [{"id": t} for t in TRAINS],
}


class SmokeError(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flag_value(sts: dict[str, Any], name: str) -> str | None:
    """--name=value of a StatefulSet's container."""
    for a in sts["spec"]["template"]["spec"]["containers"][0]["args"]:
        if a.startswith(f"--{name}="):
            return str(a.split("=", 1)[1])
    return None


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 (loopback URL we built)
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def wait_status(url: str, want: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if http_status(url) == want:
            return True
        time.sleep(0.2)
    return False


# ------------------------------------------------------------ the rendered chart


def render(helm: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        out = subprocess.run(
            [helm, "template", "polycorn", str(CHART), "-n", "fleet", "-f", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def proxy_statefulset(objs: list[dict[str, Any]], train: str) -> dict[str, Any]:
    (s,) = [
        o
        for o in objs
        if o["kind"] == "StatefulSet" and o["metadata"]["labels"].get("polycorn.io/train") == train
    ]
    return s


def envoy_bootstrap(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rendered Envoy bootstrap (the ConfigMap's envoy.yaml)."""
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and "envoy.yaml" in o.get("data", {})]
    boot: dict[str, Any] = yaml.safe_load(cm["data"]["envoy.yaml"])
    return boot


def sni_table(objs: list[dict[str, Any]]) -> dict[str, str]:
    """server name -> train id, from the rendered Envoy trains listener."""
    boot = envoy_bootstrap(objs)
    (lst,) = [x for x in boot["static_resources"]["listeners"] if x["name"] == "trains"]
    table = {}
    for chain in lst["filter_chains"]:
        cluster = chain["filters"][0]["typed_config"]["cluster"]
        for name in chain["filter_chain_match"]["server_names"]:
            table[name] = cluster.removeprefix("train_")
    return table


PROXY_PROTOCOL_SOCKET = "envoy.transport_sockets.upstream_proxy_protocol"


def proxy_protocol_clusters(objs: list[dict[str, Any]]) -> set[str]:
    """The rendered Envoy clusters that start each connection with a PROXY
    protocol v2 header (their transport socket)."""
    boot = envoy_bootstrap(objs)
    out = set()
    for c in boot["static_resources"]["clusters"]:
        ts = c.get("transport_socket", {})
        if ts.get("name") == PROXY_PROTOCOL_SOCKET:
            if ts["typed_config"].get("config", {}).get("version") != "V2":
                raise SmokeError(f"cluster {c['name']}: PROXY protocol other than V2")
            out.add(c["name"])
    return out


def proxy_v2_header(src: tuple[str, int], dst: tuple[str, int]) -> bytes:
    """A PROXY protocol v2 header (PROXY command, TCP over IPv4), as Envoy's
    upstream_proxy_protocol transport socket writes it."""
    addrs = (
        socket.inet_aton(src[0]) + socket.inet_aton(dst[0])
        + src[1].to_bytes(2, "big") + dst[1].to_bytes(2, "big")
    )  # fmt: skip
    return b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x11]) + len(addrs).to_bytes(2, "big") + addrs


def subflows_up(log: Path) -> list[dict[str, Any]]:
    """The fields of each subflow the proxy logged up (JSON log)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        fields = rec.get("fields", {})
        if fields.get("message") == "subflow up":
            out.append(fields)
    return out


def subflow_peers(log: Path) -> list[str]:
    """The peers of the TLS subflows the proxy logged up."""
    return [str(f["peer"]) for f in subflows_up(log) if f.get("transport") == "tls"]


def quic_table(objs: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """train id -> (its UDP port at Envoy, the proxy port its cluster sends
    to), from the rendered Envoy UDP listeners and their clusters."""
    boot = envoy_bootstrap(objs)
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    table = {}
    for lst in boot["static_resources"]["listeners"]:
        sa = lst["address"]["socket_address"]
        if sa.get("protocol") != "UDP":
            continue
        (f,) = lst["listener_filters"]
        cfg = f["typed_config"]
        name = cfg["matcher"]["on_no_match"]["action"]["typed_config"]["cluster"]
        if name not in clusters:
            raise SmokeError(f"UDP listener {lst['name']} sends to an undefined cluster {name}")
        (ep,) = clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"]
        port = ep["endpoint"]["address"]["socket_address"]["port_value"]
        table[name.removeprefix("train_").removesuffix("_quic")] = (sa["port_value"], port)
    return table


class UdpFront(asyncio.DatagramProtocol):
    """Envoy's udp_proxy of one train's UDP listener: a session per source
    address, each with an upstream socket of its own to the proxy."""

    def __init__(self, train: str, upstream: tuple[str, int]) -> None:
        self.train = train
        self.upstream = upstream
        self.transport: Any = None
        self.sessions: dict[tuple[str, int], asyncio.DatagramTransport] = {}
        self.datagrams = 0
        #: Datagrams back to the relays since the last rebind().
        self.back = 0

    def protocol(self) -> UdpFront:
        """The protocol factory of create_datagram_endpoint: this front."""
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A datagram transport (sendto), whatever class asyncio gives it.
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.datagrams += 1
        up = self.sessions.get(addr)
        if up is not None:
            up.sendto(data)
            return
        asyncio.get_running_loop().create_task(self._open(addr, data))

    async def _open(self, addr: tuple[str, int], first: bytes) -> None:
        front = self

        class Back(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, _: tuple[str, int]) -> None:
                if front.transport is not None:
                    front.back += 1
                    front.transport.sendto(data, addr)

        if addr in self.sessions:
            self.sessions[addr].sendto(first)
            return
        up, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            Back, remote_addr=self.upstream
        )
        self.sessions[addr] = up
        up.sendto(first)

    def rebind(self) -> None:
        """Drop every session, as when one idles out, a carrier's NAT rebinds
        or the load balancer moves a flow to another Envoy replica: the next
        datagram opens a new session from a new upstream address."""
        for up in self.sessions.values():
            up.close()
        self.sessions.clear()
        self.back = 0

    async def arebind(self) -> None:
        self.rebind()

    def close(self) -> None:
        for up in self.sessions.values():
            up.close()
        if self.transport is not None:
            self.transport.close()


def quic_subflows(log: Path) -> int:
    """Subflows the proxy logged up over QUIC."""
    return sum(1 for f in subflows_up(log) if f.get("transport") == "quic")


# ------------------------------------------------------------ an SNI front


def client_hello_sni(data: bytes) -> str | None:
    """The server_name of a TLS ClientHello record (None: none or not TLS)."""
    try:
        if data[0] != 0x16 or data[5] != 0x01:
            return None
        p = 9 + 2 + 32  # record header, handshake header, version, random
        p += 1 + data[p]  # session id
        p += 2 + int.from_bytes(data[p : p + 2], "big")  # cipher suites
        p += 1 + data[p]  # compression methods
        end = p + 2 + int.from_bytes(data[p : p + 2], "big")
        p += 2
        while p + 4 <= end:
            ext, length = (
                int.from_bytes(data[p : p + 2], "big"),
                int.from_bytes(data[p + 2 : p + 4], "big"),
            )
            body = data[p + 4 : p + 4 + length]
            if ext == 0:  # server_name: list length, type 0 (host_name), name length, name
                name_len = int.from_bytes(body[3:5], "big")
                return body[5 : 5 + name_len].decode("ascii")
            p += 4 + length
    except IndexError:
        return None
    return None


class SniFront:
    """Routes each TLS connection by its server name, as Envoy's trains
    listener does; a name without a route is closed. With ``proxy_protocol``
    each forwarded connection starts with a PROXY protocol v2 header naming
    the client (``clients`` keeps their addresses)."""

    def __init__(self, routes: dict[str, tuple[str, int]], *, proxy_protocol: bool) -> None:
        self.routes = routes
        self.proxy_protocol = proxy_protocol
        self.seen: list[str | None] = []
        self.clients: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.read(16384), 5)
            sni = client_hello_sni(head)
            self.seen.append(sni)
            if sni not in self.routes:
                return
            up_r, up_w = await asyncio.open_connection(*self.routes[sni])
            if self.proxy_protocol:
                client = writer.get_extra_info("peername")[:2]
                self.clients.append(f"{client[0]}:{client[1]}")
                up_w.write(proxy_v2_header(client, self.routes[sni]))
            up_w.write(head)

            async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                with contextlib.suppress(OSError):
                    while data := await r.read(65536):
                        w.write(data)
                        await w.drain()
                with contextlib.suppress(OSError):
                    w.close()

            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        except (OSError, TimeoutError):
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()


# ------------------------------------------------------------ the smoke test


@contextlib.contextmanager
def process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield p
    finally:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def table_verify_keys(pki: Path, work: Path) -> str:
    """Two public keys of ``polycorn-pki table-key``, as the value
    tableSigning.verifyKeys takes them during a rotation."""
    pems = []
    for name in ("table-key-old", "table-key-new"):
        sh(str(pki), "table-key", "--out", str(work / name))
        pems.append((work / name / "table-signing.pub").read_text())
    return "".join(pems)


def mount_verify_keys(objs: list[dict[str, Any]], work: Path, corrupt: bool) -> dict[str, Path]:
    """The rendered verify-key ConfigMap, laid out as the proxy pod mounts it.
    ``corrupt``: a seeded error, the first key's algorithm identifier changed
    (still a PUBLIC KEY block, no longer Ed25519)."""
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and "table-signing.pub" in o["data"]]
    text: str = cm["data"]["table-signing.pub"]
    if corrupt:
        lines = text.splitlines(keepends=True)
        der = bytearray(base64.b64decode(lines[1]))
        der[8] ^= 0x01  # the OID 1.3.101.112 (Ed25519) becomes another
        lines[1] = base64.b64encode(bytes(der)).decode() + "\n"
        text = "".join(lines)
    d = work / "mnt-table-verify"
    d.mkdir()
    (d / "table-signing.pub").write_text(text)
    return {"/etc/polycorn/table-verify": d}


def verify_keys_loaded(log: Path) -> int | None:
    """The number of table verify keys the proxy logged at start (JSON log)."""
    for line in log.read_text(errors="replace").splitlines():
        if "must be signed by the trainer" in line:
            try:
                keys = json.loads(line).get("fields", {}).get("keys")
            except ValueError:
                return None
            return int(keys) if keys is not None else None
    return None


def make_secrets(pki: Path, work: Path, proxy_name: str, san: str) -> dict[str, Path]:
    """The CA, the trains' and the proxy's certificates, made as NOTES.txt
    says; returns the proxy pod's Secret mounts (mount path -> directory)."""

    ca_dir, trains_dir, proxy_dir = (str(work / d) for d in ("ca", "trains", "proxy"))
    sh(str(pki), "init-ca", "--out", ca_dir)
    for t in TRAINS:
        sh(str(pki), "issue-train", "--ca-dir", ca_dir, "--train-id", t, "--out", trains_dir)
    sh(
        str(pki),
        "issue-proxy",
        "--ca-dir",
        ca_dir,
        "--name",
        proxy_name,
        "--san",
        san,
        "--out",
        proxy_dir,
    )
    mounts = {"/etc/polycorn/ca": work / "mnt-ca", "/etc/polycorn/tls": work / "mnt-tls"}
    for d in mounts.values():
        d.mkdir()
    shutil.copy(work / "ca" / "ca.crt", mounts["/etc/polycorn/ca"] / "ca.crt")
    shutil.copy(work / "proxy" / f"{proxy_name}.crt", mounts["/etc/polycorn/tls"] / "tls.crt")
    shutil.copy(work / "proxy" / f"{proxy_name}.key", mounts["/etc/polycorn/tls"] / "tls.key")
    return mounts


def proxy_args(
    sts: dict[str, Any], mounts: dict[str, Path], listen: int, metrics: int
) -> list[str]:
    """The StatefulSet's proxy command line with loopback addresses and the
    local Secret directories."""
    out = []
    for arg in sts["spec"]["template"]["spec"]["containers"][0]["args"]:
        a = arg
        for mount, local in mounts.items():
            a = a.replace(mount, str(local))
        if a.startswith("--listen="):
            a = f"--listen=127.0.0.1:{listen}"
        elif a.startswith("--metrics-listen="):
            a = f"--metrics-listen=127.0.0.1:{metrics}"
        elif a.startswith("--kafka-brokers="):
            # Nothing listens there: the proxy must not need Kafka to serve.
            a = f"--kafka-brokers=127.0.0.1:{free_port()}"
        out.append(a)
    return out


def relay_cmd(
    bins: Path, work: Path, train: str, name: str, edge: int, *, extra: list[str]
) -> tuple[list[str], str]:
    """A relay-agent of ``train`` dialing ``name`` at the front (and ``extra``
    flags); its metrics URL."""
    rm = free_port()
    cmd = [
        str(bins / "polycorn-relay"),
        f"--train-id={train}",
        f"--path=carrier-0=@127.0.0.1:{edge}",
        f"--proxy-name={name}",
        f"--ca={work / 'ca' / 'ca.crt'}",
        f"--cert={work / 'trains' / f'{train}.crt'}",
        f"--key={work / 'trains' / f'{train}.key'}",
        f"--listen-socks=127.0.0.1:{free_port()}",
        f"--metrics-listen=127.0.0.1:{rm}",
        *extra,
    ]
    return cmd, f"http://127.0.0.1:{rm}"


def relays(
    bins: Path,
    work: Path,
    edge: int,
    sni_a: str,
    proxy_url: str,
    *,
    extra: list[str],
    quic_front: tuple[asyncio.AbstractEventLoop, UdpFront] | None,
) -> list[str]:
    """``quic_front`` (with QUIC): train A's UDP front and the loop it runs on."""
    failures = []
    # Another train's relay, dialing A's name: routed to A's proxy, refused.
    cmd, url = relay_cmd(bins, work, "train-b", sni_a, edge, extra=extra)
    with process(cmd, work / "relay-b.log"):
        wait_status(f"{url}/healthz", 200, 10)
        if wait_status(f"{url}/readyz", 200, 4):
            failures.append("train-b's relay got a path up through train-a's proxy")
    # A name the chart does not route: closed at the edge.
    cmd, url = relay_cmd(bins, work, "train-a", UNROUTED, edge, extra=extra)
    with process(cmd, work / "relay-x.log"):
        wait_status(f"{url}/healthz", 200, 10)
        if wait_status(f"{url}/readyz", 200, 3):
            failures.append("a relay dialing an unrouted name got a path up")
    if http_status(f"{proxy_url}/readyz") == 200:
        failures.append("train-a's proxy is ready before its own train connected")
    # Train A's relay, dialing the name NOTES.txt gives it.
    cmd, url = relay_cmd(bins, work, "train-a", sni_a, edge, extra=extra)
    with process(cmd, work / "relay-a.log"):
        if not wait_status(f"{proxy_url}/readyz", 200, 10):
            log = (work / "relay-a.log").read_text()[-1500:]
            failures.append(f"train-a's relay got no path up through the SNI front:\n{log}")
        elif not wait_status(f"{url}/readyz", 200, 5):
            failures.append("train-a's relay reports no path up")
        elif quic_front and not wait_for(lambda: quic_subflows(work / "proxy.log") > 0, 5):
            log = (work / "relay-a.log").read_text()[-1500:]
            failures.append(f"train-a's subflow is up over TLS, not QUIC:\n{log}")
        elif quic_front:
            loop, udp = quic_front
            asyncio.run_coroutine_threadsafe(udp.arebind(), loop).result(5)
            # Keep-alives flow every second both ways: the proxy must soon
            # answer at the new session's address (QUIC connection migration).
            if not wait_for(lambda: udp.back >= 3, 6):
                failures.append(
                    "after a new UDP session at the edge (NAT rebinding, another Envoy "
                    "replica), the proxy's QUIC packets no longer reach the relay"
                )
    return failures


def wait_for(cond: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return False


async def _shutdown(server: asyncio.Server) -> None:
    """Close the front and the connections it still forwards."""
    server.close()
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def quic_fronts(
    objs: list[dict[str, Any]], sts: dict[str, Any], args: list[str], listen: int, quic_port_of: str
) -> tuple[dict[int, UdpFront], list[str]]:
    """With quic.enabled: the UDP fronts of the rendered per-train listeners
    (loopback port -> front) and the relays' QUIC flags."""
    if "--transport=quic" not in args:
        raise SmokeError(f"quic.enabled, but the proxy runs {args}")
    quic_ports = quic_table(objs)
    rendered_listen = int(str(flag_value(sts, "listen")).rsplit(":", 1)[1])
    if set(quic_ports) != set(TRAINS) or quic_ports["train-a"][1] != rendered_listen:
        raise SmokeError(
            f"the rendered UDP listeners {quic_ports} do not send each train to its "
            f"proxy's --listen port {rendered_listen}"
        )
    # A loopback stand-in for each rendered quicPort. Only train A's proxy
    # runs: its port leads to it, train B's to nothing here.
    local = {t: free_udp_port() for t in TRAINS}
    fronts = {local["train-a"]: UdpFront("train-a", ("127.0.0.1", listen))}
    # --quic-port as NOTES.txt prints it; another train's: a seeded error.
    return fronts, ["--transport=quic", f"--quic-port={local[quic_port_of]}"]


def smoke_values(bins: Path, work: Path, *, quic: bool) -> dict[str, Any]:
    """The values rendered: two trains, signed tables, with quic.enabled each
    train's quicPort."""
    values: dict[str, Any] = {
        **VALUES,
        "tableSigning": {
            "signingKeySecret": {"name": "table-signing"},
            "verifyKeys": table_verify_keys(bins / "polycorn-pki", work),
        },
    }
    if quic:
        values["quic"] = {"enabled": True}
        values["trains"] = [{"id": t, "quicPort": 4601 + i} for i, t in enumerate(TRAINS)]
    return values


def front_checks(front: SniFront, sni_a: str, proxy_log: Path, *, quic: bool) -> list[str]:
    """What the front saw: the server names the relays sent, and with the
    PROXY protocol, that the proxy took the relays' addresses from it (over
    QUIC the subflows may all be QUIC, and then no TLS peer is logged)."""
    failures: list[str] = []
    if front.proxy_protocol:
        peers = subflow_peers(proxy_log)
        if (not peers and not quic) or not set(peers) <= set(front.clients):
            failures.append(
                f"the proxy's subflow peers {peers} are not the relays' addresses at the front "
                f"{front.clients}: the PROXY protocol header was not taken"
            )
        print(f"edge_smoke: PROXY protocol v2: the proxy saw the relays as {sorted(set(peers))}")
    seen = front.seen
    if sni_a not in seen:
        failures.append(f"the relay never sent the server name {sni_a!r} (seen: {seen})")
    if UNROUTED not in seen:
        failures.append(f"the unrouted relay's name was not seen (seen: {seen})")
    unexpected = [s for s in seen if s not in (sni_a, UNROUTED)]
    if unexpected:
        failures.append(f"server names the relays should not have sent: {unexpected}")
    print(f"edge_smoke: server names seen at the front: {sorted({str(s) for s in seen})}")
    return failures


def run(
    helm: str,
    bins: Path,
    work: Path,
    proxy_san: str | None,
    *,
    bad_verify_key: bool = False,
    quic: bool = False,
    quic_port_of: str = "train-a",
) -> list[str]:
    objs = render(helm, smoke_values(bins, work, quic=quic))
    table = sni_table(objs)
    sts = proxy_statefulset(objs, "train-a")
    names_a = [n for n, train in table.items() if train == "train-a"]
    sni_a = names_a[0]
    # --proxy-san: a seeded error (a certificate without the train's name).
    mounts = make_secrets(bins / "polycorn-pki", work, sts["metadata"]["name"], proxy_san or sni_a)
    mounts |= mount_verify_keys(objs, work, bad_verify_key)
    listen, metrics = free_port(), free_port()
    proxy_url = f"http://127.0.0.1:{metrics}"
    pp = "train_train-a" in proxy_protocol_clusters(objs)
    if pp != (flag_value(sts, "proxy-protocol-from") is not None):
        raise SmokeError(
            f"train-a's Envoy cluster sends a PROXY protocol header: {pp}; its proxy "
            f"expects one: {flag_value(sts, 'proxy-protocol-from')!r}"
        )
    front = SniFront(dict.fromkeys(names_a, ("127.0.0.1", listen)), proxy_protocol=pp)
    args = proxy_args(sts, mounts, listen, metrics)
    udp_fronts, extra = quic_fronts(objs, sts, args, listen, quic_port_of) if quic else ({}, [])
    cmd = [str(bins / "polycorn-proxy"), *args]
    with process(cmd, work / "proxy.log"):
        if not wait_status(f"{proxy_url}/healthz", 200, 15):
            log = (work / "proxy.log").read_text()[-2000:]
            raise SmokeError(f"the proxy did not come up:\n{log}")
        keys = verify_keys_loaded(work / "proxy.log")
        if keys != 2:
            raise SmokeError(
                f"the proxy did not log the 2 rendered table verify keys (got {keys}):\n"
                + (work / "proxy.log").read_text()[-2000:]
            )
        loop = asyncio.new_event_loop()
        edge = free_port()
        server = loop.run_until_complete(asyncio.start_server(front.handle, "127.0.0.1", edge))
        for port, udp in udp_fronts.items():
            loop.run_until_complete(
                loop.create_datagram_endpoint(udp.protocol, local_addr=("127.0.0.1", port))
            )
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            failures = relays(
                bins,
                work,
                edge,
                sni_a,
                proxy_url,
                extra=extra,
                quic_front=(loop, next(iter(udp_fronts.values()))) if udp_fronts else None,
            )
        finally:
            for udp in udp_fronts.values():
                loop.call_soon_threadsafe(udp.close)
            asyncio.run_coroutine_threadsafe(_shutdown(server), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()
    failures += front_checks(front, sni_a, work / "proxy.log", quic=quic)
    if udp_fronts:
        sessions = {u.train: (len(u.sessions), u.datagrams) for u in udp_fronts.values()}
        print(f"edge_smoke: UDP front (sessions, datagrams) per train: {sessions}")
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--helm", required=True)
    p.add_argument("--bin-dir", type=Path, default=REPO / "target" / "release")
    p.add_argument("--keep", type=Path, help="work in this directory and keep it")
    p.add_argument(
        "--proxy-san",
        help="issue the proxy certificate for this name instead of the train's (a seeded error)",
    )
    p.add_argument(
        "--bad-verify-key",
        action="store_true",
        help="mount the rendered verify key with its algorithm changed (a seeded error)",
    )
    p.add_argument(
        "--quic",
        action="store_true",
        help="quic.enabled: also the rendered UDP listeners, the relays on --transport quic",
    )
    p.add_argument(
        "--quic-port-of",
        choices=TRAINS,
        default="train-a",
        help="give train A's relay this train's --quic-port (another's: a seeded error)",
    )
    a = p.parse_args(argv)
    for b in ("polycorn-proxy", "polycorn-relay", "polycorn-pki"):
        if not (a.bin_dir / b).is_file():
            print(f"edge_smoke: {a.bin_dir / b} not built (make build)", file=sys.stderr)
            return 2
    with contextlib.ExitStack() as stack:
        work = a.keep or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="edge-smoke-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        try:
            failures = run(
                a.helm,
                a.bin_dir,
                work,
                a.proxy_san,
                bad_verify_key=a.bad_verify_key,
                quic=a.quic,
                quic_port_of=a.quic_port_of,
            )
        except (SmokeError, subprocess.CalledProcessError) as e:
            print(f"edge_smoke: FAIL: {e}", file=sys.stderr)
            return 1
    for f in failures:
        print(f"edge_smoke: FAIL: {f}", file=sys.stderr)
    if failures:
        return 1
    print(
        "edge_smoke: OK: the rendered proxy loads the rendered table verify keys; the relay "
        "sends the chart's server name; through the SNI front the rendered proxy accepts its "
        "own train, refuses another; an unrouted name is closed"
        + (
            "; the train's QUIC reaches its proxy through its rendered UDP listener"
            if a.quic
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
