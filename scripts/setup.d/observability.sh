# shellcheck shell=bash
# Optional component `observability` (`setup.sh observability`, run by
# make validate-platform): what the offline checks of the alert
# rules and the dashboards need.
#
# - promtool, from Debian's prometheus package (also in `infra`).
# - node and npm (Debian's, unless a node is already on PATH) and the
#   dashboard type check's npm packages, pinned in
#   tools/validate/dashboards/package-lock.json (@grafana/schema, typescript),
#   installed by `npm ci` into tools/validate/dashboards/node_modules (git-ignored);
#   a stamp named after the lockfile's hash makes a second run skip npm.
# - uv (component python) for scripts/check_observability.py, whose PyPI
#   dependencies (promql-parser, PyYAML) are in the workspace's uv.lock.
OPTIONAL+=(observability)

component_observability() {
    need_apt prometheus
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        need_apt nodejs npm
    fi
    component_python
    after_install check_observability
}

check_observability() {
    local dir=$REPO_ROOT/tools/validate/dashboards stamp v
    command -v promtool >/dev/null || die "promtool not found although the prometheus package is installed"
    stamp="$dir/node_modules/.polycorn-$(sha256sum "$dir/package-lock.json" | cut -c1-16)"
    if [[ ! -e $stamp ]]; then
        log "npm ci in tools/validate/dashboards (@grafana/schema, typescript; pinned by package-lock.json)"
        (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) \
            || die "npm ci failed in $dir"
        touch "$stamp"
    fi
    v=$(cd "$dir" && node -p 'require("@grafana/schema/package.json").version + " / typescript " + require("typescript/package.json").version')
    SUMMARY+=("observability: $(promtool --version 2>&1 | awk 'NR == 1 {print "promtool", $3}'), node $(node --version), @grafana/schema $v")
}
