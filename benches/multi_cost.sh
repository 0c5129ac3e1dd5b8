#!/usr/bin/env bash
# Server-side cost of several quotas in one call: INFO commandstats
# usec_per_call of EVALSHA over N calls on one connection (redis-benchmark
# -c 1), on one fresh redis-server that this script starts on a free
# loopback port and stops, for
#
#   1. the single token bucket script (a 1-quota call, the single path);
#   2. the multi-quota script with that one token bucket;
#   3. the multi-quota script with 3 quotas: fixed window, sliding window
#      counter, token bucket (a 3-quota call);
#   4. the same 3 quotas as 3 single script calls (fixed window, sliding
#      window, token bucket: the sum of their times per call), what a store
#      without the multi-quota script would spend, in 3 round trips;
#
# every call admitted (limits far above N), the server's clock.
#
# From the repository root:  bash benches/multi_cost.sh [ROUNDS]
# ROUNDS (default 3); prints each round and the median. Needs redis-server,
# redis-cli, redis-benchmark 7.
set -euo pipefail
# ARGV[1] of our single scripts: a deadline in server µs, far ahead (as the
# stores send one with every call; the check is one comparison).
DL=9000000000000000
cd "$(dirname "$0")/.."
# The store's scripts, as assembled from their parts.
SRC=$(mktemp -d)
for s in token_bucket sliding_log fixed_window sliding_window batch; do
    cargo run -q --release -p ratelimit-benches --bin script_source -- "$s" >"$SRC/$s.lua"
done
ROUNDS="${1:-3}"
N=10000

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" --dir "$DIR"
trap 'kill "$(cat "$DIR/redis.pid")" 2>/dev/null; rm -rf "$DIR" "$SRC"' EXIT
cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 50); do cli ping >/dev/null 2>&1 && break; sleep 0.1; done

SHA_TB=$(cli SCRIPT LOAD "$(cat $SRC/token_bucket.lua)")
SHA_FW=$(cli SCRIPT LOAD "$(cat $SRC/fixed_window.lua)")
SHA_SW=$(cli SCRIPT LOAD "$(cat $SRC/sliding_window.lua)")
SHA_MULTI=$(cli SCRIPT LOAD "$(cat $SRC/batch.lua)")

per_call() { # <redis-benchmark args...>
    cli FLUSHALL >/dev/null
    cli CONFIG RESETSTAT >/dev/null
    redis-benchmark -p "$PORT" -c 1 -n "$N" "$@" >/dev/null
    cli INFO commandstats | grep "^cmdstat_evalsha:" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/'
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

TB_ARGS=(1 1 1000000000)
WIN_ARGS=(1 1000000000 1000000)
single="" multi1="" multi3="" three=""
for r in $(seq "$ROUNDS"); do
    s=$(per_call EVALSHA "$SHA_TB" 1 "b:{c}:tb2" "$DL" "${TB_ARGS[@]}")
    # Batch layout as the store sends it on the server's clock: min expiry,
    # 1 field per request (one quota set), the earliest deadline, keys
    # distinct (1), 1 quota set (id 1, n quotas, 5 args per quota), then the
    # requests' deadlines in one argument (one request here).
    m1=$(per_call EVALSHA "$SHA_MULTI" 1 "b:{c}:tb2" 0 1 "$DL" 1 1 1 1 4 0 "${TB_ARGS[@]}" "$DL")
    m3=$(per_call EVALSHA "$SHA_MULTI" 3 "b:{c}:fw" "b:{c}:sw" "b:{c}:tb2" 0 1 "$DL" 1 1 1 3 \
        1 0 "${WIN_ARGS[@]}" 2 0 "${WIN_ARGS[@]}" 4 0 "${TB_ARGS[@]}" "$DL")
    f=$(per_call EVALSHA "$SHA_FW" 1 "b:{c}:fw" "$DL" "${WIN_ARGS[@]}")
    w=$(per_call EVALSHA "$SHA_SW" 1 "b:{c}:sw" "$DL" "${WIN_ARGS[@]}")
    t=$(python3 -c "print(round($f + $w + $s, 2))")
    echo "round $r: single tb $s us, multi 1 quota $m1 us, multi 3 quotas $m3 us, 3 singles $t us"
    single="$single $s" multi1="$multi1 $m1" multi3="$multi3 $m3" three="$three $t"
done
S=$(echo "$single" | median)
M1=$(echo "$multi1" | median)
M3=$(echo "$multi3" | median)
T=$(echo "$three" | median)
echo "median: single tb $S us, multi 1 quota $M1 us, multi 3 quotas $M3 us, 3 singles $T us"
echo "3-quota call / 1-quota call: $(python3 -c "print(round($M3 / $S, 2))")"
echo "3-quota call / 3 single calls: $(python3 -c "print(round($M3 / $T, 2))")"
