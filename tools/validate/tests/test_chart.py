"""Template tests of charts/polycorn: `helm template` with given values, then
assertions on the rendered objects (helm-unittest's job, without its plugin)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import (
    BASE,
    CHART,
    REPO,
    TABLE_VERIFY_KEY,
    Obj,
    envoy_bootstrap,
    helm_bin,
    merge,
    named,
    of_kind,
    pod_specs,
    render,
    render_error,
)

pytestmark = pytest.mark.usefixtures("helm")

TRAINS: list[Obj] = [{"id": "train-0042"}, {"id": "train-0043"}, {"id": "ice-4711"}]


def container(objs: list[Obj], kind: str, name: str) -> Obj:
    o = named(objs, kind, name)
    spec = o["spec"]["template"]["spec"] if kind != "CronJob" else None
    if spec is None:
        spec = o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert isinstance(c, dict)
    return c


def flag(args: list[str], name: str) -> str | None:
    """The value of --name=value in args (None if absent)."""
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


# ------------------------------------------------------------ proxies per train


def test_one_proxy_statefulset_per_train_each_knowing_its_train() -> None:
    objs = render({"trains": TRAINS})
    sets = of_kind(objs, "StatefulSet")
    # Release "polycorn" of chart "polycorn": the prefix is "polycorn".
    assert sorted(s["metadata"]["name"] for s in sets) == sorted(
        f"polycorn-proxy-{t['id']}" for t in TRAINS
    )
    for t in TRAINS:
        (s,) = [x for x in sets if x["metadata"]["name"].endswith(f"-proxy-{t['id']}")]
        assert s["spec"]["replicas"] == 1
        assert s["spec"]["selector"]["matchLabels"]["polycorn.io/train"] == t["id"]
        c = s["spec"]["template"]["spec"]["containers"][0]
        assert flag(c["args"], "train-id") == t["id"]
        assert c["command"] == ["polycorn-proxy"]
        # Its own certificate Secret, by name, mounted where --cert/--key point.
        vols = {v["name"]: v for v in s["spec"]["template"]["spec"]["volumes"]}
        assert vols["tls"]["secret"]["secretName"] == f"{s['metadata']['name']}-tls"
        assert flag(c["args"], "cert") == "/etc/polycorn/tls/tls.crt"
        assert flag(c["args"], "key") == "/etc/polycorn/tls/tls.key"
        # Its headless Service, which Envoy resolves.
        svc = named(objs, "Service", s["metadata"]["name"])
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["selector"] == s["spec"]["selector"]["matchLabels"]


def test_adding_a_train_adds_its_proxy_and_changes_no_other_proxy() -> None:
    before = render({"trains": TRAINS[:2]})
    after = render({"trains": TRAINS})
    assert len(of_kind(after, "StatefulSet")) == len(of_kind(before, "StatefulSet")) + 1
    for s in of_kind(before, "StatefulSet"):
        assert named(after, "StatefulSet", s["metadata"]["name"]) == s


def test_train_ids_sorted_out_by_the_schema() -> None:
    assert "/trains/0/id" in render_error({"trains": [{"id": "Train_42"}]})
    assert "/trains/0/id" in render_error({"trains": [{"id": "t" * 25}]})
    assert "listed twice" in render_error({"trains": [{"id": "a"}, {"id": "a"}]})


# ------------------------------------------------------------ Envoy SNI routing


def test_envoy_routes_each_train_by_sni_to_its_own_proxy() -> None:
    trains: list[Obj] = [*TRAINS[:2], {"id": "ice-4711", "serverNames": ["ice.trains.example.net"]}]
    objs = render({"trains": trains})
    boot = envoy_bootstrap(objs)
    (lst,) = [x for x in boot["static_resources"]["listeners"] if x["name"] == "trains"]
    assert [f["name"] for f in lst["listener_filters"]] == ["envoy.filters.listener.tls_inspector"]
    assert lst["per_connection_buffer_limit_bytes"] == 32768
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    routes = {}
    for chain in lst["filter_chains"]:
        (f,) = chain["filters"]
        assert f["name"] == "envoy.filters.network.tcp_proxy"
        # Passthrough: no TLS termination for trains.
        assert "transport_socket" not in chain
        for sni in chain["filter_chain_match"]["server_names"]:
            routes[sni] = f["typed_config"]["cluster"]
    assert routes == {
        "train-0042.proxy.polycorn": "train_train-0042",
        "train-0043.proxy.polycorn": "train_train-0043",
        "ice.trains.example.net": "train_ice-4711",
    }
    for t in trains:
        c = clusters[f"train_{t['id']}"]
        assert c["per_connection_buffer_limit_bytes"] == 32768
        (ep,) = c["load_assignment"]["endpoints"][0]["lb_endpoints"]
        addr = ep["endpoint"]["address"]["socket_address"]
        proxy = [
            s["metadata"]["name"]
            for s in of_kind(objs, "StatefulSet")
            if s["metadata"]["labels"]["polycorn.io/train"] == t["id"]
        ]
        assert addr["address"] == f"{proxy[0]}.fleet.svc.cluster.local"
        assert addr["port_value"] == 4433


def test_a_server_name_of_two_trains_is_rejected() -> None:
    err = render_error(
        {
            "trains": [
                {"id": "a", "serverNames": ["x.example"]},
                {"id": "b", "serverNames": ["x.example"]},
            ]
        }
    )
    assert "used by two trains" in err


def test_port_routing_gives_each_train_a_listener_and_service_port() -> None:
    trains = [{"id": "a", "edgePort": 4501}, {"id": "b", "edgePort": 4502}]
    objs = render({"trains": trains, "envoy": {"trains": {"routing": "port"}}})
    boot = envoy_bootstrap(objs)
    lst = {x["name"]: x for x in boot["static_resources"]["listeners"]}
    assert lst["train_a"]["address"]["socket_address"]["port_value"] == 4501
    assert lst["train_b"]["address"]["socket_address"]["port_value"] == 4502
    assert "trains" not in lst
    ports = {p["port"] for p in named(objs, "Service", "polycorn-envoy")["spec"]["ports"]}
    assert {4501, 4502} <= ports
    assert "needs an edgePort" in render_error(
        {"trains": [{"id": "a"}], "envoy": {"trains": {"routing": "port"}}}
    )


# ------------------------------------------------------------ QUIC


QUIC_TRAINS: list[Obj] = [
    {"id": "train-0042", "quicPort": 4601},
    {"id": "train-0043", "quicPort": 4602},
    {"id": "ice-4711", "serverNames": ["ice.trains.example.net"], "quicPort": 4603},
]


def _udp_listeners(boot: Obj) -> dict[str, Obj]:
    return {
        x["name"]: x
        for x in boot["static_resources"]["listeners"]
        if x["address"]["socket_address"].get("protocol") == "UDP"
    }


def _udp_route(lst: Obj) -> tuple[Obj, str]:
    """A UDP listener's udp_proxy config and the cluster it sends to."""
    (f,) = lst["listener_filters"]
    assert f["name"] == "envoy.filters.udp_listener.udp_proxy"
    cfg = f["typed_config"]
    assert cfg["@type"].endswith("udp_proxy.v3.UdpProxyConfig")
    route = cfg["matcher"]["on_no_match"]["action"]["typed_config"]
    assert route["@type"].endswith("udp_proxy.v3.Route")
    return cfg, route["cluster"]


def _ports(svc: Obj) -> set[tuple[int, str]]:
    return {(p["port"], p["protocol"]) for p in svc["spec"]["ports"]}


