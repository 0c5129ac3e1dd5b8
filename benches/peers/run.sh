#!/usr/bin/env bash
# Builds redis-cell's module from its published crate (fetched by cargo) and runs the peers
# benchmark with it loaded. Arguments are passed to the benchmark
# (e.g. --runs 3 --seconds 3); --build-only builds and stops. Needs
# redis-server on PATH.
#
# --check prepares Limitador's copy (below) and type-checks every target of
# the benchmark, without redis-cell and without running anything: CI runs
# it, so that a change of the project's API cannot break this crate unseen
# (it is a workspace of its own, outside the project's build).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${PEERS_WORK_DIR:-${TMPDIR:-/tmp}/ratelimit-peers}"
mkdir -p "$work"
check=""
if [ "${1:-}" = "--check" ]; then
    check=1
fi

cell="$work/redis-cell/target/release/libredis_cell.so"
if [ -z "$check" ] && [ ! -f "$cell" ]; then
    # Fetch the crate's source through cargo (a throwaway project that names
    # it), then build the module from that source.
    fetch="$work/fetch"
    mkdir -p "$fetch/src"
    printf '[package]\nname = "fetch-redis-cell"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nredis-cell = "=0.2.2"\n[workspace]\n' >"$fetch/Cargo.toml"
    : >"$fetch/src/lib.rs"
    cargo fetch --manifest-path "$fetch/Cargo.toml" >&2
    src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/redis-cell-0.2.2 | head -1)"
    rm -rf "$work/redis-cell"
    cp -r "$src" "$work/redis-cell"
    (cd "$work/redis-cell" && CARGO_TARGET_DIR="$work/redis-cell/target" cargo build --release >&2) || {
        echo "redis-cell did not build; running without it" >&2
        cell=""
    }
fi

# Limitador 0.14.0 does not build with its Redis storage alone: its
# storage::keys::bin module and Counter::variables_for_key, which the Redis
# storage uses, are compiled only with the disk_storage (RocksDB) feature.
# Rather than build RocksDB, take a copy of the crate with those two gates
# widened to the Redis storage (Cargo.toml patches limitador to this copy).
lim="$here/.patched/limitador-0.14.0"
if [ ! -f "$lim/Cargo.toml" ]; then
    fetch="$work/fetch-limitador"
    mkdir -p "$fetch/src"
    printf '[package]\nname = "fetch-limitador"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nlimitador = { version = "=0.14.0", default-features = false }\n[workspace]\n' >"$fetch/Cargo.toml"
    : >"$fetch/src/lib.rs"
    cargo fetch --manifest-path "$fetch/Cargo.toml" >&2
    src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/limitador-0.14.0 | head -1)"
    mkdir -p "$here/.patched"
    rm -rf "$lim"
    cp -r "$src" "$lim"
    python3 - "$lim" <<'PY'
import sys
root = sys.argv[1]
gate = '#[cfg(feature = "disk_storage")]\n'
both = '#[cfg(any(feature = "disk_storage", feature = "redis_storage"))]\n'
for path, item in [("src/storage/keys.rs", "pub mod bin {"),
                   ("src/counter.rs", "    pub(crate) fn variables_for_key")]:
    p = f"{root}/{path}"
    s = open(p).read()
    old = gate.replace("#", " " * (len(item) - len(item.lstrip())) + "#", 1) + item
    assert old in s, f"limitador's {path} changed: check the gate of {item.strip()}"
    open(p, "w").write(s.replace(old, old.replace(gate.strip(), both.strip(), 1)))
PY
fi

if [ -n "$check" ]; then
    exec cargo check --manifest-path "$here/Cargo.toml" --all-targets
fi
if [ "${1:-}" = "--build-only" ]; then
    exec cargo build --release --manifest-path "$here/Cargo.toml"
fi
exec cargo run --release --manifest-path "$here/Cargo.toml" -- ${cell:+--cell "$cell"} "$@"
