# shellcheck shell=bash
# Optional component `chart` (`setup.sh chart`, run by make validate-platform):
# the offline validators of the Helm chart charts/polycorn.
#
# - helm and kubeconform, built from their Go modules (pinned) with the Go
#   toolchain into the machine's cache ${POLYCORN_CACHE:-/var/cache/polycorn}/go,
#   shared by every clone, like vegeta in scripts/setup.sh. helm's cold build
#   takes about 4 minutes and 1 GB, so the builds run one after the other.
# - the Kubernetes JSON schemas of the PyPI package kubernetes-validate,
#   pinned in tools/validate/pyproject.toml + uv.lock, installed by
#   `uv sync` into a venv in the same cache, then made standalone for
#   kubeconform by tools/validate/k8s_schemas.py (their $refs point at
#   kubernetes.io, which kubeconform cannot follow offline).
# - the Envoy bootstrap validator tools/validate/envoy (go-control-plane)
#   and the Prometheus Operator objects' validator tools/validate/monitoring
#   (the operator's Go types), built from their committed go.mod/go.sum into
#   the cache.
#
# Every step checks first; a second run touches no network.
HELM_VERSION=3.22.0
KUBECONFORM_VERSION=0.8.0
# The Kubernetes version whose schemas the chart is validated against (one of
# those kubernetes-validate ships); tools/validate/validate_chart.py reads it too.
K8S_SCHEMA_VERSION=1.37.0

OPTIONAL+=(chart)

component_chart() {
    # promtool (Debian's prometheus package) checks the PrometheusRule's
    # rules as the chart renders them.
    need_apt python3 prometheus
    after_install check_chart_go_tools check_chart_schemas check_chart_validators
}

chart_cache() { echo "${POLYCORN_CACHE:-/var/cache/polycorn}"; }

# helm built with its release ldflags: it reports its version, and it
# assumes Kubernetes 1.37 by default (a plain build says 1.20).
helm_ldflags_ok() {
    [[ $("$1" version --template '{{.Version}}' 2>/dev/null) == "v$HELM_VERSION" ]] \
        && "$1" template x "$REPO_ROOT/tools/validate/testdata/kube-version" 2>/dev/null | grep -q 'kube: "v1.37'
}

check_chart_go_tools() {
    # What helm's own Makefile sets: its version, and the Kubernetes version
    # of its client libraries (k8s.io/* v0.37 = 1.37) as the default for
    # `helm template`/`install --dry-run` and for lint's deprecation rules;
    # without them a `go install`ed helm assumes Kubernetes 1.20.
    local k="-X helm.sh/helm/v3/pkg"
    go_install_pinned helm helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm "$HELM_VERSION" \
        "-X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION $k/lint/rules.k8sVersionMajor=1 $k/lint/rules.k8sVersionMinor=37 $k/chartutil.k8sVersionMajor=1 $k/chartutil.k8sVersionMinor=37" \
        helm_ldflags_ok
    go_install_pinned kubeconform github.com/yannh/kubeconform \
        github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION"
    SUMMARY+=("helm: $HELM_VERSION, kubeconform: $KUBECONFORM_VERSION in $(go_cache)/bin")
}

chart_schema_dir() { echo "$(chart_cache)/k8s-schemas/v$K8S_SCHEMA_VERSION-standalone-strict"; }

chart_venv() { echo "$(chart_cache)/validate-venv"; }

check_chart_venv() {
    local venv stamp
    venv=$(chart_venv)
    stamp="$venv/.complete-$(sha256sum "$REPO_ROOT/tools/validate/uv.lock" | cut -c1-16)"
    if [[ ! -e $stamp || ! -x $venv/bin/python ]]; then
        command -v uv >/dev/null || die "uv not found: run 'bash scripts/setup.sh python' first"
        log "installing tools/validate (kubernetes-validate, pytest; uv.lock) into $venv"
        rm -f "$venv"/.complete-*
        UV_PROJECT_ENVIRONMENT=$venv uv sync --quiet --locked --project "$REPO_ROOT/tools/validate" \
            || die "could not install tools/validate (uv sync --locked)"
        touch "$stamp"
    fi
}

check_chart_schemas() {
    local out stamp
    check_chart_venv
    out=$(chart_schema_dir)
    # The stamp names the lockfile and the converter: a change to either
    # regenerates the schemas.
    stamp="$out/.complete-$(cat "$REPO_ROOT/tools/validate/uv.lock" "$REPO_ROOT/tools/validate/k8s_schemas.py" | sha256sum | cut -c1-16)"
    if [[ ! -e $stamp ]]; then
        log "converting the Kubernetes $K8S_SCHEMA_VERSION schemas into $out"
        rm -rf "$out"
        "$(chart_venv)/bin/python" "$REPO_ROOT/tools/validate/k8s_schemas.py" \
            --version "$K8S_SCHEMA_VERSION" --out "$out" \
            || die "could not convert the kubernetes-validate schemas"
        touch "$stamp"
    fi
    SUMMARY+=("kubernetes schemas: $K8S_SCHEMA_VERSION (kubernetes-validate) standalone in $out")
}

# The repository's own Go validators (tools/validate/<dir>), built from
# their committed go.mod/go.sum into the cache; rebuilt when a source changes.
chart_validator_bin() { echo "$(go_cache)/bin/polycorn-$1-validate"; }

build_chart_validator() {
    local name=$1 bin src stamp
    bin=$(chart_validator_bin "$name")
    src=$REPO_ROOT/tools/validate/$name
    stamp="$bin.$(cat "$src"/go.mod "$src"/go.sum "$src"/*.go | sha256sum | cut -c1-16)"
    if [[ ! -e $stamp || ! -x $bin ]]; then
        log "building tools/validate/$name into $bin"
        rm -f "$bin" "$bin".*
        (cd "$src" && GOFLAGS=-mod=readonly CGO_ENABLED=0 go_cached "tools/validate/$name" build -trimpath -o "$bin" .) \
            || die "could not build tools/validate/$name"
        touch "$stamp"
    fi
}

check_chart_validators() {
    build_chart_validator envoy
    build_chart_validator monitoring
    SUMMARY+=("chart validators: $(chart_validator_bin envoy) (go-control-plane), $(chart_validator_bin monitoring) (prometheus-operator types)")
}
