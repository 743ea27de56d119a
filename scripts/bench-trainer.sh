#!/usr/bin/env bash
# make bench-trainer: the trainer's validation on generated fleets, side by
# side with the paper, and one refit of 10,000 cells / 1M handovers timed and
# its memory measured -> bench/out/trainer.json (+ trainer.md).
#
# 1. Fleets (BENCH_TRAINER_PARTS contains "fleet"): for each route seed of
#    BENCH_TRAINER_ROUTES (the first is the reported one: 7; 11 and 12 are
#    held out, never looked at while developing; the development route 1 is
#    never reported), BENCH_TRAINER_TRIPS trips (trip seeds 2001.., 2101..,
#    2201.. for the 1st, 2nd, 3rd route) of BENCH_TRAINER_TRIP_S seconds by
#    polycorn-tracegen (pc-gateway-300, 2 carriers), each published with
#    `polycorn-ingest produce-testbed` (its own epoch, a day apart; 4 trains
#    taking turns) to a fresh topic and consumed by `polycorn-ingest run` into
#    a fresh database linkdb_bench_trainer_r<seed>; LinkDB's counts are
#    checked against the event files; then `polycorn-trainer validate`.
# 2. Scale (BENCH_TRAINER_PARTS contains "scale"): a fresh database
#    linkdb_bench_trainer_scale seeded by scripts/trainer-seed.sql
#    (BENCH_TRAINER_CELLS keys, BENCH_TRAINER_HANDOVERS handovers, 1 Hz GPS
#    fixes; fixed seed; timed separately), then one `polycorn-trainer run
#    --once --no-publish` under scripts/trainer_fleet.py measure (wall time,
#    peak PSS/RSS of the process tree sampled every 0.2 s, and the largest
#    process's exact peak RSS from getrusage).
# 3. scripts/trainer_fleet.py report folds it all into trainer.json/.md.
#
# Databases and topics it created are dropped at the end unless
# BENCH_TRAINER_KEEP=1 (then the work directory stays too).
#
# Env: BENCH_TRAINER_ROUTES ("7 11 12"), BENCH_TRAINER_TRIPS (24),
# BENCH_TRAINER_TRIP_S (1800), BENCH_TRAINER_CELLS (10000),
# BENCH_TRAINER_HANDOVERS (1000000), BENCH_TRAINER_SEED (0.42, setseed),
# BENCH_TRAINER_WORKERS (0: the trainer's default, one per CPU),
# BENCH_TRAINER_PARTS ("fleet scale"), BENCH_TRAINER_KEEP (0),
# BENCH_TRAINER_WORK (a new /tmp/bench-trainer.XXXXXX), BENCH_OUT (bench/out).
# Any non-default route list, fleet or scale size, or a single part makes
# the run a diagnostic one: its results go to $WORK/out, never bench/out.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUTES=${BENCH_TRAINER_ROUTES:-7 11 12}
TRIPS=${BENCH_TRAINER_TRIPS:-24}
TRIP_S=${BENCH_TRAINER_TRIP_S:-1800}
CELLS=${BENCH_TRAINER_CELLS:-10000}
HANDOVERS=${BENCH_TRAINER_HANDOVERS:-1000000}
SEED=${BENCH_TRAINER_SEED:-0.42}
WORKERS=${BENCH_TRAINER_WORKERS:-0}
PARTS=${BENCH_TRAINER_PARTS:-fleet scale}
KEEP=${BENCH_TRAINER_KEEP:-0}
OUT=${BENCH_OUT:-bench/out}
UVW=(uv run --all-packages --locked --quiet)
FLEET=(scripts/trainer_fleet.py)

log() { printf 'bench-trainer: %s\n' "$*" >&2; }
has_part() { [[ " $PARTS " == *" $1 "* ]]; }

WORK=${BENCH_TRAINER_WORK:-$(mktemp -d /tmp/bench-trainer.XXXXXX)}
mkdir -p "$WORK"
DIAGNOSTIC=0
if [[ $ROUTES != "7 11 12" || $TRIPS != 24 || $TRIP_S != 1800 || $CELLS != 10000 ||
    $HANDOVERS != 1000000 || $SEED != 0.42 || $PARTS != "fleet scale" ]]; then
    OUT=$WORK/out
    DIAGNOSTIC=1
    log "diagnostic run (non-default settings): results go to $OUT"
fi
read -r -a ROUTE_LIST <<<"$ROUTES"
[[ ${ROUTE_LIST[0]} != 1 ]] || log "route seed 1 is the development route: never report it"