def test_quic_is_off_by_default_and_nothing_is_udp() -> None:
    objs = render({"trains": QUIC_TRAINS})
    assert _udp_listeners(envoy_bootstrap(objs)) == {}
    for sts in of_kind(objs, "StatefulSet"):
        assert flag(sts["spec"]["template"]["spec"]["containers"][0]["args"], "transport") == "tls"
    for svc in of_kind(objs, "Service"):
        assert all(p["protocol"] == "TCP" for p in svc["spec"]["ports"]), svc["metadata"]["name"]


def test_quic_gives_each_train_a_udp_listener_to_its_own_proxy() -> None:
    objs = render({"trains": QUIC_TRAINS, "quic": {"enabled": True}})
    boot = envoy_bootstrap(objs)
    udp = _udp_listeners(boot)
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    assert set(udp) == {f"train_{t['id']}_quic" for t in QUIC_TRAINS}
    for t in QUIC_TRAINS:
        lst = udp[f"train_{t['id']}_quic"]
        assert lst["address"]["socket_address"]["port_value"] == t["quicPort"]
        assert "filter_chains" not in lst
        cfg, cluster = _udp_route(lst)
        # Envoy keeps a carrier's session longer than the relay's QUIC idle timeout (30 s).
        assert cfg["idle_timeout"] == "60s"
        assert cluster == f"train_{t['id']}_quic"
        (ep,) = clusters[cluster]["load_assignment"]["endpoints"][0]["lb_endpoints"]
        addr = ep["endpoint"]["address"]["socket_address"]
        proxy = f"polycorn-proxy-{t['id']}"
        assert addr == {"address": f"{proxy}.fleet.svc.cluster.local", "port_value": 4433}
        # The proxy takes QUIC on UDP at its TCP port, and says so in its Service and pod.
        assert (4433, "UDP") in _ports(named(objs, "Service", proxy))
        c = container(objs, "StatefulSet", proxy)
        assert flag(c["args"], "transport") == "quic"
        assert flag(c["args"], "listen") == "0.0.0.0:4433"
        assert {"name": "quic", "containerPort": 4433, "protocol": "UDP"} in c["ports"]
    # TLS keeps its SNI listener: the fallback of a carrier without UDP.
    tcp = [x for x in boot["static_resources"]["listeners"] if x["name"] == "trains"]
    assert len(tcp[0]["filter_chains"]) == len(QUIC_TRAINS)
    edge = _ports(named(objs, "Service", "polycorn-envoy"))
    assert edge == {(4433, "TCP"), (443, "TCP")} | {(t["quicPort"], "UDP") for t in QUIC_TRAINS}
    pod = container(objs, "Deployment", "polycorn-envoy")
    assert {(p["containerPort"], p["protocol"]) for p in pod["ports"]} >= {
        (t["quicPort"], "UDP") for t in QUIC_TRAINS
    }


def test_quic_with_port_routing_uses_each_trains_edge_port_over_udp() -> None:
    trains = [{"id": "a", "edgePort": 4501}, {"id": "b", "edgePort": 4502, "quicPort": 4602}]
    objs = render(
        {"trains": trains, "envoy": {"trains": {"routing": "port"}}, "quic": {"enabled": True}}
    )
    udp = _udp_listeners(envoy_bootstrap(objs))
    assert udp["train_a_quic"]["address"]["socket_address"]["port_value"] == 4501
    assert udp["train_b_quic"]["address"]["socket_address"]["port_value"] == 4602
    assert _ports(named(objs, "Service", "polycorn-envoy")) >= {
        (4501, "TCP"), (4501, "UDP"), (4502, "TCP"), (4602, "UDP"),
    }  # fmt: skip


def test_network_policies_let_quic_through_where_they_let_tls() -> None:
    objs = render(
        {"trains": QUIC_TRAINS, "quic": {"enabled": True}, "networkPolicy": {"enabled": True}}
    )
    envoy = named(objs, "NetworkPolicy", "polycorn-envoy")
    edge = {(p["port"], p["protocol"]) for p in envoy["spec"]["ingress"][0]["ports"]}
    assert edge == {(4433, "TCP"), (8443, "TCP")} | {(t["quicPort"], "UDP") for t in QUIC_TRAINS}
    (to_proxies,) = [
        r
        for r in envoy["spec"]["egress"]
        if r.get("to", [{}])[0]
        .get("podSelector", {})
        .get("matchLabels", {})
        .get("app.kubernetes.io/component")
        == "proxy"
    ]
    assert {(p["port"], p["protocol"]) for p in to_proxies["ports"]} == {
        (4433, "TCP"),
        (4433, "UDP"),
    }
    proxy = named(objs, "NetworkPolicy", "polycorn-proxy")
    (subflows,) = [r for r in proxy["spec"]["ingress"] if r["ports"][0]["port"] == 4433]
    assert {(p["port"], p["protocol"]) for p in subflows["ports"]} == {(4433, "TCP"), (4433, "UDP")}
    assert (
        subflows["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "envoy"
    )


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"trains": [{"id": "a", "quicPort": 4601}, {"id": "b"}]}, 'train "b" needs a quicPort'),
        (
            {"trains": [{"id": "a", "quicPort": 4601}, {"id": "b", "quicPort": 4601}]},
            'quicPort 4601 of train "b" is also train "a"',
        ),
        (
            {
                "trains": [
                    {"id": "a", "edgePort": 4501},
                    {"id": "b", "edgePort": 4502, "quicPort": 4501},
                ],
                "envoy": {"trains": {"routing": "port"}},
            },
            'quicPort 4501 of train "b" is also train "a"',
        ),
        (
            {"trains": [{"id": "a", "quicPort": 4601}], "quic": {"sessionIdleTimeout": "30s"}},
            "must be more than 30s",
        ),
        ({"trains": [{"id": "a", "quicPort": 443}]}, "/trains/0/quicPort"),
        (
            {"trains": [{"id": "a", "quicPort": 4601}], "quic": {"sessionIdleTimeout": "1m"}},
            "/quic/sessionIdleTimeout",
        ),
    ],
    ids=[
        "no-port",
        "port-twice",
        "edge-port-taken",
        "idle-too-short",
        "privileged",
        "not-a-duration",
    ],
)
def test_quic_ports_and_timeout_are_checked(values: Obj, says: str) -> None:
    err = render_error({**values, "quic": {"enabled": True, **values.get("quic", {})}})
    assert says in err, err


def render_notes(values: Obj) -> str:
    """NOTES.txt as `helm install` prints it (`helm template` leaves it out):
    a copy of the chart with NOTES.txt turned into a ConfigMap's value."""
    with tempfile.TemporaryDirectory() as d:
        chart = Path(d) / "polycorn"
        shutil.copytree(CHART, chart, symlinks=False)
        notes = (chart / "templates" / "NOTES.txt").read_text()
        (chart / "templates" / "zz-notes.yaml").write_text(
            '{{- define "test.notes" }}' + notes + "{{- end }}\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
            'data: {notes: {{ include "test.notes" . | toJson }}}\n'
        )
        r = subprocess.run(
            [helm_bin(), "template", "polycorn", str(chart), "-n", "fleet", "-f", "-",
             "--show-only", "templates/zz-notes.yaml"],
            input=yaml.safe_dump(merge(BASE, values)), capture_output=True, text=True, check=True,
        )  # fmt: skip
    text = yaml.safe_load(r.stdout)["data"]["notes"]
    assert isinstance(text, str)
    return text


