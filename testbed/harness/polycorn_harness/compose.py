"""The docker-compose fleet-in-a-box (``docker-compose.yml``) run for real on this
machine: podman serves the Docker API, Debian's docker-compose drives it, and every
image is built here from a local debootstrap base (``testbed/images/build-base.sh``)
because no image can be pulled.

:class:`Fleet` builds the images, brings the project up and tears it down, leaving
nothing of the run behind: containers, volumes, network, the images it built, the
podman API service, podman's firewall chains and nft tables that were not there
before (:class:`HostNet`), ``net.ipv4.ip_forward`` as it was. The local bases and
build caches are machine caches and stay (``purge`` removes them too).

``python -m polycorn_harness.compose down`` cleans up after a ``--keep-up`` run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polycorn_harness import ROOT, credentials
from polycorn_harness.process import setup_var, stop_process
from polycorn_harness.provenance import tree_state
from polycorn_harness.topology import get_via, run
from polycorn_harness.wait import wait_until

PROJECT = "polycorncompose"
#: The images this run builds under its own tag, so that nothing a developer built
#: as polycorn/*:dev is replaced or removed.
IMAGE_PREFIX = "localhost/polycorn"
TAG = "compose-test"
STANDINS = ("kafka", "postgis", "prometheus", "nginx")
SERVICE_IMAGES = ("relay-agent", "proxy", "emu", "ingest", "trainer", "linkdb-api")
LONG_RUNNING = (
    "postgis",
    "kafka",
    "proxy",
    "emu",
    "relay-agent",
    "ingest",
    "trainer",
    "trainer-follow",
    "linkdb-api",
    "api-lb",
    "origin",
    "prometheus",
)
#: Services that run as several replicas: deploy.replicas in docker-compose.yml, from
#: these variables (2 when unset). Every replica must be healthy.
REPLICAS = {"ingest": "POLYCORN_INGEST_REPLICAS", "linkdb-api": "POLYCORN_API_REPLICAS"}
ONE_SHOTS = ("pki", "migrate", "kafka-init")


def replicas(service: str) -> int:
    """How many containers ``service`` runs (docker-compose.yml's deploy.replicas)."""
    var = REPLICAS.get(service)
    return int(os.environ.get(var) or 2) if var else 1


def log(msg: str) -> None:
    print(f"[compose {time.strftime('%T')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Images:
    """The podman storage and local base images of ``testbed/images/lib.sh`` (read
    from it, so the names live in one place)."""

    ctr_dir: Path
    root: str
    runroot: str
    containers_conf: str
    base: str
    python: str
    rust: str

    @classmethod
    def load(cls) -> Images:
        out = run(
            [
                "bash",
                "-c",
                'source testbed/images/lib.sh && printf \'%s\\n\' "$PC_CTR_DIR" "$PC_CTR_ROOT" '
                '"$PC_CTR_RUNROOT" "$CONTAINERS_CONF" "$PC_BASE_IMAGE" "$PC_PYTHON_IMAGE" '
                '"$(pc_rust_image)"',
            ]
        ).stdout.splitlines()
        return cls(Path(out[0]), *out[1:7])

    def podman(self, *args: str) -> list[str]:
        return ["podman", "--root", self.root, "--runroot", self.runroot, *args]


class HostNet:
    """What the host's firewall and forwarding looked like before podman ran, so that
    :meth:`restore` removes only what the run added. The snapshot survives a crashed
    run (taken once, removed by :meth:`restore`)."""

    TABLES = ("filter", "nat")

    def __init__(self, state: Path) -> None:
        self.state = state

    @staticmethod
    def _chains(table: str) -> list[str]:
        r = subprocess.run(
            ["iptables", "-t", table, "-S"], capture_output=True, text=True, check=False
        )
        return sorted(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("-N "))

    @staticmethod
    def _nft_tables() -> list[str]:
        r = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
        return sorted(ln for ln in r.stdout.splitlines() if ln.strip())

    def snapshot(self) -> None:
        if (self.state / "ip_forward").exists():
            return
        (self.state / "nft-tables").write_text("\n".join(self._nft_tables()))
        for t in self.TABLES:
            (self.state / f"chains-{t}").write_text("\n".join(self._chains(t)))
        (self.state / "ip_forward").write_text(
            Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        )

    def _new_chains(self, table: str) -> list[str]:
        f = self.state / f"chains-{table}"
        if not f.exists():
            return []
        before = set(f.read_text().split())
        return [c for c in self._chains(table) if c not in before]

    def restore(self) -> list[str]:
        """Remove netavark's chains and nft tables that were not there before, set
        ip_forward back; what is still left (empty: all clean)."""
        for t in self.TABLES:
            new = self._new_chains(t)
            rules = subprocess.run(
                ["iptables", "-t", t, "-S"], capture_output=True, text=True, check=False
            ).stdout.splitlines()
            # A built-in chain's rule that jumps to a new chain, turned into its own
            # deletion (iptables -S shell-quotes, e.g. a --comment).
            for rule in rules:
                words = shlex.split(rule)
                if (
                    len(words) > 2
                    and words[0] == "-A"
                    and re.fullmatch("[A-Z]+", words[1])
                    and jumps_to(words) in new
                ):
                    subprocess.run(
                        ["iptables", "-t", t, "-D", *words[1:]], capture_output=True, check=False
                    )
            for flag in ("-F", "-X"):
                for chain in new:
                    subprocess.run(
                        ["iptables", "-t", t, flag, chain], capture_output=True, check=False
                    )
        f = self.state / "nft-tables"
        if f.exists():
            before = set(f.read_text().splitlines())
            for line in self._nft_tables():
                words = line.split()
                if line not in before and len(words) == 3:
                    subprocess.run(
                        ["nft", "delete", "table", words[1], words[2]],
                        capture_output=True,
                        check=False,
                    )
        fwd = self.state / "ip_forward"
        if fwd.exists():
            subprocess.run(
                ["sysctl", "-qw", f"net.ipv4.ip_forward={fwd.read_text().strip()}"], check=False
            )
        left = [f"iptables {t} chain {c}" for t in self.TABLES for c in self._new_chains(t)]
        for name in ("ip_forward", "nft-tables", "chains-filter", "chains-nat"):
            (self.state / name).unlink(missing_ok=True)
        return left


@dataclass
class Fleet:
    """The compose project of this run."""

    images: Images
    state: Path
    api_port: int = 28180
    prom_port: int = 28190
    timings: dict[str, float] = field(default_factory=dict)
    _pump_stop: threading.Event = field(default_factory=threading.Event)
    _pump: threading.Thread | None = None

    @classmethod
    def from_env(cls) -> Fleet:
        """``POLYCORN_COMPOSE_STATE`` (its state), ``TEST_COMPOSE_API_PORT`` and
        ``TEST_COMPOSE_PROM_PORT`` (host ports apart from scripts/infra.sh's and the
        compose defaults a developer may be using)."""
        state = Path(os.environ.get("POLYCORN_COMPOSE_STATE", "/run/polycorn-compose-test"))
        state.mkdir(parents=True, exist_ok=True)
        return cls(
            Images.load(),
            state,
            int(os.environ.get("TEST_COMPOSE_API_PORT", "28180")),
            int(os.environ.get("TEST_COMPOSE_PROM_PORT", "28190")),
        )

    @property
    def sock(self) -> Path:
        return self.state / "podman.sock"

    @property
    def work(self) -> Path:
        return self.state / "work"

    def fresh_work(self) -> None:
        """An empty work directory for this run's build contexts and logs."""
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)

    @property
    def host(self) -> HostNet:
        return HostNet(self.state)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            # Made at the first start, kept in the state directory (0600).
            **credentials.ensure(self.state / "credentials.env"),
            "CONTAINERS_CONF": self.images.containers_conf,
            "DOCKER_HOST": f"unix://{self.sock}",
            "COMPOSE_PROJECT_NAME": PROJECT,
            "COMPOSE_HTTP_TIMEOUT": "300",
            "POLYCORN_IMAGE_PREFIX": IMAGE_PREFIX,
            "POLYCORN_TAG": TAG,
            **{f"POLYCORN_{s.upper()}_IMAGE": self.standin(s) for s in STANDINS},
            "POLYCORN_API_PORT": str(self.api_port),
            "POLYCORN_PROMETHEUS_PORT": str(self.prom_port),
        }

    @staticmethod
    def standin(name: str) -> str:
        return f"localhost/polycorn-standin/{name}:{TAG}"

    # ------------------------------------------------------------- commands

    def podman(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        r = self._run(self.images.podman(*args), timeout, stdin)
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(args[:4])} exited {r.returncode}: {r.stderr}")
        return r

    def dc(
        self, *args: str, timeout: float = 300, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``docker-compose ARGS`` against the podman API (not checked)."""
        return self._run(["docker-compose", "--no-ansi", *args], timeout, stdin)

    def _run(
        self, cmd: list[str], timeout: float, stdin: str | None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd,
            cwd=ROOT,
            env=self.env(),
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ctr(self, service: str) -> str:
        """The container of ``service`` (its first replica; '' when there is none)."""
        out = self.ctrs(service)
        return out[0] if out else ""

    def ctrs(self, service: str) -> list[str]:
        """Every container of ``service``, one per replica."""
        return self.dc("ps", "-q", service, timeout=60).stdout.split()

    def containers(self) -> list[tuple[str, str]]:
        """(name, container) of every service, ``service#i`` for each replica of a
        service with several; the container '' when a service has none."""
        out: list[tuple[str, str]] = []
        for s in (*LONG_RUNNING, *ONE_SHOTS):
            ids = self.ctrs(s)
            want = replicas(s)
            if want == 1 and len(ids) <= 1:
                out.append((s, ids[0] if ids else ""))
                continue
            n = max(want, len(ids))
            out += [(f"{s}#{i + 1}", ids[i] if i < len(ids) else "") for i in range(n)]
        return out

    def inspect(self, service: str, fmt: str) -> str:
        c = self.ctr(service)
        if not c:
            return "absent"
        r = self.podman("inspect", "-f", fmt, c, check=False)
        return r.stdout.strip() if r.returncode == 0 else "absent"

    def exec(self, service: str, *cmd: str, timeout: float = 120) -> str:
        """``cmd`` in ``service``'s container; its stdout."""
        return self.podman("exec", self.ctr(service), *cmd, timeout=timeout).stdout

    def enter(self, service: str) -> list[str]:
        """The command prefix that runs a host command in ``service``'s network
        namespace (the relay shares the emulator's: the train)."""
        return ["nsenter", "-t", self.inspect(service, "{{.State.Pid}}"), "-n"]

    def metrics(self, service: str, port: int) -> str:
        """The exposition of ``/metrics`` on 127.0.0.1:``port`` in ``service``'s
        network namespace ('' when nothing answers)."""
        code, body = get_via(self.enter(service), f"http://127.0.0.1:{port}/metrics")
        return body if code == 200 else ""

    # ------------------------------------------------------------- images

    def build_image(self, name: str, dockerfile: Path, context: Path, *args: str) -> None:
        t = time.monotonic()
        logfile = self.work / f"build-{re.sub(r'[/:]', '_', name)}.log"
        with logfile.open("w") as f:
            r = subprocess.run(
                self.images.podman(
                    "build",
                    "--format",
                    "docker",
                    "--network",
                    "host",
                    "--pull=never",
                    "-f",
                    str(dockerfile),
                    "-t",
                    name,
                    "--build-arg",
                    f"REVISION={tree_state().commit or 'unknown'}",
                    *args,
                    str(context),
                ),
                cwd=ROOT,
                # HEALTHCHECK is kept only in Docker-format images.
                env={**self.env(), "BUILDAH_FORMAT": "docker"},
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if r.returncode != 0:
            tail = "\n".join(logfile.read_text().splitlines()[-30:])
            raise AssertionError(f"the build of {name} failed:\n{tail}")
        size = int(self.podman("image", "inspect", "-f", "{{.Size}}", name).stdout.strip() or 0)
        log(f"  {name:55} {time.monotonic() - t:5.0f} s  {size / 1e6:.0f} MB")

    def build(self) -> None:
        """The local bases, the stand-ins for the official third-party images
        (testbed/images/{kafka,postgis,prometheus,nginx}) and the six Polycorn images
        from their Dockerfiles (base images as build args)."""
        t0 = time.monotonic()
        log("local base images")
        run(["bash", "testbed/images/build-base.sh"], timeout=3600)
        base = ("--build-arg", f"BASE_IMAGE={self.images.base}")
        log("stand-ins for the official third-party images")
        for s in ("postgis", "prometheus", "nginx"):
            d = ROOT / "testbed" / "images" / s
            self.build_image(self.standin(s), d / "Dockerfile", d, *base)
        # Kafka's context: the stand-in's files, the broker's log4j2 config and the
        # jars `make setup` fetched (hard links, no copy).
        kctx = self.work / "kafka-ctx"
        kctx.mkdir()
        for f in [*(ROOT / "testbed" / "images" / "kafka").iterdir()]:
            shutil.copy2(f, kctx)
        shutil.copy2(ROOT / "services" / "kafka" / "log4j2.properties", kctx)
        cache = Path(os.environ.get("POLYCORN_CACHE", "/var/cache/polycorn"))
        libs = cache / f"kafka-{setup_var('KAFKA_VERSION')}" / "libs"
        try:
            shutil.copytree(libs, kctx / "libs", copy_function=os.link)
        except OSError:
            shutil.rmtree(kctx / "libs", ignore_errors=True)
            shutil.copytree(libs, kctx / "libs")
        self.build_image(self.standin("kafka"), kctx / "Dockerfile", kctx, *base)
        log("Polycorn images (Dockerfile.rust: one shared build stage; Dockerfile.python)")
        for s in SERVICE_IMAGES:
            dockerfile, target = image_of(s)
            self.build_image(
                f"{IMAGE_PREFIX}/{s}:{TAG}",
                ROOT / dockerfile,
                ROOT,
                "--target",
                target,
                "--build-arg",
                f"RUST_IMAGE={self.images.rust}",
                "--build-arg",
                f"RUNTIME_IMAGE={self.images.base}",
                "--build-arg",
                f"PYTHON_IMAGE={self.images.python}",
                "--build-arg",
                f"UV_VERSION={setup_var('UV_VERSION')}",
            )
        self.timings["images"] = time.monotonic() - t0

    # ------------------------------------------------------------- up

    def start_api(self) -> None:
        """``podman system service`` on :attr:`sock` (the Docker API compose talks to)."""
        self.stop_api()
        logf = (self.state / "podman-service.log").open("w")
        p = subprocess.Popen(
            self.images.podman("system", "service", "--time=0", f"unix://{self.sock}"),
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (self.state / "podman-service.pid").write_text(str(p.pid))

        def answers() -> bool:
            r = subprocess.run(
                ["curl", "-fsS", "--unix-socket", str(self.sock), "http://d/_ping"],
                capture_output=True,
                check=False,
            )
            return r.returncode == 0

        wait_until(f"podman system service on {self.sock}", answers, 10)

    def stop_api(self) -> None:
        pidf = self.state / "podman-service.pid"
        if pidf.exists():
            pid = pidf.read_text().strip()
            if pid.isdigit():
                stop_process(int(pid))
            pidf.unlink()
        self.sock.unlink(missing_ok=True)

    def _health_pump(self) -> None:
        # podman runs health checks from systemd timers, and there is no systemd here:
        # this runs every project container's check instead (Docker runs them itself,
        # so real users need nothing like it).
        while not self._pump_stop.is_set():
            ids = self.podman(
                "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}", check=False
            ).stdout.split()
            for c in ids:
                self.podman("healthcheck", "run", c, check=False)
            self._pump_stop.wait(2)

    def up(self) -> None:
        """The podman API, the health pump, ``docker-compose up -d`` (without the
        grafana profile: no Grafana server can be installed here)."""
        t0 = time.monotonic()
        log(f"podman API on {self.sock}; docker-compose up -d")
        self.start_api()
        self._pump_stop.clear()
        self._pump = threading.Thread(target=self._health_pump, daemon=True)
        self._pump.start()
        r = self.dc("up", "-d", "--no-build", timeout=900)
        (self.work / "up.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
            raise AssertionError(f"docker-compose up failed:\n{tail}")
        self.timings["up"] = time.monotonic() - t0

    def states(self) -> dict[str, str]:
        """Every service's (every replica's) ``status exit=N health=H``; ``absent``
        for a service without a container, or with fewer than its replicas."""
        fmt = "{{.State.Status}} exit={{.State.ExitCode}} health={{.State.Health.Status}}"
        out = {}
        for name, c in self.containers():
            r = self.podman("inspect", "-f", fmt, c, check=False) if c else None
            out[name] = r.stdout.strip() if r is not None and r.returncode == 0 else "absent"
        return out

    def not_ready(self) -> list[str]:
        """The services not yet healthy and the one-shots not yet done with status 0."""
        bad = []
        for s, st in self.states().items():
            ready = st == "running exit=0 health=healthy" or (
                s in ONE_SHOTS and st.startswith("exited exit=0")
            )
            if not ready:
                bad.append(f"{s}={st}")
        return bad

    def failed_logs(self) -> str:
        """The services not healthy or complete, with their last log lines."""
        out = ["---- services not healthy/complete, with their last log lines"]
        states = self.states()
        for s, c in self.containers():
            st = states.get(s, "absent")
            if st in ("running exit=0 health=healthy", "exited exit=0 health="):
                continue
            out.append(f"== {s}: {st}")
            if c:
                r = self.podman("logs", "--tail", "40", c, check=False)
                out += [f"   {ln}" for ln in (r.stdout + r.stderr).splitlines()]
        return "\n".join(out)

    # ------------------------------------------------------------- down

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={PROJECT}"
        left = self.podman("ps", "-aq", "--filter", label, check=False).stdout.split()
        left += self.podman("volume", "ls", "-q", "--filter", label, check=False).stdout.split()
        return left

    def down(self, *, purge: bool = False) -> list[str]:
        """Everything of the run removed; what is left (empty: all clean)."""
        log("teardown")
        self._pump_stop.set()
        if self._pump is not None:
            self._pump.join(timeout=30)
        problems = []
        if self.sock.exists():
            # The relay first: podman refuses to remove emu while a container shares
            # its network namespace, and compose v1 removes in parallel.
            self.dc("rm", "-fsv", "relay-agent", timeout=60)
            r = self.dc("down", "-v", "--remove-orphans", "-t", "5", timeout=180)
            if r.returncode != 0:
                problems.append(f"docker-compose down failed: {r.stderr[-2000:]}")
        self.stop_api()
        # Whatever compose could not remove (e.g. after a crash of the API).
        label = f"label=com.docker.compose.project={PROJECT}"
        ids = self.podman("ps", "-aq", "--filter", label, check=False).stdout.split()
        if ids:
            self.podman("rm", "-f", "-t", "2", *ids, check=False)
        vols = self.podman("volume", "ls", "-q", "--filter", label, check=False).stdout.split()
        if vols:
            self.podman("volume", "rm", "-f", *vols, check=False)
        self.podman("network", "rm", "-f", f"{PROJECT}_default", check=False)
        for s in SERVICE_IMAGES:
            self.podman("rmi", "-f", f"{IMAGE_PREFIX}/{s}:{TAG}", check=False)
        for s in STANDINS:
            self.podman("rmi", "-f", self.standin(s), check=False)
        # Intermediate layers of this run's builds (the named bases stay).
        self.podman("image", "prune", "-f", check=False, timeout=600)
        if purge:
            log("purge: removing the local bases, build caches and podman storage")
            self.podman("system", "reset", "-f", check=False, timeout=600)
            # buildah keeps RUN --mount=type=cache directories here, by id.
            shutil.rmtree(self.images.root, ignore_errors=True)
            shutil.rmtree(self.images.ctr_dir / "rootfs-bookworm", ignore_errors=True)
            for d in Path("/var/tmp/buildah-cache").glob("polycorn-*"):
                shutil.rmtree(d, ignore_errors=True)
        problems += self.host.restore() + self.leftovers()
        shutil.rmtree(self.work, ignore_errors=True)
        fwd = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        log(
            "teardown done: containers, volumes, network, images of this run, podman's "
            f"firewall chains removed; ip_forward={fwd}"
        )
        return problems

    def earlier_run(self) -> bool:
        """Did a run end without its teardown (killed, or ``--keep-up``)?"""
        return self.sock.exists() or (self.state / "podman-service.pid").exists()


def jumps_to(rule: Sequence[str]) -> str:
    """The target chain of an ``iptables -S`` rule ('' when it has no ``-j``)."""
    for i, w in enumerate(rule[:-1]):
        if w == "-j":
            return rule[i + 1]
    return ""


def image_of(service: str) -> tuple[str, str]:
    """The Dockerfile and build target of a service's image."""
    if service == "relay-agent":
        return "Dockerfile.rust", "relay"
    if service in ("proxy", "emu"):
        return "Dockerfile.rust", service
    return "Dockerfile.python", service


def main(argv: Sequence[str]) -> int:
    if list(argv) not in (["down"], ["build"]):
        print("usage: python -m polycorn_harness.compose down|build", file=sys.stderr)
        return 2
    if argv[0] == "build":
        # The images alone, ahead of the suite (make test builds them beside
        # steps that mostly wait); the suite's own build then finds every layer
        # cached, and its teardown removes them.
        f = Fleet.from_env()
        f.fresh_work()
        f.build()
        log(f"images built in {f.timings['images']:.0f} s")
        return 0
    left = Fleet.from_env().down(purge=False)
    print(json.dumps({"left": left}))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
