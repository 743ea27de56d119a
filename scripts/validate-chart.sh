#!/usr/bin/env bash
# Offline validation of the Helm chart charts/polycorn (make validate-platform).
#
#   bash scripts/validate-chart.sh            # everything; non-zero on any finding
#   KEEP=DIR bash scripts/validate-chart.sh   # keep the rendered manifests in DIR
#
# For every scenario charts/polycorn/ci/*-values.yaml:
#   1. helm lint --strict (values.schema.json included);
#   2. helm template;
#   3. kubeconform -strict on every rendered object, against the Kubernetes
#      1.37 schemas of the PyPI package kubernetes-validate (made standalone
#      by tools/validate/k8s_schemas.py). A kind without a schema is an
#      error; the only kinds skipped are the Prometheus Operator's
#      ServiceMonitor and PrometheusRule, which have no schema there and are
#      checked by step 5 instead;
#   4. Envoy's bootstrap, from the rendered ConfigMap, against Envoy's own
#      protobuf schemas (tools/validate/envoy: go-control-plane, strict
#      protojson, ValidateAll, every typed_config/Any unpacked and validated,
#      cluster references);
#   5. ServiceMonitor/PrometheusRule decoded strictly into the Prometheus
#      Operator's Go types (tools/validate/monitoring), and the rendered rule
#      groups through `promtool check rules`;
#   6. every container's command line through the real CLI's parser
#      (tools/validate/cli_args.py in the services' uv workspace; the proxy
#      through target/release/polycorn-proxy when it is built);
#   7. when `make build` has built them: the train path end to end on
#      loopback (tools/validate/edge_smoke.py): the real relay-agent dials the
#      server name NOTES.txt gives it, a front routes by the rendered Envoy
#      listener's server_names, the real proxy runs the rendered command line
#      with certificates issued as NOTES.txt says and the table verify keys
#      of the rendered ConfigMap (two `polycorn-pki table-key` public keys),
#      which it must parse and log.
# Then the template unit tests (tools/validate/tests, pytest over helm
# template), and the negative checks: a seeded error for each validator
# must make it fail, or this script fails.
#
# Installs what it needs first through `scripts/setup.sh chart` (helm,
# kubeconform, the schemas and the validators, in ${POLYCORN_CACHE:-/var/cache/polycorn}).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHART=$REPO_ROOT/charts/polycorn
CACHE=${POLYCORN_CACHE:-/var/cache/polycorn}
BIN=$CACHE/go/bin
K8S_VERSION=$(sed -n 's/^K8S_SCHEMA_VERSION=//p' "$REPO_ROOT/scripts/setup.d/chart.sh")
SCHEMAS=$CACHE/k8s-schemas/v$K8S_VERSION-standalone-strict
VENV=$CACHE/validate-venv
# Kinds kubeconform has no schema for, and what checks them instead (step 5).
CRD_KINDS=ServiceMonitor,PrometheusRule

