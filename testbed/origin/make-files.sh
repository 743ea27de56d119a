#!/usr/bin/env bash
# Creates the origin's download test files with random content:
#   0B.bin 1KiB.bin 1MiB.bin 10MiB.bin 100MiB.bin  (0, 1024, 1 048 576,
#   10 485 760, 104 857 600 bytes) and SHA256SUMS over them,
# in $PC_STATE/origin/www/files/ (or the directory given as $1).
#
# Random content, so that no compression or deduplication on the path can
# make a transfer look faster than it is. Existing files of the right size
# are kept: regenerating 111 MiB on every start would cost seconds.
set -euo pipefail
# shellcheck source=testbed/netns/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../netns/lib.sh"

dir=${1:-$PC_STATE/origin/www/files}
mkdir -p "$dir"

declare -A sizes=(
    [0B.bin]=0
    [1KiB.bin]=1024
    [1MiB.bin]=1048576
    [10MiB.bin]=10485760
    [100MiB.bin]=104857600
    # The bulk downloads of make bench-hsr (polycorn-loadgen's default sizes).
    [bench-256KB.bin]=262144
    [bench-1MB.bin]=1048576
    [bench-4MB.bin]=4194304
)

changed=0
for name in "${!sizes[@]}"; do
    want=${sizes[$name]}
    f=$dir/$name
    if [[ -f $f && $(stat -c %s "$f") -eq $want ]]; then
        continue
    fi
    head -c "$want" /dev/urandom >"$f.tmp"
    mv "$f.tmp" "$f"
    changed=1
done

if ((changed)) || [[ ! -s $dir/SHA256SUMS ]]; then
    (cd "$dir" && sha256sum -- *.bin >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
fi
