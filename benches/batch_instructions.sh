#!/usr/bin/env bash
# The server's instructions per batched decision, as the store sends them
# under load: calls of 128 requests of one token bucket each, every request
# a different caller among 10,000 whose keys exist (as with many callers on
# a live server), the server's clock, no deadline reached. redis-server runs
# under callgrind; for each script the counters are zeroed, N calls are sent
# by redis-benchmark on one connection, and the counters dumped. Instruction
# counts do not depend on what else the machine runs.
#
# From the repository root:
#   bash benches/batch_instructions.sh [N] [BASELINE.lua]
# With a baseline (a batch script saved from another commit with
# `cargo run --release -p ratelimit-benches --bin script_source -- batch`),
# the two scripts are measured alternately in one server run, twice each.
# Needs valgrind, redis-server 7, redis-benchmark, redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-100}"
BASELINE="${2:-}"
DL=9000000000000000
SRC=$(mktemp -d)
cargo run -q --release -p ratelimit-benches --bin script_source -- batch >"$SRC/current.lua"
SCRIPTS=("$SRC/current.lua")
if [ -n "$BASELINE" ]; then
    SCRIPTS=("$BASELINE" "$SRC/current.lua" "$BASELINE" "$SRC/current.lua")
fi

# redis-server under callgrind: PORT, DIR, VG, cli.
source benches/lib/callgrind_server.sh
# 10,000 callers' buckets, kept for a day.
for i in $(seq 0 9999); do echo "PSETEX rl:{caller-$i}:tb2 86400000 1"; done | cli >/dev/null

# No key repeats; one quota set (id 1) of one quota: a token bucket (kind
# 4), not shadow, a token of 1,000,000 units, 1 unit a µs (one token a
# second), 1,000,000 tokens full: every request is admitted and written
# with an expiry of about a second.
QUOTA=(1 1 1 1 4 0 1000000 1 1000000000000)
DLS=""
for _ in $(seq 128); do DLS="${DLS:+$DLS }$DL"; done
echo "| script | instructions per decision |"
echo "|---|---:|"
n=0
for script in "${SCRIPTS[@]}"; do
    SHA=$(cli SCRIPT LOAD "$(cat "$script")")
    KEYS=()
    for i in $(seq 128); do KEYS+=("rl:{caller-$(((i * 79 + n * 13) % 10000))}:tb2"); done
    ARGS=(EVALSHA "$SHA" 128 "${KEYS[@]}" 0 1 "$DL" "${QUOTA[@]}" "$DLS")
    # Every request admitted, each answered with the one-integer form.
    reply=$(cli "${ARGS[@]}" | head -1)
    [ "$reply" -le -2 ] || { echo "unexpected reply $reply from $script" >&2; exit 1; }
    redis-benchmark -p "$PORT" -c 1 -n 5 "${ARGS[@]}" >/dev/null
    n=$((n + 1))
    callgrind_control -z "$VG" >/dev/null
    redis-benchmark -p "$PORT" -c 1 -n "$N" "${ARGS[@]}" >/dev/null
    callgrind_control -d "m$n" "$VG" >/dev/null
    sleep 1
    f=$(ls -t "$DIR"/cg.out.* | head -1)
    total=$(grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}')
    label=current
    [ "$script" = "$BASELINE" ] && label="baseline ($(basename "$BASELINE"))"
    printf '| %s | %d |\n' "$label" $((total / N / 128))
done
