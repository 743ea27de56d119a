# shellcheck shell=bash
# Optional component `fuzz` (`setup.sh fuzz`, run by `make fuzz-smoke` and
# `make fuzz`): coverage-guided fuzzing of fuzz/ with honggfuzz on the stable
# toolchain (cargo-fuzz would need nightly).
#
# - binutils-dev, libunwind-dev, libblocksruntime-dev and liblzma-dev: what
#   honggfuzz's C sources, built by the `honggfuzz` crate's build script under
#   `cargo hfuzz`, link against (libbfd for symbolised reports, libunwind for
#   stack hashes).
# - `cargo hfuzz` itself (the crate `honggfuzz`, pinned to the version in
#   fuzz/Cargo.lock, which it must match) installed with `cargo install
#   --locked` into the machine cache, shared by every clone (override with
#   POLYCORN_CACHE); a second run finds it and touches no network.
OPTIONAL+=(fuzz)

HONGGFUZZ_VERSION=0.5.62

component_fuzz() {
    need_apt build-essential binutils-dev libunwind-dev libblocksruntime-dev liblzma-dev
    after_install check_rust check_hfuzz
}

hfuzz_root() { echo "${POLYCORN_CACHE:-/var/cache/polycorn}/cargo-hfuzz-$HONGGFUZZ_VERSION"; }

check_hfuzz() {
    local root lock_version
    root=$(hfuzz_root)
    lock_version=$(awk '/^name = "honggfuzz"$/ {getline; gsub(/[^0-9.]/, ""); print}' "$REPO_ROOT/fuzz/Cargo.lock")
    [[ $lock_version == "$HONGGFUZZ_VERSION" ]] \
        || die "fuzz/Cargo.lock has honggfuzz ${lock_version:-?}, setup.d/fuzz.sh pins $HONGGFUZZ_VERSION: keep them equal"
    if [[ ! -x $root/bin/cargo-hfuzz ]]; then
        log "cargo install honggfuzz $HONGGFUZZ_VERSION into $root"
        cargo install --quiet --locked --root "$root" honggfuzz --version "=$HONGGFUZZ_VERSION" \
            || die "could not install cargo-hfuzz (honggfuzz $HONGGFUZZ_VERSION) with cargo install"
    fi
    SUMMARY+=("fuzz: cargo-hfuzz $HONGGFUZZ_VERSION at $root/bin")
}
