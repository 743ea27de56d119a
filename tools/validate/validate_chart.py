"""Offline validation of the Helm chart charts/polycorn (part of ``make
validate-platform``), a pytest module: ``pytest tools/validate/validate_chart.py`` in the
workspace's environment (``uv run --all-packages``), whose Python is the one that parses
the services' command lines.

For every scenario ``charts/polycorn/ci/*-values.yaml``:

1. ``helm lint --strict`` (values.schema.json included);
2. ``helm template``;
3. kubeconform -strict on every rendered object, against the Kubernetes schemas of
   the PyPI package kubernetes-validate (made standalone by k8s_schemas.py). A kind
   without a schema is an error; the only kinds skipped are the Prometheus Operator's
   ServiceMonitor and PrometheusRule, which step 5 checks instead;
4. Envoy's bootstrap, from the rendered ConfigMap, against Envoy's own protobuf
   schemas (envoy/: go-control-plane, strict protojson, ValidateAll, every
   typed_config unpacked and validated, cluster references);
5. ServiceMonitor/PrometheusRule decoded strictly into the Prometheus Operator's Go
   types (monitoring/), and the rendered rule groups through promtool.

Then: every container's command line through the real CLI's parser (cli_args.py; the
proxy through its binary), the train path end to end on loopback (edge_smoke.py, when
``make build`` has built the binaries; over TLS by server name, and with quic.enabled
over QUIC by the train's UDP port), the template unit tests (tests/), and a seeded
error for each validator, which must reject it naming the error.

``KEEP=DIR`` keeps the rendered manifests in DIR. Tools come from ``scripts/setup.sh
chart`` (helm, kubeconform, the schemas and the validators, in the machine cache).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "polycorn"
CACHE = Path(os.environ.get("POLYCORN_CACHE", "/var/cache/polycorn"))
BIN = CACHE / "go" / "bin"
VENV = CACHE / "validate-venv"
RELEASE = ROOT / "target" / "release"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
#: Kinds kubeconform has no schema for, and what checks them instead (step 5).
CRD_KINDS = ("ServiceMonitor", "PrometheusRule")
#: Every kind the chart can render; each must appear in some scenario.
KINDS = (
    "ConfigMap",
    "CronJob",
    "Deployment",
    "HorizontalPodAutoscaler",
    "Job",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "PrometheusRule",
    "Service",
    "ServiceAccount",
    "ServiceMonitor",
    "StatefulSet",
)
HAVE_BINS = all(
    (RELEASE / b).exists() for b in ("polycorn-proxy", "polycorn-relay", "polycorn-pki")
)


def k8s_version() -> str:
    text = (ROOT / "scripts" / "setup.d" / "chart.sh").read_text()
    m = re.search(r"^K8S_SCHEMA_VERSION=(\S+)$", text, re.M)
    assert m, "scripts/setup.d/chart.sh sets no K8S_SCHEMA_VERSION"
    return m[1]


def run(cmd: Sequence[object], **env: str) -> tuple[int, str]:
    """``cmd``'s exit status and output (stdout and stderr). helm's note about the
    rules link, printed at every load, is dropped."""
    r = subprocess.run(
        [str(c) for c in cmd],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
        check=False,
    )
    out = "\n".join(ln for ln in r.stdout.splitlines() if "found symbolic link in path" not in ln)
    return r.returncode, out


def ok(cmd: Sequence[object], **env: str) -> str:
    code, out = run(cmd, **env)
    assert code == 0, (
        f"{Path(str(cmd[0])).name} {' '.join(map(str, cmd[1:3]))} exited {code}:\n{out[-4000:]}"
    )
    return out


def helm(*args: object) -> list[object]:
    return [BIN / "helm", *args]


def kubeconform(*args: object) -> list[object]:
    v = k8s_version()
    schemas = CACHE / "k8s-schemas" / f"v{v}-standalone-strict"
    return [
        BIN / "kubeconform", "-strict", "-summary", "-kubernetes-version", v,
        "-schema-location", f"{schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json", *args,
    ]  # fmt: skip


def cli_args(*args: object) -> list[object]:
    proxy = (
        ["--proxy-bin", RELEASE / "polycorn-proxy"] if (RELEASE / "polycorn-proxy").exists() else []
    )
    return [sys.executable, "tools/validate/cli_args.py", *args, *proxy]


def edge_smoke(*args: object) -> list[object]:
    return [
        VENV / "bin" / "python", "tools/validate/edge_smoke.py", "--helm", BIN / "helm",
        "--bin-dir", RELEASE, *args,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    keep = os.environ.get("KEEP")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep)
    else:
        yield tmp_path_factory.mktemp("validate-chart")


@pytest.fixture(scope="module")
def rendered(out: Path) -> dict[str, Path]:
    """Every scenario linted and rendered (a failure of either fails here)."""
    assert SCENARIOS, "no scenarios in charts/polycorn/ci"
    done = {}
    for values in SCENARIOS:
        name = values.name.removesuffix("-values.yaml")
        lint = ok(helm("lint", "--strict", CHART, "-f", values))
        assert re.search(r"^1 chart\(s\) linted, 0 chart\(s\) failed", lint, re.M), lint
        yaml = ok(helm("template", "polycorn", CHART, "-n", "polycorn", "-f", values))
        (out / f"{name}.yaml").write_text(yaml + "\n")
        kinds = Counter(re.findall(r"^kind: (\S+)$", yaml, re.M))
        print(f"{name}: lint ok; {sum(kinds.values())} objects: {dict(sorted(kinds.items()))}")
        done[name] = out / f"{name}.yaml"
    return done


#: The template unit tests, in the validators' own environment.
TEMPLATE_TESTS = [
    VENV / "bin" / "python",
    "-m",
    "pytest",
    "-p",
    "no:cacheprovider",
    "tools/validate/tests",
]

NAMES = [v.name.removesuffix("-values.yaml") for v in SCENARIOS]


def test_the_chart_links_the_repositorys_alert_rules() -> None:
    """The PrometheusRule embeds services/prometheus/rules/polycorn.rules.yml; helm reads
    only files inside the chart, so the chart has a symbolic link to it."""
    link = CHART / "files" / "polycorn.rules.yml"
    src = ROOT / "services" / "prometheus" / "rules" / "polycorn.rules.yml"
    assert link.is_symlink() and link.resolve() == src.resolve(), (
        "charts/polycorn/files/polycorn.rules.yml must be a symbolic link to "
        "services/prometheus/rules/polycorn.rules.yml"
    )


@pytest.mark.parametrize("name", NAMES)
def test_kubeconform_strict_skips_only_the_operators_kinds(
    rendered: dict[str, Path], name: str
) -> None:
    summary = ok(kubeconform("-skip", ",".join(CRD_KINDS), rendered[name]))
    print(summary.splitlines()[-1])
    skipped = int(re.search(r"Skipped: (\d+)", summary)[1])  # type: ignore[index]
    crds = len(re.findall(rf"^kind: ({'|'.join(CRD_KINDS)})$", rendered[name].read_text(), re.M))
    assert skipped == crds, f"skipped {skipped} objects, but only the {crds} {CRD_KINDS} may be"


@pytest.mark.parametrize("name", NAMES)
def test_envoys_bootstrap_against_envoys_schemas(rendered: dict[str, Path], name: str) -> None:
    text = rendered[name].read_text()
    if "kind: ConfigMap" not in text or "envoy.yaml: |" not in text:
        pytest.skip("no Envoy in this scenario")
    print(ok([BIN / "polycorn-envoy-validate", rendered[name]]).splitlines()[-1])


@pytest.mark.parametrize("name", NAMES)
def test_monitoring_objects_and_their_rules(
    rendered: dict[str, Path], name: str, out: Path
) -> None:
    if not re.search(rf"^kind: ({'|'.join(CRD_KINDS)})$", rendered[name].read_text(), re.M):
        pytest.skip("no ServiceMonitor or PrometheusRule in this scenario")
    rules = out / f"{name}.rules"
    print(ok([BIN / "polycorn-monitoring-validate", "-rules-out", rules, rendered[name]]))
    files = sorted(rules.glob("*.yml"))
    if files:
        print(ok(["promtool", "check", "rules", *files]))


def test_every_kind_the_chart_renders_appears_in_a_scenario(rendered: dict[str, Path]) -> None:
    seen = {k for p in rendered.values() for k in re.findall(r"^kind: (\S+)$", p.read_text(), re.M)}
    assert not set(KINDS) - seen, (
        f"no scenario renders {set(KINDS) - seen}: add one to charts/polycorn/ci"
    )


def test_every_command_line_parses_with_the_real_cli(rendered: dict[str, Path]) -> None:
    """The Python services' through their argparse, the proxy's through its binary
    (when ``make build`` has built it; else the template tests check its flags)."""
    print(ok(cli_args(*rendered.values())))


@pytest.mark.skipif(not HAVE_BINS, reason="target/release binaries not built (make build)")
def test_the_train_path_through_the_rendered_edge(rendered: dict[str, Path]) -> None:
    """The real relay -> a front routing by the rendered Envoy server_names -> the real
    proxy with the rendered command line (loopback; no Envoy can run here)."""
    print(ok(edge_smoke()))


@pytest.mark.skipif(not HAVE_BINS, reason="target/release binaries not built (make build)")
def test_a_trains_quic_through_its_rendered_udp_listener(rendered: dict[str, Path]) -> None:
    """quic.enabled: the real relay on --transport quic --quic-port -> a UDP proxy
    standing in for the train's rendered Envoy UDP listener -> the real proxy on the
    rendered --transport quic; the subflow must come up over QUIC, not the TLS
    fallback."""
    print(ok(edge_smoke("--quic")))


def test_the_template_unit_tests() -> None:
    print(
        ok(
            [
                *TEMPLATE_TESTS,
            ],
            POLYCORN_HELM=str(BIN / "helm"),
        )[-2000:]
    )


# ------------------------------------------------------------ seeded errors


def first(old: str, new: str) -> Callable[[str], str]:
    """Replace the first line that is exactly ``old`` (as sed 0,/^old$/s//new/)."""
    return lambda t: re.sub(rf"(?m)^{re.escape(old)}$", new, t, count=1)


def seeded(src: Path, dst: Path, change: Callable[[str], str]) -> Path:
    text = src.read_text()
    broken = change(text)
    assert broken != text, f"the seeded error did not apply to {src.name}"
    dst.write_text(broken)
    return dst


def rejects(cmd: Sequence[object], pattern: str, **env: str) -> None:
    code, out = run(cmd, **env)
    assert code != 0, f"the validator accepted the seeded error:\n{out[-2000:]}"
    assert re.search(pattern, out), f"failed without naming the error ({pattern}):\n{out[-2000:]}"


MINIMAL = CHART / "ci" / "minimal-values.yaml"


@pytest.mark.parametrize(
    ("values", "args", "says"),
    [
        (
            "proxy:\n  caSecret:\n    nmae: x\n",
            ("lint",),
            "additional properties 'nmae' not allowed",
        ),
        ("trains:\n  - id: Train_42\n", ("template",), "/trains/0/id"),
        ("trains:\n  - id: train-1\n  - id: train-1\n", ("template",), "listed twice"),
        (
            "quic: {enabled: true}\n"
            "trains:\n  - {id: a, quicPort: 4601}\n  - {id: b, quicPort: 4601}\n",
            ("template",),
            "each train needs a UDP port of its own",
        ),
    ],
    ids=["unknown-key", "train-id-not-dns", "train-twice", "quic-port-twice"],
)
def test_helm_and_the_values_schema_reject(
    tmp_path: Path, values: str, args: tuple[str], says: str
) -> None:
    (tmp_path / "bad.yaml").write_text(values)
    cmd = ["lint", "--strict", CHART] if args[0] == "lint" else ["template", "polycorn", CHART]
    rejects(helm(*cmd, "-f", MINIMAL, "-f", tmp_path / "bad.yaml"), says)


def test_helm_requires_the_kafka_bootstrap() -> None:
    rejects(
        helm("template", "polycorn", CHART, "--set", "postgresql.users.ingest.secret=x"),
        "kafka.bootstrap is required",
    )


def rep(old: str, new: str) -> Callable[[str], str]:
    """Replace the first ``old``."""
    return lambda t: t.replace(old, new, 1)


#: (validator, seeded error, what its message must say), on the production render.
BROKEN = {
    "kubeconform-unknown-field": (
        "kubeconform",
        first("          ports:", "          portz:"),
        "additional properties 'portz' not allowed",
    ),
    "kubeconform-wrong-type": (
        "kubeconform",
        first("  replicas: 3", "  replicas: three"),
        "replicas",
    ),
    "envoy-empty-stat-prefix": (
        "envoy",
        rep("stat_prefix: train_ice-4711", 'stat_prefix: ""'),
        "TcpProxy.StatPrefix",
    ),
    "envoy-unknown-field": (
        "envoy",
        rep("idle_timeout: 3600s", "idle_timout: 3600s"),
        'unknown field "idle_timout"',
    ),
    "envoy-bad-enum": ("envoy", rep("denominator: HUNDRED", "denominator: HUNDREDS"), "HUNDREDS"),
    "envoy-undefined-cluster": (
        "envoy",
        lambda t: re.sub(r"(?m)cluster: train_ice-4711$", "cluster: train_ice-9999", t, count=1),
        'cluster "train_ice-9999" is not defined',
    ),
    "envoy-no-bootstrap": (
        "envoy",
        lambda t: t.replace("envoy.yaml: |", "envoy-bootstrap.yaml: |"),
        "no ConfigMap with data key",
    ),
    "monitoring-unknown-field": (
        "monitoring",
        rep("jobLabel:", "jobLabl:"),
        'unknown field "jobLabl"',
    ),
    "monitoring-bad-duration": (
        "monitoring",
        rep("interval: 30s", "interval: 30 seconds"),
        "is not a duration",
    ),
    "cli-verify-key-not-ed25519": (
        "cli",
        rep("MCowBQYDK2VwAyEA", "MCowBQYDK2VxAyEA"),
        "FAIL .*table-signing.pub",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_validator_rejects_a_broken_production_render(
    rendered: dict[str, Path], tmp_path: Path, case: str
) -> None:
    tool, change, says = BROKEN[case]
    bad = seeded(rendered["production"], tmp_path / "bad.yaml", change)
    cmds: dict[str, list[object]] = {
        "kubeconform": kubeconform("-skip", ",".join(CRD_KINDS), bad),
        "envoy": [BIN / "polycorn-envoy-validate", "-q", bad],
        "monitoring": [BIN / "polycorn-monitoring-validate", bad],
        "cli": cli_args(bad),
    }
    rejects(cmds[tool], says)


#: Seeded errors in the QUIC scenario's render (ci/quic-values.yaml): its UDP
#: listeners, checked by the Envoy validator as Envoy would at load time.
BROKEN_QUIC = {
    "envoy-udp-undefined-cluster": (
        lambda t: re.sub(
            r"(?m)cluster: train_ice-4711_quic$", "cluster: train_ice-9999_quic", t, count=1
        ),
        'listener "train_ice-4711_quic" .*cluster "train_ice-9999_quic" is not defined',
    ),
    "envoy-udp-proxy-on-a-tcp-listener": (
        rep("              protocol: UDP\n", ""),
        "a UDP proxy on a TCP listener",
    ),
    "envoy-two-trains-on-one-udp-port": (
        rep("port_value: 4602", "port_value: 4601"),
        "both bind UDP 0.0.0.0:4601",
    ),
    "envoy-udp-session-timeout-not-a-duration": (
        rep("idle_timeout: 60s", "idle_timeout: 60 s"),
        'invalid google.protobuf.Duration value "60 s"',
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_QUIC))
def test_the_envoy_validator_rejects_a_broken_quic_render(
    rendered: dict[str, Path], tmp_path: Path, case: str
) -> None:
    change, says = BROKEN_QUIC[case]
    bad = seeded(rendered["quic"], tmp_path / "bad.yaml", change)
    rejects([BIN / "polycorn-envoy-validate", "-q", bad], says)


@pytest.mark.skipif(
    not (RELEASE / "polycorn-proxy").exists(), reason="the proxy's flags need its binary"
)
def test_the_proxy_binary_rejects_a_rendered_timeout_given_a_word(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    bad = seeded(
        rendered["production"],
        tmp_path / "bad.yaml",
        lambda t: t.replace("--connect-timeout-s=10", "--connect-timeout-s=ten", 1),
    )
    rejects(cli_args(bad), r"cli_args: [0-9]+ command lines parsed .*, 1 failed")


def test_kubeconform_rejects_a_kind_without_a_schema(tmp_path: Path) -> None:
    (tmp_path / "widget.yaml").write_text(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n"
    )
    rejects(kubeconform(tmp_path / "widget.yaml"), "could not find schema for Widget")


def test_promtool_rejects_a_syntax_error_in_the_rendered_rules(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    ok(
        [
            BIN / "polycorn-monitoring-validate",
            "-rules-out",
            tmp_path / "rules",
            rendered["production"],
        ]
    )
    f = tmp_path / "rules" / "polycorn.rules.yml"
    seeded(f, f, lambda t: t.replace("expr: ", "expr: sum by (job (", 1))
    rejects(["promtool", "check", "rules", f], "parse error|could not parse|unexpected")


def test_the_real_clis_reject_the_sharded_trainers_bad_flags(
    rendered: dict[str, Path], tmp_path: Path
) -> None:
    """Two seeded errors in the Python services' command lines ($(JOB_COMPLETION_INDEX)
    is Kubernetes' syntax, not the shell's): one run must report both."""
    bad = seeded(
        rendered["sharded-trainer"],
        tmp_path / "bad-args.yaml",
        lambda t: t.replace("--batch-timeout-s=0.5", "--batch-timeout-s=half").replace(
            "--shard=$(JOB_COMPLETION_INDEX)/8", "--shard=8/8"
        ),
    )
    rejects(cli_args(bad), r"cli_args: [0-9]+ command lines parsed .*, 3 failed")


@pytest.mark.skipif(not HAVE_BINS, reason="target/release binaries not built (make build)")
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--proxy-san", "wrong.example"), "got no path up|reports no path up"),
        (("--bad-verify-key",), "not an Ed25519 public key"),
        (("--quic", "--quic-port-of", "train-b"), "up over TLS, not QUIC"),
    ],
    ids=["proxy-cert-without-the-name", "verify-key-not-ed25519", "quic-port-of-another-train"],
)
def test_the_edge_smoke_test_rejects(args: tuple[str, ...], says: str) -> None:
    rejects(edge_smoke(*args), says)


def test_the_template_tests_fail_on_a_seeded_wrong_expectation() -> None:
    rejects(
        [
            *TEMPLATE_TESTS,
            "-k",
            "seeded_failure",
        ],
        "FAILED .*test_seeded_failure",
        POLYCORN_HELM=str(BIN / "helm"),
        POLYCORN_SEED_FAILURE="1",
    )


def test_helm_is_the_cached_one() -> None:
    """The tools ``scripts/setup.sh chart`` installs (a missing one fails every check)."""
    missing = [
        t
        for t in ("helm", "kubeconform", "polycorn-envoy-validate", "polycorn-monitoring-validate")
        if not (BIN / t).exists()
    ]
    assert not missing and shutil.which("promtool"), f"missing: {missing} (scripts/setup.sh chart)"
