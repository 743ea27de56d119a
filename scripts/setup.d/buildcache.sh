# shellcheck shell=bash
# Optional component `buildcache` (`setup.sh buildcache`, run by make test's
# setup stage): sccache, a compiler cache that every clone of this machine
# shares, so that a fresh clone (CI's) compiles only this repository's own
# crates and takes every dependency (tokio, rustls, quinn, rdkafka's
# librdkafka wrapper, ...) from the cache. Without it each fresh clone
# compiles the dependency tree four times over: clippy's check build, the
# release build, and the fuzz workspace's test build and honggfuzz build (the
# last stays uncached: cargo hfuzz builds incrementally; scripts/fuzz.py).
#
# - sccache itself, pinned, built with `cargo install --locked` and only its
#   local-disk backend (no default features: no cloud storage clients) into
#   the machine cache ${POLYCORN_CACHE:-/var/cache/polycorn}, and linked as
#   $POLYCORN_CACHE/bin/sccache, the one path the Makefile looks for.
# - The Makefile sets RUSTC_WRAPPER to it when it is there when make starts,
#   and exports it to every stage, so one run of make test is compiled
#   either entirely with the cache or entirely without it (a fresh machine's
#   first run, which installs it, is the one without).
#
# sccache caches only what it can reproduce exactly (rlibs of one compiler,
# one set of flags and environment); binaries, proc macros and build scripts
# are compiled each time. A second run of this component touches no network.
OPTIONAL+=(buildcache)

SCCACHE_VERSION=0.19.0

component_buildcache() {
    after_install check_rust check_sccache
}

check_sccache() {
    local cache=${POLYCORN_CACHE:-/var/cache/polycorn}
    local root=$cache/sccache-$SCCACHE_VERSION
    if [[ ! -x $root/bin/sccache ]]; then
        log "cargo install sccache $SCCACHE_VERSION into $root (once per machine, a few minutes)"
        cargo install --quiet --locked --no-default-features --root "$root" sccache --version "=$SCCACHE_VERSION" \
            || die "could not install sccache $SCCACHE_VERSION with cargo install"
    fi
    mkdir -p "$cache/bin"
    ln -sfn "$root/bin/sccache" "$cache/bin/sccache"
    "$cache/bin/sccache" --version >/dev/null || die "$cache/bin/sccache does not run"
    SUMMARY+=("buildcache: sccache $SCCACHE_VERSION at $cache/bin/sccache (cache ${SCCACHE_DIR:-$cache/sccache})")
}