def test_notes_give_each_trains_relay_its_quic_port_only_with_quic() -> None:
    notes = render_notes({"trains": QUIC_TRAINS, "quic": {"enabled": True}})
    for t in QUIC_TRAINS:
        block = notes.split(f"{t['id']}: polycorn-relay", 1)[1].split("polycorn-relay", 1)[0]
        assert f"--transport quic --quic-port {t['quicPort']}" in block, block
    assert "--quic-port" not in render_notes({"trains": QUIC_TRAINS})


def test_api_is_https_with_local_rate_limiting_and_cert_from_a_secret() -> None:
    objs = render({"trains": TRAINS[:1]})
    boot = envoy_bootstrap(objs)
    (api,) = [x for x in boot["static_resources"]["listeners"] if x["name"] == "api"]
    (chain,) = api["filter_chains"]
    tls = chain["transport_socket"]["typed_config"]
    assert tls["@type"].endswith("DownstreamTlsContext")
    (cert,) = tls["common_tls_context"]["tls_certificates"]
    assert cert["certificate_chain"]["filename"] == "/etc/envoy/api-tls/tls.crt"
    hcm = chain["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    assert names == ["envoy.filters.http.local_ratelimit", "envoy.filters.http.router"]
    rl = hcm["http_filters"][0]["typed_config"]
    # Per client address, one bucket for keyed and one for keyless requests
    # (dynamic descriptors), never one global bucket that a flood exhausts.
    assert rl["always_consume_default_token_bucket"] is False
    assert rl["max_dynamic_descriptors"] == 20000
    buckets = {
        tuple((e["key"], e["value"]) for e in d["entries"]): d["token_bucket"]
        for d in rl["descriptors"]
    }
    assert buckets == {
        (("api_key", "absent"), ("remote_address", "")): {
            "max_tokens": 10,
            "tokens_per_fill": 5,
            "fill_interval": "1s",
        },
        (("api_key", "present"), ("remote_address", "")): {
            "max_tokens": 100,
            "tokens_per_fill": 50,
            "fill_interval": "1s",
        },
    }
    keyless, keyed = rl["rate_limits"]
    for r, value, expect in ((keyless, "absent", True), (keyed, "present", False)):
        match, addr = r["actions"]
        assert addr == {"remote_address": {}}
        hv = match["header_value_match"]
        assert (hv["descriptor_value"], hv["expect_match"]) == (value, expect)
        assert hv["headers"] == [
            {"name": "x-api-key", "present_match": False},
            {"name": "authorization", "present_match": False},
        ]
    # Only /v1/ reaches the API: /metrics, /docs, /openapi.json, /redoc stay inside.
    (vh,) = hcm["route_config"]["virtual_hosts"]
    to_api = [r for r in vh["routes"] if "route" in r]
    assert [r["match"] for r in to_api] == [{"prefix": "/v1/"}]
    assert to_api[0]["route"]["cluster"] == "linkdb_api"
    assert vh["routes"][-1]["match"] == {"prefix": "/"}
    assert vh["routes"][-1]["direct_response"]["status"] == 404
    assert hcm["normalize_path"] is True and hcm["merge_slashes"] is True
    dep = named(objs, "Deployment", "polycorn-envoy")
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["api-tls"]["secret"]["secretName"] == "api-tls"
    off = render({"envoy": {"api": {"rateLimit": {"enabled": False}}}})
    (api,) = [
        x for x in envoy_bootstrap(off)["static_resources"]["listeners"] if x["name"] == "api"
    ]
    hcm = api["filter_chains"][0]["filters"][0]["typed_config"]
    assert [f["name"] for f in hcm["http_filters"]] == ["envoy.filters.http.router"]


def test_the_table_key_is_sent_over_http_only_when_allowed() -> None:
    api = {"enabled": True, "apiKeySecret": "proxy-table-key"}
    name = "polycorn-proxy-train-0042"
    # The in-cluster default is plain http: refused without insecureHttp.
    err = render_error({"trains": TRAINS[:1], "proxy": {"failureTable": {"api": api}}})
    assert "clear text" in err and "insecureHttp" in err
    ok = render(
        {"trains": TRAINS[:1], "proxy": {"failureTable": {"api": {**api, "insecureHttp": True}}}}
    )
    args = container(ok, "StatefulSet", name)["args"]
    url = flag(args, "failure-table-url")
    assert url is not None and url.startswith("http://polycorn-linkdb-api.")
    assert "--failure-table-insecure-http" in args
    # https: no flag needed, none passed (insecureHttp or not).
    for insecure in (False, True):
        over_tls = {**api, "url": "https://linkdb.example.net", "insecureHttp": insecure}
        objs = render({"trains": TRAINS[:1], "proxy": {"failureTable": {"api": over_tls}}})
        args = container(objs, "StatefulSet", name)["args"]
        assert flag(args, "failure-table-url") == "https://linkdb.example.net"
        assert "--failure-table-insecure-http" not in args


def test_a_new_train_rolls_envoy() -> None:
    a = named(render({"trains": TRAINS[:1]}), "Deployment", "polycorn-envoy")
    b = named(render({"trains": TRAINS[:2]}), "Deployment", "polycorn-envoy")
    key = "checksum/config"
    assert (
        a["spec"]["template"]["metadata"]["annotations"][key]
        != b["spec"]["template"]["metadata"]["annotations"][key]
    )


# ------------------------------------------------------------ secrets


def test_no_secret_is_rendered_and_no_secret_material_is_a_value() -> None:
    objs = render({"trains": TRAINS, "linkdbApi": {"apiKeysSecret": "keys"}})
    assert of_kind(objs, "Secret") == []
    text = (CHART / "values.yaml").read_text() + (CHART / "values.schema.json").read_text()
    assert "BEGIN" not in text and "PRIVATE KEY" not in text
    # The example values carry public keys (tableSigning.verifyKeys), never
    # a private one.
    for f in (CHART / "ci").glob("*-values.yaml"):
        assert "PRIVATE KEY" not in f.read_text(), f.name
    schema_keys = set(re.findall(r'"([A-Za-z]+)":', (CHART / "values.schema.json").read_text()))
    secretish = (
        r"(?i).*password.*|.*token|private_?key|api_?key|cert(ificate)?|pem|dsn|database_?url"
    )
    assert not {k for k in schema_keys if re.fullmatch(secretish, k)}
    # The database URL only ever comes from a secretKeyRef.
    for where, spec in pod_specs(objs):
        for c in spec["containers"]:
            for e in c.get("env", []):
                if e["name"] == "POLYCORN_DATABASE_URL":
                    assert "value" not in e, where
                    assert e["valueFrom"]["secretKeyRef"]["name"].startswith("linkdb-url-"), where


def test_each_component_logs_in_to_linkdb_with_its_own_secret() -> None:
    # The roles of migration 0010 hold only if no two components share a login.
    component = {
        "migrations": "migrations",
        "ingest": "ingest",
        "linkdb-api": "linkdbapi",
        "trainer": "trainer",
        # The follower is the trainer: the same role.
        "trainer-follow": "trainer",
    }
    seen = set()
    for where, spec in pod_specs(render({"trains": TRAINS})):
        for c in spec["containers"]:
            for e in c.get("env", []):
                if e["name"] == "POLYCORN_DATABASE_URL":
                    name = e["valueFrom"]["secretKeyRef"]["name"]
                    want = next(v for k, v in component.items() if where.endswith(f"-{k}"))
                    assert name == f"linkdb-url-{want}", where
                    seen.add(name)
    assert len(seen) == 4, seen
    err = render_error({"postgresql": {"users": {"linkdbApi": {"secret": "linkdb-url-trainer"}}}})
    assert "name the same Secret key linkdb-url-trainer/database-url" in err, err


def test_required_secrets_are_asked_for() -> None:
    err = render_error(
        {
            "kafka": {"bootstrap": "k:9092"},
            "postgresql": {"users": {"migrations": {"secret": "m"}}},
        },
        base=False,
    )
    assert re.search(r"postgresql\.users\.(ingest|linkdbApi|trainer)\.secret is required", err), err
    assert "proxy.caSecret.name is required" in render_error(
        {"trains": TRAINS, "proxy": {"caSecret": {"name": ""}}}
    )
    assert "envoy.api.tlsSecret is required" in render_error({"envoy": {"api": {"tlsSecret": ""}}})


# ------------------------------------------------------------ signed failure tables

VERIFY_FLAG = "failure-table-verify-key"
SIGNING_FLAG = "table-signing-key"
# A second real public key (polycorn-pki table-key), for a rotation.
OTHER_VERIFY_KEY = (
    "-----BEGIN PUBLIC KEY-----\n"
    "MCowBQYDK2VwAyEAWql6p8FVMSOoEgJjWmikxG+n9SmLEWuuQjhvF81Fctc=\n"
    "-----END PUBLIC KEY-----\n"
)


def _volume_of(spec: Obj, c: Obj, path: str) -> tuple[Obj, Obj]:
    """(mount, volume) of the file ``path`` in container ``c``."""
    d = path.rpartition("/")[0]
    (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == d]
    (v,) = [v for v in spec["volumes"] if v["name"] == m["name"]]
    return m, v


def _trainer_pods(objs: list[Obj]) -> list[tuple[str, Obj]]:
    return [
        (where, spec)
        for where, spec in pod_specs(objs)
        if spec["containers"][0]["command"] == ["polycorn-trainer"]
    ]


@pytest.mark.parametrize("mode", ["cronjob", "service", "sharded"])
def test_the_trainer_signs_with_its_secret_and_every_proxy_verifies(mode: str) -> None:
    trainer: Obj = {"mode": "service"} if mode == "service" else {"mode": "cronjob"}
    if mode == "sharded":
        trainer |= {"shards": 4, "oneOffJob": {"enabled": True}}
    objs = render({"trains": TRAINS, "trainer": trainer})
    # The public key: one ConfigMap, exactly the value.
    cm = named(objs, "ConfigMap", "polycorn-table-verify-keys")
    assert cm["data"] == {"table-signing.pub": TABLE_VERIFY_KEY}
    proxies = of_kind(objs, "StatefulSet")
    assert len(proxies) == len(TRAINS)
    for sts in proxies:
        spec = sts["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        path = flag(c["args"], VERIFY_FLAG)
        assert path == "/etc/polycorn/table-verify/table-signing.pub", sts["metadata"]["name"]
        m, v = _volume_of(spec, c, path)
        assert m["readOnly"] is True
        assert v["configMap"]["name"] == cm["metadata"]["name"]
        item = {"key": "table-signing.pub", "path": "table-signing.pub"}
        assert v["configMap"]["items"] == [item]
        # The proxy reads the keys at start: a new key set rolls it.
        assert "checksum/table-verify-keys" in sts["spec"]["template"]["metadata"]["annotations"]
    # The private key: a Secret, mounted read-only, group-readable at most,
    # into the trainer's pods (the refit's and the follower's) and nowhere else.
    trainers = _trainer_pods(objs)
    assert len(trainers) == (3 if mode == "sharded" else 2)
    for where, spec in trainers:
        (c,) = spec["containers"]
        path = flag(c["args"], SIGNING_FLAG)
        assert path == "/etc/polycorn/table-signing/table-signing.key", where
        m, v = _volume_of(spec, c, path)
        assert m["readOnly"] is True, where
        assert v["secret"]["secretName"] == "table-signing", where
        assert v["secret"]["items"] == [{"key": "table-signing.key", "path": "table-signing.key"}]
        assert v["secret"]["defaultMode"] & 0o137 == 0, oct(v["secret"]["defaultMode"])
    for where, spec in pod_specs(objs):
        if (where, spec) in trainers:
            continue
        for vol in spec.get("volumes", []):
            assert vol.get("secret", {}).get("secretName") != "table-signing", where
        for c in spec["containers"]:
            assert flag(c.get("args", []), SIGNING_FLAG) is None, where


def test_a_key_rotation_gives_the_proxies_both_keys_and_restarts_them() -> None:
    def annotations(objs: list[Obj]) -> Obj:
        sts = named(objs, "StatefulSet", "polycorn-proxy-train-0042")
        a: Obj = sts["spec"]["template"]["metadata"]["annotations"]
        return a

    one = render({"trains": TRAINS[:1]})
    both_keys = TABLE_VERIFY_KEY + OTHER_VERIFY_KEY
    two = render({"trains": TRAINS[:1], "tableSigning": {"verifyKeys": both_keys}})
    cm = named(two, "ConfigMap", "polycorn-table-verify-keys")
    assert cm["data"]["table-signing.pub"] == both_keys
    key = "checksum/table-verify-keys"
    assert annotations(one)[key] != annotations(two)[key]
    # The Secret's key name is the operator's.
    objs = render(
        {"trains": TRAINS[:1], "tableSigning": {"signingKeySecret": {"key": "ed25519.pem"}}}
    )
    for where, spec in _trainer_pods(objs):
        _, v = _volume_of(spec, spec["containers"][0], "/etc/polycorn/table-signing/x")
        assert v["secret"]["items"] == [{"key": "ed25519.pem", "path": "table-signing.key"}], where


def test_tables_are_unsigned_only_when_signing_is_turned_off() -> None:
    off = {"enabled": False, "signingKeySecret": {"name": ""}, "verifyKeys": ""}
    objs = render({"trains": TRAINS, "tableSigning": off})
    assert [o for o in of_kind(objs, "ConfigMap") if "table-signing.pub" in o["data"]] == []
    for where, spec in pod_specs(objs):
        for c in spec["containers"]:
            args = c.get("args", [])
            assert flag(args, VERIFY_FLAG) is None and flag(args, SIGNING_FLAG) is None, where
        assert not [v for v in spec.get("volumes", []) if v["name"].startswith("table-")], where


def test_signing_on_without_its_key_or_secret_does_not_render() -> None:
    err = render_error({"trains": TRAINS[:1], "tableSigning": {"verifyKeys": ""}})
    assert "tableSigning.verifyKeys is required with tableSigning.enabled" in err
    assert "tableSigning.enabled=false" in err
    err = render_error({"trains": TRAINS[:1], "tableSigning": {"signingKeySecret": {"name": ""}}})
    assert "tableSigning.signingKeySecret.name is required with tableSigning.enabled" in err
    # Without trains (no proxy yet) the trainer still needs its key.
    err = render_error({"tableSigning": {"signingKeySecret": {"name": ""}}})
    assert "tableSigning.signingKeySecret.name is required" in err
    # Enabled is the default: leaving the section out of one's values fails.
    values = {k: v for k, v in BASE.items() if k != "tableSigning"}
    assert "tableSigning.signingKeySecret.name is required" in render_error(values, base=False)


def test_only_public_keys_are_accepted_as_verify_keys() -> None:
    label = "PRIVATE" + " KEY"  # not one literal: no key-scanner trips over this file
    private = f"-----BEGIN {label}-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END {label}-----\n"
    err = render_error({"trains": TRAINS[:1], "tableSigning": {"verifyKeys": private}})
    assert "tableSigning.verifyKeys holds a PRIVATE KEY" in err
    # Even beside a public key.
    err = render_error(
        {"trains": TRAINS[:1], "tableSigning": {"verifyKeys": TABLE_VERIFY_KEY + private}}
    )
    assert "holds a PRIVATE KEY" in err
    cert = TABLE_VERIFY_KEY.replace("PUBLIC KEY", "CERTIFICATE")
    err = render_error({"trains": TRAINS[:1], "tableSigning": {"verifyKeys": cert}})
    assert "-----BEGIN CERTIFICATE----- is not a PUBLIC KEY block" in err
    err = render_error({"trains": TRAINS[:1], "tableSigning": {"verifyKeys": "MCowBQYDK2Vw"}})
    assert "tableSigning.verifyKeys has no PEM block" in err
    cut = TABLE_VERIFY_KEY.rsplit("-----END", 1)[0]
    err = render_error({"trains": TRAINS[:1], "tableSigning": {"verifyKeys": cut}})
    assert "has no END line" in err


# ------------------------------------------------------------ monitoring flags


def test_monitoring_and_network_policies_are_off_by_default() -> None:
    objs = render({"trains": TRAINS})
    for kind in ("ServiceMonitor", "PrometheusRule", "NetworkPolicy"):
        assert of_kind(objs, kind) == [], kind


def grafana_maps(objs: list[Obj], label: str) -> list[Obj]:
    return [c for c in of_kind(objs, "ConfigMap") if c["metadata"]["labels"].get(label) == "1"]


def test_grafana_objects_are_off_by_default() -> None:
    objs = render({"trains": TRAINS})
    assert grafana_maps(objs, "grafana_dashboard") == []
    assert grafana_maps(objs, "grafana_datasource") == []


def test_grafana_dashboards_are_the_repository_dashboards() -> None:
    objs = render(
        {
            "trains": TRAINS,
            "metrics": {
                "grafana": {
                    "dashboards": {"enabled": True},
                    "linkdbDatasource": {
                        "enabled": True,
                        "host": "pg.internal",
                        "caCertPath": "/etc/grafana/linkdb-ca/ca.crt",
                    },
                }
            },
        }
    )
    dashboards = {
        name: json.loads(body)
        for c in grafana_maps(objs, "grafana_dashboard")
        for name, body in c["data"].items()
    }
    repo = {p.name: json.loads(p.read_text()) for p in (REPO / "dashboards").glob("*.json")}
    assert repo, "no dashboards in dashboards/"
    assert dashboards == repo
    (ds_map,) = grafana_maps(objs, "grafana_datasource")
    (ds,) = yaml.safe_load(ds_map["data"]["polycorn-linkdb.yaml"])["datasources"]
    # The uid the dashboards' LinkDB panels name; the password only by reference.
    assert ds["uid"] == "linkdb"
    assert ds["url"] == "pg.internal:5432"
    assert ds["secureJsonData"]["password"] == "${POLYCORN_GRAFANA_LINKDB_PASSWORD}"  # noqa: S105
    # The server's certificate is checked, name included, against the CA.
    assert ds["jsonData"]["sslmode"] == "verify-full"
    assert ds["jsonData"]["tlsConfigurationMethod"] == "file-path"
    assert ds["jsonData"]["sslRootCertFile"] == "/etc/grafana/linkdb-ca/ca.crt"
    uids = {
        t["datasource"]["uid"]
        for d in repo.values()
        for p in d["panels"]
        for t in p.get("targets", [])
        if isinstance(t.get("datasource"), dict)
    }
    assert uids <= {"linkdb", "prometheus"}, uids


def test_grafana_datasource_needs_a_host() -> None:
    err = render_error(
        {"trains": TRAINS, "metrics": {"grafana": {"linkdbDatasource": {"enabled": True}}}}
    )
    assert "linkdbDatasource.host is required" in err


def test_grafana_datasource_verify_full_needs_the_ca() -> None:
    err = render_error(
        {
            "trains": TRAINS,
            "metrics": {"grafana": {"linkdbDatasource": {"enabled": True, "host": "pg"}}},
        }
    )
    assert "linkdbDatasource.caCertPath is required with sslmode verify-full" in err


def test_service_monitors_give_the_shared_job_names_and_train_label() -> None:
    objs = render(
        {
            "trains": TRAINS,
            "trainer": {"mode": "service"},
            "metrics": {"serviceMonitor": {"enabled": True}},
        }
    )
    jobs = set()
    for sm in of_kind(objs, "ServiceMonitor"):
        assert sm["spec"]["jobLabel"] == "polycorn.io/job"
        sel = sm["spec"]["selector"]["matchLabels"]
        (port,) = [e["port"] for e in sm["spec"]["endpoints"]]
        svcs = [
            s
            for s in of_kind(objs, "Service")
            if "polycorn.io/job" in s["metadata"]["labels"]
            and all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())
        ]
        assert svcs, sm["metadata"]["name"]
        for s in svcs:
            assert port in [p["name"] for p in s["spec"]["ports"]]
            jobs.add(s["metadata"]["labels"]["polycorn.io/job"])
        if sel["app.kubernetes.io/component"] == "proxy":
            (relabel,) = sm["spec"]["endpoints"][0]["relabelings"]
            assert relabel["targetLabel"] == "train"
            assert relabel["sourceLabels"] == ["__meta_kubernetes_service_label_polycorn_io_train"]
            assert len(svcs) == len(TRAINS)
            assert {s["metadata"]["labels"]["polycorn.io/train"] for s in svcs} == {
                t["id"] for t in TRAINS
            }
    assert jobs == {
        "polycorn-proxy",
        "polycorn-ingest",
        "polycorn-trainer",
        "polycorn-trainer-follow",
        "polycorn-linkdb-api",
        "polycorn-envoy",
    }


def test_prometheus_rule_is_the_shared_rules_file() -> None:
    objs = render(
        {"metrics": {"prometheusRule": {"enabled": True}}, "trainer": {"mode": "service"}}
    )
    (pr,) = of_kind(objs, "PrometheusRule")
    src = yaml.safe_load((REPO / "services/prometheus/rules/polycorn.rules.yml").read_text())
    assert pr["spec"]["groups"] == src["groups"]
    cron = render({"metrics": {"prometheusRule": {"enabled": True}}})
    (pr,) = of_kind(cron, "PrometheusRule")
    assert pr["spec"]["groups"][:-1] == src["groups"]
    assert pr["spec"]["groups"][-1]["rules"][0]["alert"] == "PolycornTrainerCronJobStale"


def test_network_policies_cover_every_component() -> None:
    objs = render({"trains": TRAINS, "networkPolicy": {"enabled": True}})
    covered = {
        n["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for n in of_kind(objs, "NetworkPolicy")
    }
    assert covered == {
        "proxy",
        "envoy",
        "ingest",
        "linkdb-api",
        "trainer",
        "trainer-follow",
        "migrations",
    }
    envoy = named(objs, "NetworkPolicy", "polycorn-envoy")
    edge = {p["port"] for p in envoy["spec"]["ingress"][0]["ports"]}
    assert edge == {4433, 8443}  # trains (SNI) and the API, nothing else from anywhere
    proxy = named(objs, "NetworkPolicy", "polycorn-proxy")
    (subflows,) = [r for r in proxy["spec"]["ingress"] if r["ports"][0]["port"] == 4433]
    assert (
        subflows["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "envoy"
    )


# ------------------------------------------------------------ workloads


def test_ingest_defaults_to_one_consumer_per_partition() -> None:
    objs = render({"kafka": {"telemetryPartitions": 12}})
    assert named(objs, "Deployment", "polycorn-ingest")["spec"]["replicas"] == 12
    objs = render({"ingest": {"replicas": 3}})
    assert named(objs, "Deployment", "polycorn-ingest")["spec"]["replicas"] == 3


def _selects(selector: Obj, labels: Obj) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_ingest_and_the_api_scale_as_replicas_each_with_a_disruption_budget() -> None:
    objs = render({"ingest": {"replicas": 4}, "linkdbApi": {"autoscaling": {"enabled": False}}})
    ingest = named(objs, "Deployment", "polycorn-ingest")
    assert ingest["spec"]["replicas"] == 4
    # Every replica is the same pod: one consumer group.
    assert flag(container(objs, "Deployment", "polycorn-ingest")["args"], "group") == (
        "polycorn-ingest"
    )
    api = named(objs, "Deployment", "polycorn-linkdb-api")
    assert api["spec"]["replicas"] == 2
    assert of_kind(objs, "HorizontalPodAutoscaler") == []
    # The API's replicas behind its Service (and the headless one Envoy balances over).
    pods = api["spec"]["template"]["metadata"]["labels"]
    for svc in ("polycorn-linkdb-api", "polycorn-linkdb-api-headless"):
        assert _selects({"matchLabels": named(objs, "Service", svc)["spec"]["selector"]}, pods)
    for name, dep in (("polycorn-ingest", ingest), ("polycorn-linkdb-api", api)):
        pdb = named(objs, "PodDisruptionBudget", name)
        assert pdb["apiVersion"] == "policy/v1"
        assert pdb["spec"]["maxUnavailable"] == 1
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert _selects(pdb["spec"]["selector"], labels), name
        others = [
            d["metadata"]["name"]
            for d in of_kind(objs, "Deployment") + of_kind(objs, "StatefulSet")
            if d is not dep
            and _selects(pdb["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        assert others == [], f"{name}'s budget also counts {others}"
    objs = render(
        {
            "ingest": {"podDisruptionBudget": {"enabled": False, "maxUnavailable": 1}},
            "linkdbApi": {"podDisruptionBudget": {"enabled": False, "maxUnavailable": 1}},
        }
    )
    assert [p["metadata"]["name"] for p in of_kind(objs, "PodDisruptionBudget")] == [
        "polycorn-envoy"
    ]


def test_the_follower_is_one_deployment_beside_the_refits_and_can_be_turned_off() -> None:
    objs = render({"trainer": {"follow": {"pollS": 2, "extraArgs": ["--min-trains=3"]}}})
    dep = named(objs, "Deployment", "polycorn-trainer-follow")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "follow"
    assert flag(c["args"], "poll-s") == "2" and c["args"][-1] == "--min-trains=3"
    assert flag(c["args"], "metrics-addr") == "0.0.0.0:9468"
    assert "--workers" not in " ".join(c["args"])
    svc = named(objs, "Service", "polycorn-trainer-follow")
    assert svc["metadata"]["labels"]["polycorn.io/job"] == "polycorn-trainer-follow"
    # The refits are still there, and their pods are not the follower's.
    named(objs, "CronJob", "polycorn-trainer")
    off = render({"trainer": {"follow": {"enabled": False}}})
    assert [o for o in off if o["metadata"]["name"].endswith("-trainer-follow")] == []


def test_sharded_trainer_is_an_indexed_job_one_shard_per_index() -> None:
    objs = render({"trainer": {"shards": 8, "parallelism": 4, "oneOffJob": {"enabled": True}}})
    cron = named(objs, "CronJob", "polycorn-trainer")
    jobs = [cron["spec"]["jobTemplate"]["spec"], named(objs, "Job", "polycorn-trainer-r1")["spec"]]
    for job in jobs:
        assert job["completionMode"] == "Indexed"
        assert job["completions"] == 8
        assert job["parallelism"] == 4
        c = job["template"]["spec"]["containers"][0]
        assert flag(c["args"], "shard") == "$(JOB_COMPLETION_INDEX)/8"
        assert "--once" in c["args"]
        (env,) = [e for e in c["env"] if e["name"] == "JOB_COMPLETION_INDEX"]
        path = env["valueFrom"]["fieldRef"]["fieldPath"]
        assert path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    single = render({})
    job = named(single, "CronJob", "polycorn-trainer")["spec"]["jobTemplate"]["spec"]
    assert "completionMode" not in job
    assert flag(job["template"]["spec"]["containers"][0]["args"], "shard") is None


def test_trainer_service_mode_is_one_deployment_with_metrics() -> None:
    objs = render({"trainer": {"mode": "service", "intervalS": 1800}})
    assert of_kind(objs, "CronJob") == []
    dep = named(objs, "Deployment", "polycorn-trainer")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert flag(args, "interval-s") == "1800"
    assert flag(args, "metrics-addr") == "0.0.0.0:9467"


def test_linkdb_api_has_an_hpa_and_migrations_are_a_hook() -> None:
    objs = render({})
    hpa = named(objs, "HorizontalPodAutoscaler", "polycorn-linkdb-api")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "polycorn-linkdb-api"
    assert "replicas" not in named(objs, "Deployment", "polycorn-linkdb-api")["spec"]
    job = named(objs, "Job", "polycorn-migrations")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["polycorn-linkdb"]
    assert c["args"] == ["upgrade", "head"]


def test_every_container_is_limited_unprivileged_and_probed() -> None:
    objs = render(
        {
            "trains": TRAINS,
            "trainer": {"oneOffJob": {"enabled": True}, "shards": 2},
        }
    )
    seen = 0
    for where, spec in pod_specs(objs):
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["automountServiceAccountToken"] is False, where
        for c in spec["containers"]:
            seen += 1
            r = c["resources"]
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(r[part]), where
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            long_running = where.split()[0] in ("Deployment", "StatefulSet")
            if long_running:
                assert "livenessProbe" in c and "readinessProbe" in c, where
    assert seen >= 8


def test_images_default_to_the_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    objs = render({"trains": TRAINS[:1], "ingest": {"image": {"tag": "pinned"}}})
    for where, spec in pod_specs(objs):
        for c in spec["containers"]:
            if c["name"] == "envoy":
                continue
            want = "pinned" if c["name"] == "ingest" else chart["appVersion"]
            assert c["image"].endswith(f":{want}"), (where, c["image"])


# ------------------------------------------------------------ flow control


#: The options both binaries share: a clap struct flattened into each `struct Opts`.
COMMON_OPTS = REPO / "crates/net/src/options.rs"


def _opts_bodies(path: Path) -> list[str]:
    """The clap option structs of a binary: its `struct Opts`, and the shared
    `struct CommonOpts` when Opts flattens it."""
    text = path.read_text()
    bodies = [text.split("struct Opts {", 1)[1].split("\n}\n", 1)[0]]
    if "common: CommonOpts" in bodies[0]:
        common = COMMON_OPTS.read_text()
        bodies.append(common.split("pub struct CommonOpts {", 1)[1].split("\n}\n", 1)[0])
    return bodies


def _rust_defaults(path: Path) -> dict[str, int]:
    """Flag -> the numeric ``[default: N]`` its doc comment gives, in the clap
    option structs."""
    pattern = r"\[default: (\d+)[^\]]*\][^\n]*\n\s*#\[arg\([^\]]*\)\]\s*(?:pub )?(\w+):"
    return {
        "--" + f.replace("_", "-"): int(d)
        for body in _opts_bodies(path)
        for d, f in re.findall(pattern, body)
    }


FLOW_FLAGS = {
    "connWindow": "conn-window",
    "connWindowInitial": "conn-window-initial",
    "connSendBuffer": "conn-send-buffer",
    "memBudget": "mem-budget",
}


def _memory_bytes(q: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", q)
    assert m, q
    return int(m.group(1)) * units[m.group(2)]


def test_proxy_flow_control_defaults_are_the_binarys_and_half_the_memory_limit() -> None:
    objs = render({"trains": TRAINS[:1]})
    c = container(objs, "StatefulSet", "polycorn-proxy-train-0042")
    rendered = {name: flag(c["args"], name) for name in FLOW_FLAGS.values()}
    defaults = _rust_defaults(REPO / "proxy/src/main.rs")
    assert {f"--{k}" for k in rendered} <= set(defaults), defaults
    assert rendered == {k: str(defaults[f"--{k}"]) for k in rendered}
    assert int(rendered["mem-budget"] or 0) * 2 == _memory_bytes(c["resources"]["limits"]["memory"])


def test_proxy_flow_control_values_become_flags_and_are_checked() -> None:
    fc = {
        "connWindow": 1 << 21,
        "connWindowInitial": 1 << 21,
        "connSendBuffer": 1 << 20,
        "memBudget": 1 << 40,
    }
    c = container(
        render({"trains": TRAINS[:1], "proxy": {"flowControl": fc}}),
        "StatefulSet",
        "polycorn-proxy-train-0042",
    )
    # Whole numbers, never 1.099511627776e+12.
    assert {k: flag(c["args"], f) for k, f in FLOW_FLAGS.items()} == {
        k: str(v) for k, v in fc.items()
    }
    for key, bad in [
        ("connWindow", 65535),
        ("connWindowInitial", 1 << 31),
        ("connSendBuffer", "8Mi"),
        ("memBudget", 196607),
        ("memBudget", 268435456.5),
    ]:
        err = render_error({"proxy": {"flowControl": {key: bad}}})
        assert f"/proxy/flowControl/{key}" in err, (key, bad, err)
    assert "additional properties 'connWindowMax' not allowed" in render_error(
        {"proxy": {"flowControl": {"connWindowMax": 1 << 20}}}
    )
    fc = {"connWindow": 1 << 20, "connWindowInitial": 1 << 21}
    err = render_error({"proxy": {"flowControl": fc}})
    assert "(2097152) must be at most proxy.flowControl.connWindow (1048576)" in err


# ------------------------------------------------------------ the args are the real CLIs'


def _python_cli(path: Path) -> tuple[set[str], set[str]]:
    """(flags, subcommands) an argparse CLI defines."""
    tree = ast.parse(path.read_text())
    flags: set[str] = set()
    subs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            consts = [a.value for a in node.args if isinstance(a, ast.Constant)]
            strs = [s for s in consts if isinstance(s, str)]
            if node.func.attr == "add_argument":
                flags |= {s for s in strs if s.startswith("--")}
            elif node.func.attr == "add_parser" and strs:
                subs.add(strs[0])
    return flags, subs


def _rust_fields(path: Path) -> dict[str, str]:
    """Long flag -> field name, of the clap option structs."""
    out = {}
    for body in _opts_bodies(path):
        pattern = r"#\[arg\(([^\]]*)\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub )?(\w+):"
        for m in re.finditer(pattern, body):
            attrs, field = m.group(1), m.group(2)
            if "long" not in attrs:
                continue
            named_long = re.search(r'long\s*=\s*"([^"]+)"', attrs)
            out["--" + (named_long.group(1) if named_long else field.replace("_", "-"))] = field
    return out


def _rust_cli(path: Path) -> set[str]:
    """Long flags of the clap option structs."""
    return set(_rust_fields(path))


def _scripts() -> dict[str, str]:
    out = {}
    for pp in ("ingest", "trainer", "linkdb-api", "schema"):
        data = tomllib.loads((REPO / pp / "pyproject.toml").read_text())
        out.update(data["project"].get("scripts", {}))
    return out


CLIS: dict[str, Any] = {
    "polycorn-ingest": REPO / "ingest/polycorn_ingest/cli.py",
    "polycorn-trainer": REPO / "trainer/polycorn_trainer/cli.py",
    "polycorn-linkdb-api": REPO / "linkdb-api/polycorn_linkdb_api/main.py",
    "polycorn-linkdb": REPO / "schema/polycorn_schema/linkdb/cli.py",
    "polycorn-proxy": REPO / "proxy/src/main.rs",
}
# Envoy's command line (envoy --help); no Envoy binary can be installed here.
ENVOY_FLAGS = {"--config-path", "--log-level", "--disable-hot-restart"}


@pytest.mark.parametrize("scenario", sorted(p.name for p in (CHART / "ci").glob("*-values.yaml")))
def test_every_command_and_flag_is_one_the_real_cli_has(scenario: str) -> None:
    values = yaml.safe_load((CHART / "ci" / scenario).read_text())
    objs = render(values, base=False)
    scripts = _scripts()
    checked = 0
    known: set[str]
    subs: set[str]
    for where, spec in pod_specs(objs):
        for c in spec["containers"]:
            (cmd,) = c["command"]
            args = list(c.get("args", []))
            if cmd == "envoy":
                known, subs = ENVOY_FLAGS, set()
            elif cmd == "polycorn-proxy":
                known, subs = _rust_cli(CLIS[cmd]), set()
            else:
                assert cmd in scripts, f"{where}: {cmd} is no console script of the workspace"
                known, subs = _python_cli(CLIS[cmd])
            if subs:
                assert args and args[0] in subs, f"{where}: {cmd} {args[:1]} is not a subcommand"
                args = args[1:]
            for a in args:
                if a.startswith("--"):
                    name = a.split("=", 1)[0]
                    assert name in known, f"{where}: {cmd} has no flag {name}"
                    checked += 1
    assert checked > 10


def test_the_cli_parsers_find_flags() -> None:
    # Guards the two parsers above against silently finding nothing.
    assert {"--train-id", "--failure-table-topic", "--kafka-brokers"} <= _rust_cli(
        CLIS["polycorn-proxy"]
    )
    flags, subs = _python_cli(CLIS["polycorn-trainer"])
    assert {"--shard", "--once", "--interval-s"} <= flags
    assert {"run", "validate", "publish"} <= subs


def test_seeded_failure() -> None:
    """One proxy for one train. With POLYCORN_SEED_FAILURE=1 it expects two,
    which validate_chart.py uses to prove this suite can fail."""
    objs = render({"trains": TRAINS[:1]})
    want = 2 if os.environ.get("POLYCORN_SEED_FAILURE") == "1" else 1
    assert len(of_kind(objs, "StatefulSet")) == want


def _schema_paths(node: Obj, defs: Obj, prefix: str) -> list[str]:
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    out = []
    if (
        node.get("type") == "object"
        and "properties" in node
        and node.get("additionalProperties") is False
    ):
        for k, sub in node["properties"].items():
            out.append(f"{prefix}{k}")
            out += _schema_paths(sub, defs, f"{prefix}{k}.")
    return out


def test_every_value_the_schema_knows_has_a_documented_default() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    for path in _schema_paths(schema, schema["definitions"], ""):
        node: Any = values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                # Optional per-component keys the defaults leave out.
                break
            node = node[part]
        else:
            continue
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        # Per-train keys, and resource names beyond cpu and memory, are
        # optional: the defaults leave them out.
        if parent.startswith("trains") or parent.endswith((".requests", ".limits")):
            continue
        missing.append(path)
    assert missing == [], f"in values.schema.json but not in values.yaml: {missing}"
    # values.yaml explains itself: at least one comment line per four lines.
    comments = sum(1 for ln in lines if ln.strip().startswith("#"))
    assert comments * 4 >= len(lines), (comments, len(lines))


def _proxy_bin() -> Path:
    """The newest polycorn-proxy of target/release (``make build``) and target/debug."""
    candidates = [REPO / "target" / d / "polycorn-proxy" for d in ("release", "debug")]
    built = [b for b in candidates if b.is_file()]
    if not built:
        pytest.fail(
            "no target/release/polycorn-proxy or target/debug/polycorn-proxy: "
            "build it first (make build, or cargo build -p polycorn-proxy)"
        )
    return max(built, key=lambda p: p.stat().st_mtime)


def test_the_scheduler_enum_is_the_proxys_registry() -> None:
    """The enum is what the proxy lists as its built-in compositions, in its order."""
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    listed = subprocess.run(
        [_proxy_bin(), "--list-schedulers"], capture_output=True, text=True, check=True, env={}
    ).stdout.split()
    assert listed, "polycorn-proxy --list-schedulers printed nothing"
    enum = schema["definitions"]["scheduler"]["enum"]
    assert enum == listed, f"values.schema.json's scheduler enum {enum}, the proxy's {listed}"
    assert "/proxy/scheduler" in render_error({"proxy": {"scheduler": "fastest"}})


# ------------------------------------------------------------ Kafka and PostgreSQL security


def _env(c: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def _mounted(spec: Obj, c: Obj, path: str) -> Obj:
    """The Secret volume mounted in ``c`` at the directory of ``path``."""
    d, _, file = path.rpartition("/")
    (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == d]
    (v,) = [v for v in spec["volumes"] if v["name"] == m["name"]]
    assert any(i["path"] == file for i in v["secret"]["items"]), (path, v)
    return dict(v["secret"])


def _known_env() -> set[str]:
    # polycorn_net::options::command: POLYCORN_PROXY_ and the field's name, upper case.
    fields = _rust_fields(REPO / "proxy/src/main.rs").values()
    rust = {f"POLYCORN_PROXY_{f.upper()}" for f in fields}
    py = (REPO / "schema/polycorn_schema/kafka_security.py").read_text()
    return rust | set(re.findall(r'"(POLYCORN_KAFKA_[A-Z_]+)"', py))


def test_kafka_is_sasl_ssl_and_linkdb_verify_full_by_default() -> None:
    objs = render({"trains": TRAINS[:1]})
    known = _known_env()
    seen = set()
    for where, spec in pod_specs(objs):
        (c,) = spec["containers"]
        env = _env(c)
        cmd = c["command"][0]
        if "POLYCORN_DATABASE_URL" in env:
            assert env["PGSSLMODE"] == "verify-full", where
            ca = _mounted(spec, c, env["PGSSLROOTCERT"])
            assert ca["secretName"] == "linkdb-ca", where
        component = {"polycorn-proxy": "proxy", "polycorn-ingest": "ingest"}.get(cmd)
        if cmd == "polycorn-trainer":
            component = "trainer"
        if component is None:
            continue
        seen.add(component)
        prefix = "POLYCORN_PROXY_KAFKA_" if component == "proxy" else "POLYCORN_KAFKA_"
        kafka = {k: v for k, v in env.items() if k.startswith(prefix)}
        assert set(kafka) <= known, f"{where}: unknown {set(kafka) - known}"
        assert kafka[prefix + "SECURITY_PROTOCOL"] == "SASL_SSL", where
        assert kafka[prefix + "SASL_MECHANISM"] == "SCRAM-SHA-512", where
        assert kafka[prefix + "SASL_USERNAME"] == {
            "secretKeyRef": {"name": f"kafka-{component}", "key": "username"}
        }, where
        pw = _mounted(spec, c, kafka[prefix + "SASL_PASSWORD_FILE"])
        assert pw["secretName"] == f"kafka-{component}", where
        assert [i["key"] for i in pw["items"]] == ["password"], where
        assert _mounted(spec, c, kafka[prefix + "SSL_CA"])["secretName"] == "kafka-ca"
        # The password itself is never an argument or a value.
        assert not [a for a in c.get("args", []) if "password=" in a.lower()], where
    assert seen == {"proxy", "ingest", "trainer"}


def test_kafka_security_alternatives_and_missing_secrets() -> None:
    users = {c: {"secret": "", "tlsSecret": ""} for c in ("proxy", "ingest", "trainer")}
    # PLAINTEXT (a trusted network): no credentials mounted.
    objs = render(
        {"trains": TRAINS[:1], "kafka": {"security": {"protocol": "PLAINTEXT", "users": users}}}
    )
    c = container(objs, "Deployment", "polycorn-ingest")
    assert _env(c)["POLYCORN_KAFKA_SECURITY_PROTOCOL"] == "PLAINTEXT"
    assert not [k for k in _env(c) if k.startswith(("POLYCORN_KAFKA_SASL", "POLYCORN_KAFKA_SSL"))]
    # Mutual TLS: the component's kubernetes.io/tls Secret.
    mtls = {**users, "proxy": {"secret": "", "tlsSecret": "proxy-kafka-tls"}}
    objs = render({"trains": TRAINS[:1], "kafka": {"security": {"protocol": "SSL", "users": mtls}}})
    sts = named(objs, "StatefulSet", "polycorn-proxy-train-0042")
    spec = sts["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = _env(c)
    assert (
        _mounted(spec, c, env["POLYCORN_PROXY_KAFKA_SSL_CERT"])["secretName"] == "proxy-kafka-tls"
    )
    assert _mounted(spec, c, env["POLYCORN_PROXY_KAFKA_SSL_KEY"])["secretName"] == "proxy-kafka-tls"
    assert "POLYCORN_PROXY_KAFKA_SASL_USERNAME" not in env
    # What is missing is named.
    err = render_error({"kafka": {"security": {"users": {"trainer": {"secret": ""}}}}})
    assert (
        "kafka.security.users.trainer.secret is required with kafka.security.protocol SASL_SSL"
        in err
    )
    err = render_error({"postgresql": {"caSecret": {"name": ""}}})
    assert "postgresql.caSecret.name is required with postgresql.sslmode verify-full" in err
    err = render_error(
        {
            "kafka": {
                "security": {"protocol": "SASL_PLAINTEXT", "users": {"ingest": {"tlsSecret": "t"}}}
            }
        }
    )
    assert (
        "kafka.security.users.ingest.tlsSecret needs kafka.security.protocol SSL or SASL_SSL" in err
    )
    assert "/kafka/security/protocol" in render_error({"kafka": {"security": {"protocol": "TLS"}}})
    # require (no certificate check) needs no CA.
    objs = render({"postgresql": {"sslmode": "require", "caSecret": {"name": ""}}})
    c = container(objs, "Deployment", "polycorn-ingest")
    assert _env(c)["PGSSLMODE"] == "require" and "PGSSLROOTCERT" not in _env(c)


def test_every_proxy_keeps_the_highest_table_accepted_in_a_writable_volume() -> None:
    """--failure-table-state-dir on every proxy, signing on or off, in a
    writable emptyDir mounted at that path (the root filesystem is
    read-only), so a restarted container still refuses older tables."""
    on = render({"trains": TRAINS})
    off = render(
        {
            "trains": TRAINS,
            "tableSigning": {"enabled": False, "signingKeySecret": {"name": ""}, "verifyKeys": ""},
        }
    )
    for objs in (on, off):
        sets = of_kind(objs, "StatefulSet")
        assert len(sets) == len(TRAINS)
        for s in sets:
            spec = s["spec"]["template"]["spec"]
            c = spec["containers"][0]
            d = flag(c["args"], "failure-table-state-dir")
            assert d == "/var/lib/polycorn/table-state", s["metadata"]["name"]
            m, v = _volume_of(spec, c, f"{d}/failure-table.state")
            assert not m.get("readOnly") and "emptyDir" in v, s["metadata"]["name"]