log() { printf 'validate-chart: [%3ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf 'validate-chart: FAIL: %s\n' "$*" >&2; exit 1; }

T0=$SECONDS
bash "$REPO_ROOT/scripts/setup.sh" chart >/dev/null || die "setup.sh chart failed (run it to see why)"

if [[ -n ${KEEP:-} ]]; then
    OUT=$KEEP
    mkdir -p "$OUT"
else
    OUT=$(mktemp -d -t validate-chart.XXXXXX)
    trap 'rm -rf "$OUT"' EXIT
fi

# helm notes the rules link on stderr at every load ("found symbolic link in
# path ... Contents of linked file included and used"); that line alone is
# dropped, everything else helm prints stays.
helm() { "$BIN/helm" "$@" 2> >(grep -v 'found symbolic link in path: .*/files/polycorn.rules.yml' >&2); }
kubeconform() {
    "$BIN/kubeconform" -strict -summary -kubernetes-version "$K8S_VERSION" \
        -schema-location "$SCHEMAS/{{ .ResourceKind }}{{ .KindSuffix }}.json" "$@"
}

# ------------------------------------------------------------ the rules file
# The PrometheusRule embeds services/prometheus/rules/polycorn.rules.yml.
# Helm reads only files inside the chart, so the chart has a symbolic link to
# it (followed by helm template and lint, and resolved by helm package).
RULES_SRC=$REPO_ROOT/services/prometheus/rules/polycorn.rules.yml
RULES_LINK=$CHART/files/polycorn.rules.yml
[[ -f $RULES_SRC ]] || die "$RULES_SRC is missing"
[[ -L $RULES_LINK && $(readlink -f "$RULES_LINK") == "$(readlink -f "$RULES_SRC")" ]] \
    || die "charts/polycorn/files/polycorn.rules.yml must be a symbolic link to services/prometheus/rules/polycorn.rules.yml (ln -sfn ../../../services/prometheus/rules/polycorn.rules.yml charts/polycorn/files/polycorn.rules.yml)"
log "rules: charts/polycorn/files/polycorn.rules.yml links to services/prometheus/rules/polycorn.rules.yml"

# ------------------------------------------------------------ every scenario
scenarios=("$CHART"/ci/*-values.yaml)
((${#scenarios[@]})) || die "no scenarios in charts/polycorn/ci"
rendered=()
for values in "${scenarios[@]}"; do
    name=$(basename "$values" -values.yaml)
    log "== scenario $name"
    helm lint --strict "$CHART" -f "$values" >"$OUT/$name.lint" 2>&1 \
        || { cat "$OUT/$name.lint" >&2; die "helm lint --strict ($name)"; }
    grep -E '^1 chart\(s\) linted, 0 chart\(s\) failed' "$OUT/$name.lint" >/dev/null \
        || die "helm lint ($name): unexpected output"
    helm template polycorn "$CHART" -n polycorn -f "$values" >"$OUT/$name.yaml" \
        || die "helm template ($name)"
    rendered+=("$OUT/$name.yaml")
    printf '  lint: ok; rendered %s objects: %s\n' \
        "$(grep -c '^kind: ' "$OUT/$name.yaml")" \
        "$(grep '^kind: ' "$OUT/$name.yaml" | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $3; sep=", "}')"
    summary=$(kubeconform -skip "$CRD_KINDS" "$OUT/$name.yaml" 2>&1) \
        || { printf '%s\n' "$summary" >&2; die "kubeconform ($name)"; }
    printf '  kubeconform: %s\n' "$(tail -n1 <<<"$summary")"
    skipped=$(sed -n 's/.*Skipped: \([0-9]*\).*/\1/p' <<<"$summary")
    crds=$(grep -cE "^kind: (${CRD_KINDS//,/|})$" "$OUT/$name.yaml" || true)
    [[ $skipped == "$crds" ]] \
        || die "kubeconform ($name) skipped $skipped objects, but only the $crds $CRD_KINDS objects may be skipped"
    if grep -q '^kind: ConfigMap' "$OUT/$name.yaml" && grep -q 'envoy.yaml: |' "$OUT/$name.yaml"; then
        envoy=$("$BIN/polycorn-envoy-validate" "$OUT/$name.yaml" 2>&1) \
            || { printf '%s\n' "$envoy" >&2; die "Envoy bootstrap ($name)"; }
        printf '  envoy: %s\n' "$(tail -n1 <<<"$envoy")"
    else
        printf '  envoy: no Envoy in this scenario\n'
    fi
    if ((crds)); then
        mon=$("$BIN/polycorn-monitoring-validate" -rules-out "$OUT/$name.rules" "$OUT/$name.yaml" 2>&1) \
            || { printf '%s\n' "$mon" >&2; die "ServiceMonitor/PrometheusRule ($name)"; }
        printf '  monitoring: %s\n' "$mon"
        if compgen -G "$OUT/$name.rules/*.yml" >/dev/null; then
            promtool check rules "$OUT/$name.rules"/*.yml >"$OUT/$name.promtool" 2>&1 \
                || { cat "$OUT/$name.promtool" >&2; die "promtool check rules ($name)"; }
            printf '  promtool: %s\n' "$(grep -E 'SUCCESS' "$OUT/$name.promtool" | sed 's/^ *//' | paste -sd ';' -)"
        fi
    fi
done

# Every kind the chart can render appears in at least one scenario.
all_kinds=$(cat "${rendered[@]}" | sed -n 's/^kind: //p' | sort -u | paste -sd ' ' -)
for kind in ConfigMap CronJob Deployment HorizontalPodAutoscaler Job NetworkPolicy PodDisruptionBudget PrometheusRule \
    Service ServiceAccount ServiceMonitor StatefulSet; do
    [[ " $all_kinds " == *" $kind "* ]] || die "no scenario renders a $kind: add one to charts/polycorn/ci"
done
log "kinds covered by the scenarios: $all_kinds"

# ------------------------------------------------------------ the real command lines
# Every container's args through the real CLI's parser (types and choices
# included): the Python services from the uv workspace, the proxy through
# its binary when `make build` has built it.
PROXY_BIN=$REPO_ROOT/target/release/polycorn-proxy
proxy_args=()
if [[ -x $PROXY_BIN ]]; then
    proxy_args=(--proxy-bin "$PROXY_BIN")
else
    log "note: $PROXY_BIN not built (make build): proxy flags are checked against proxy/src/main.rs by the template tests only"
fi
cli_args() { (cd "$REPO_ROOT" && uv run --all-packages --locked --quiet python tools/validate/cli_args.py "$@"); }
log "== command lines through the real CLIs"
cli_args "${rendered[@]}" "${proxy_args[@]}" || die "a rendered command line does not parse"

# ------------------------------------------------------------ the train path, end to end
# No Envoy can run here: the real proxy (the rendered StatefulSet's command
# line) and the real relay-agent, on loopback, through a front that routes by
# the rendered Envoy listener's server names (tools/validate/edge_smoke.py).
# (The negative checks below pass it arguments, through expect_fail.)
# shellcheck disable=SC2120
edge_smoke() { "$VENV/bin/python" "$REPO_ROOT/tools/validate/edge_smoke.py" --helm "$BIN/helm" --bin-dir "$REPO_ROOT/target/release" "$@"; }
have_bins=1
for b in polycorn-proxy polycorn-relay polycorn-pki; do [[ -x $REPO_ROOT/target/release/$b ]] || have_bins=0; done
if ((have_bins)); then
    log "== the train path: relay -> SNI routing as rendered -> the rendered proxy (loopback)"
    # shellcheck disable=SC2119
    edge_smoke || die "edge smoke test"
else
    log "note: target/release/{polycorn-proxy,polycorn-relay,polycorn-pki} not built (make build): edge smoke test not run"
fi

# ------------------------------------------------------------ template unit tests
log "== template tests (tools/validate/tests)"
POLYCORN_HELM=$BIN/helm "$VENV/bin/python" -m pytest -p no:cacheprovider "$REPO_ROOT/tools/validate/tests" \
    || die "template tests"

# ------------------------------------------------------------ negative checks
# A validator that cannot fail proves nothing: each gets a seeded error and
# must reject it with a message naming it.
log "== negative checks (each validator must reject a seeded error)"
neg=0
expect_fail() { # DESCRIPTION PATTERN COMMAND...: COMMAND must fail, printing PATTERN
    local what=$1 pattern=$2 output
    shift 2
    if output=$("$@" 2>&1); then
        die "negative check '$what': the validator accepted the seeded error"
    fi
    grep -qE -- "$pattern" <<<"$output" \
        || { printf '%s\n' "$output" >&2; die "negative check '$what': failed without naming the error ($pattern)"; }
    printf '  [%3ds] rejected as expected: %s\n' "$((SECONDS - T0))" "$what"
    neg=$((neg + 1))
}
base=$OUT/production.yaml
minimal=$REPO_ROOT/charts/polycorn/ci/minimal-values.yaml
N=$OUT/negative
mkdir -p "$N"

# helm + values.schema.json
printf 'proxy:\n  caSecret:\n    nmae: x\n' >"$N/typo-values.yaml"
expect_fail "helm lint: unknown key in values" "additional properties 'nmae' not allowed" \
    helm lint --strict "$CHART" -f "$minimal" -f "$N/typo-values.yaml"
printf 'trains:\n  - id: Train_42\n' >"$N/bad-train-values.yaml"
expect_fail "helm template: train id not a DNS label" "/trains/0/id" \
    helm template polycorn "$CHART" -f "$minimal" -f "$N/bad-train-values.yaml"
printf 'trains:\n  - id: train-1\n  - id: train-1\n' >"$N/dup-train-values.yaml"
expect_fail "helm template: a train listed twice" "listed twice" \
    helm template polycorn "$CHART" -f "$minimal" -f "$N/dup-train-values.yaml"
expect_fail "helm template: required kafka.bootstrap missing" "kafka.bootstrap is required" \
    helm template polycorn "$CHART" --set postgresql.existingSecret=x

# kubeconform
sed '0,/^          ports:$/s//          portz:/' "$base" >"$N/unknown-field.yaml"
expect_fail "kubeconform: unknown field in a container" "additional properties 'portz' not allowed" \
    kubeconform -skip "$CRD_KINDS" "$N/unknown-field.yaml"
sed '0,/^  replicas: 3$/s//  replicas: three/' "$base" >"$N/bad-type.yaml"
expect_fail "kubeconform: wrong type (replicas: three)" "replicas" \
    kubeconform -skip "$CRD_KINDS" "$N/bad-type.yaml"
printf 'apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n' >"$N/unknown-kind.yaml"
expect_fail "kubeconform: a kind without a schema" "could not find schema for Widget" \
    kubeconform "$N/unknown-kind.yaml"

# Envoy
sed '0,/stat_prefix: train_ice-4711/s//stat_prefix: ""/' "$base" >"$N/envoy-stat-prefix.yaml"
expect_fail "envoy: empty stat_prefix inside a tcp_proxy typed_config (PGV)" "TcpProxy.StatPrefix" \
    "$BIN/polycorn-envoy-validate" -q "$N/envoy-stat-prefix.yaml"
sed '0,/idle_timeout: 3600s/s//idle_timout: 3600s/' "$base" >"$N/envoy-typo.yaml"
expect_fail "envoy: unknown field inside a typed_config" 'unknown field "idle_timout"' \
    "$BIN/polycorn-envoy-validate" -q "$N/envoy-typo.yaml"
sed '0,/denominator: HUNDRED/s//denominator: HUNDREDS/' "$base" >"$N/envoy-enum.yaml"
expect_fail "envoy: bad enum value in the rate limit filter" "HUNDREDS" \
    "$BIN/polycorn-envoy-validate" -q "$N/envoy-enum.yaml"
sed '0,/cluster: train_ice-4711$/s//cluster: train_ice-9999/' "$base" >"$N/envoy-ref.yaml"
expect_fail "envoy: tcp_proxy names an undefined cluster" 'cluster "train_ice-9999" is not defined' \
    "$BIN/polycorn-envoy-validate" -q "$N/envoy-ref.yaml"
sed 's/envoy.yaml: |/envoy-bootstrap.yaml: |/' "$base" >"$N/envoy-missing.yaml"
expect_fail "envoy: no bootstrap found at all" "no ConfigMap with data key" \
    "$BIN/polycorn-envoy-validate" -q "$N/envoy-missing.yaml"

# ServiceMonitor / PrometheusRule / promtool
sed '0,/jobLabel:/s//jobLabl:/' "$base" >"$N/sm-typo.yaml"
expect_fail "monitoring: unknown field in a ServiceMonitor" 'unknown field "jobLabl"' \
    "$BIN/polycorn-monitoring-validate" "$N/sm-typo.yaml"
sed '0,/interval: 30s/s//interval: 30 seconds/' "$base" >"$N/sm-duration.yaml"
expect_fail "monitoring: a duration the operator rejects" "is not a duration" \
    "$BIN/polycorn-monitoring-validate" "$N/sm-duration.yaml"
"$BIN/polycorn-monitoring-validate" -rules-out "$N/rules" "$base" >/dev/null
sed -i '0,/expr: /s//expr: sum by (job (/' "$N/rules/polycorn.rules.yml"
expect_fail "promtool: a PromQL syntax error in the rendered rules" "parse error|could not parse|unexpected" \
    promtool check rules "$N/rules/polycorn.rules.yml"

# The real CLIs: three seeded errors in the Python services' command lines
# ($(JOB_COMPLETION_INDEX) is Kubernetes' syntax, not the shell's), and one
# in a proxy's when the binary is there; one run must report each.
# shellcheck disable=SC2016
sed 's#--batch-timeout-s=0.5#--batch-timeout-s=half#; s#--shard=$(JOB_COMPLETION_INDEX)/8#--shard=8/8#' \
    "$OUT/sharded-trainer.yaml" >"$N/bad-args.yaml"
bad_args=("$N/bad-args.yaml")
seeded=3
if ((${#proxy_args[@]})); then
    sed '0,/--connect-timeout-s=10/s//--connect-timeout-s=ten/' "$base" >"$N/bad-proxy-args.yaml"
    bad_args+=("$N/bad-proxy-args.yaml")
    seeded=4
fi
expect_fail "real CLIs: a float flag given a word, a shard out of range$( ((seeded == 4)) && echo ', a proxy timeout given a word')" \
    "cli_args: [0-9]+ command lines parsed .*, $seeded failed" cli_args "${bad_args[@]}" "${proxy_args[@]}"
# The rendered table verify key with its algorithm identifier changed
# (Ed25519's OID 1.3.101.112 made 1.3.101.113).
sed '0,/MCowBQYDK2VwAyEA/s//MCowBQYDK2VxAyEA/' "$base" >"$N/bad-verify-key.yaml"
expect_fail "real CLIs: a rendered table verify key that is not Ed25519" \
    "FAIL .*table-signing.pub" cli_args "$N/bad-verify-key.yaml"

# The edge smoke test: a proxy certificate without the train's name.
if ((have_bins)); then
    expect_fail "edge smoke: a proxy certificate without the name the relay dials" \
        "got no path up|reports no path up" edge_smoke --proxy-san wrong.example
    expect_fail "edge smoke: a rendered table verify key that is not Ed25519" \
        "not an Ed25519 public key" edge_smoke --bad-verify-key
fi

# The template tests: a broken expectation must fail (the suite is not vacuous).
expect_fail "template tests: a seeded wrong expectation" "FAILED .*test_seeded_failure" \
    env POLYCORN_HELM="$BIN/helm" POLYCORN_SEED_FAILURE=1 "$VENV/bin/python" -m pytest -p no:cacheprovider \
    "$REPO_ROOT/tools/validate/tests" -k seeded_failure

log "negative checks: $neg seeded errors, all rejected"
log "OK: ${#scenarios[@]} scenarios linted, rendered and validated; $((SECONDS - T0)) s"