bash scripts/infra.sh up pg kafka
eval "$(bash scripts/infra.sh env)"
ADMIN_URL=${POLYCORN_DATABASE_URL%/*}/postgres
db_url() { printf '%s/%s' "${POLYCORN_DATABASE_URL%/*}" "$1"; }
DBS=()
cleanup() {
    local db
    if [[ $KEEP == 1 ]]; then
        log "kept: databases ${DBS[*]:-none}, work directory $WORK"
        return
    fi
    for db in "${DBS[@]}"; do
        psql "$ADMIN_URL" -qc "drop database if exists $db with (force)" || true
    done
    # A diagnostic run's results live in the work directory.
    if [[ $DIAGNOSTIC == 1 ]]; then log "results and pieces kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
fresh_db() { # fresh_db NAME: an empty LinkDB at the latest schema
    DBS+=("$1")
    psql "$ADMIN_URL" -qc "drop database if exists $1 with (force)" -c "create database $1"
    psql "$(db_url "$1")" -qc "create extension if not exists postgis"
    "${UVW[@]}" polycorn-linkdb --url "$(db_url "$1")" upgrade
}

# The trainer's console script, run directly (not through uv) so that the
# measured process tree is the trainer's.
TRAINER=$("${UVW[@]}" python -c 'import shutil; print(shutil.which("polycorn-trainer"))')
[[ -x $TRAINER ]] || { log "polycorn-trainer not found in the workspace"; exit 1; }

python3 - "$WORK/meta.json" <<PY
import json, subprocess, sys, datetime
json.dump({
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "dirty": bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()),
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "loadavg_start": open("/proc/loadavg").read().split()[:3],
    "workers": $WORKERS, "cpus": len(__import__("os").sched_getaffinity(0)), "seed": $SEED,
}, open(sys.argv[1], "w"))
PY
meta_set() { # meta_set KEY JSON-VALUE
    python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); m[sys.argv[2]]=json.loads(sys.argv[3]); json.dump(m,open(sys.argv[1],"w"))' \
        "$WORK/meta.json" "$1" "$2"
}

if has_part fleet; then
    log "building polycorn-tracegen"
    cargo build --release --locked -q -p polycorn-tracegen
    TRACEGEN=${CARGO_TARGET_DIR:-target}/release/polycorn-tracegen
    i=0
    for route in "${ROUTE_LIST[@]}"; do
        base=$((2000 + 100 * i))
        i=$((i + 1))
        db=linkdb_bench_trainer_r$route
        log "route $route: $TRIPS trips of ${TRIP_S}s (trip seeds $((base + 1))-$((base + TRIPS))) into $db"
        fresh_db "$db"
        "${UVW[@]}" python "${FLEET[@]}" load --route-seed "$route" \
            --trip-seeds "$((base + 1))-$((base + TRIPS))" --duration-s "$TRIP_S" --carriers 2 \
            --tracegen "$TRACEGEN" --database-url "$(db_url "$db")" \
            --work "$WORK/trips" --out "$WORK/fleet-r$route.json"
        rm -rf "$WORK/trips"
        log "route $route: polycorn-trainer validate"
        POLYCORN_DATABASE_URL=$(db_url "$db") "$TRAINER" --log-level WARNING validate \
            --summary-json "$WORK/validate-r$route.json" >/dev/null
    done
fi

if has_part scale; then
    db=linkdb_bench_trainer_scale
    log "scale: seeding $db with $CELLS cells and $HANDOVERS handovers (a few minutes)"
    fresh_db "$db"
    start=$(date +%s.%N)
    psql "$(db_url "$db")" -q -v cells="$CELLS" -v handovers="$HANDOVERS" -v carriers=2 \
        -v seed="$SEED" -f scripts/trainer-seed.sql >/dev/null
    meta_set seed_s "$(python3 -c "import sys; print(round($(date +%s.%N) - $start, 1))")"
    "${UVW[@]}" python "${FLEET[@]}" scale-check --database-url "$(db_url "$db")" \
        --out "$WORK/scale-data.json" >/dev/null
    meta_set loadavg_before_scale "$(python3 -c 'import json; print(json.dumps(open("/proc/loadavg").read().split()[:3]))')"
    log "scale: polycorn-trainer run --once --no-publish (workers: $WORKERS, 0 = one per CPU)"
    POLYCORN_DATABASE_URL=$(db_url "$db") "${UVW[@]}" python "${FLEET[@]}" measure \
        --out "$WORK/scale-measure.json" -- \
        "$TRAINER" run --once --no-publish --workers "$WORKERS" \
        --summary-json "$WORK/scale-summary.json"
fi

if has_part fleet && has_part scale; then
    mkdir -p "$OUT"
    "${UVW[@]}" python "${FLEET[@]}" report --work "$WORK" --routes "${ROUTE_LIST[@]}" \
        --out "$OUT/trainer.json"
    log "wrote $OUT/trainer.json and $OUT/trainer.md"
else
    log "one part only: pieces in $WORK (no report)"
fi
