#!/usr/bin/env bash
# Server-side cost of the Redis layouts, measured side by side on one fresh
# redis-server that this script starts on a free loopback port and stops:
#
#   1. token bucket: our script (layout tb2) against the naive hash-of-floats
#      script (benches/lua/naive_token_bucket.lua), the server's time per call
#      (INFO commandstats usec_per_call, one connection) and the throughput of
#      redis-benchmark -c 32 (same concurrency for both), for an admitting
#      and a denying caller;
#   2. our token bucket as EVALSHA against the same source loaded once as a
#      Redis Function (FUNCTION LOAD, FCALL);
#   3. sliding log (layout sl2): a decision on a 10-entry log against one on
#      a 100,000-entry log, admitted and denied;
#   4. bytes per active caller: used_memory over DBSIZE after 100,000
#      distinct callers, our token bucket against the naive one, same keys.
#
# From the repository root:  bash benches/script_cost.sh [ROUNDS]
# ROUNDS (default 3) repeats sections 1-3; each prints its per-round values
# and the median. Needs redis-server, redis-cli, redis-benchmark 7.
set -euo pipefail
# ARGV[3] of our scripts: a deadline in server µs, far ahead (as the
# stores send one with every call; the check is one comparison).
DL=9000000000000000
cd "$(dirname "$0")/.."
# The store's scripts, as assembled from their parts.
SRC=$(mktemp -d)
for s in token_bucket sliding_log fixed_window sliding_window batch; do
    cargo run -q --release -p ratelimit-benches --bin script_source -- "$s" >"$SRC/$s.lua"
done
ROUNDS="${1:-3}"
N=40000 # calls per server-time measurement

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" --dir "$DIR"
trap 'kill "$(cat "$DIR/redis.pid")" 2>/dev/null; rm -rf "$DIR" "$SRC"' EXIT
cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 50); do cli ping >/dev/null 2>&1 && break; sleep 0.1; done

OURS=$SRC/token_bucket.lua
LOG=$SRC/sliding_log.lua
NAIVE=benches/lua/naive_token_bucket.lua
SHA_TB=$(cli SCRIPT LOAD "$(cat $OURS)")
SHA_SL=$(cli SCRIPT LOAD "$(cat $LOG)")
SHA_NAIVE=$(cli SCRIPT LOAD "$(cat $NAIVE)")
# The same token bucket source as a function library: KEYS and ARGV become
# the function's parameters, the body is unchanged.
LIB="#!lua name=ratelimit_bench
local function token_bucket(KEYS, ARGV)
$(cat $OURS)
end
redis.register_function('rl_token_bucket', token_bucket)"
cli FUNCTION LOAD REPLACE "$LIB" >/dev/null

# usec_per_call of one command after $N calls of it on one connection.
per_call() { # <cmdstat name> <redis-benchmark args...>
    local stat=$1
    shift
    cli CONFIG RESETSTAT >/dev/null
    redis-benchmark -p "$PORT" -c 1 -n "$N" "$@" >/dev/null
    cli INFO commandstats | grep "^cmdstat_$stat:" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/'
}
# requests per second of redis-benchmark -c 32.
rps() {
    redis-benchmark -p "$PORT" -c 32 -n "$N" --csv "$@" | tail -1 | cut -d, -f2 | tr -d '"'
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

# Token bucket arguments. Admitting: 1 per second, burst 999,999,999 (never
# full again during a run, so the key stays); denying: 1 per hour, burst 20,
# spent first (no token comes back during a run, so every call is denied).
# Ours: now ("" = TIME), min expiry, cost*unit, refill, full, unit. Naive:
# rate per second, capacity, cost.
ADMIT_OURS=("" 0 "$DL" 1000000 1 999999999000000 1000000)
DENY_OURS=("" 0 "$DL" 3600000000 1 72000000000 3600000000)
ADMIT_NAIVE=(1 1000000000 1)
DENY_NAIVE=(0.0002777777777777778 20 1)
K_OURS='rl:{api~customer-0000042}:tb2'
K_NAIVE='rl:{api~customer-0000042}:tb2n'

declare -A R
for round in $(seq "$ROUNDS"); do
    cli DEL "$K_OURS" "$K_NAIVE" "d$K_OURS" "d$K_NAIVE" >/dev/null
    for _ in $(seq 30); do
        cli EVALSHA "$SHA_TB" 1 "d$K_OURS" "${DENY_OURS[@]}" >/dev/null
        cli EVALSHA "$SHA_NAIVE" 1 "d$K_NAIVE" "${DENY_NAIVE[@]}" >/dev/null
    done
    R[ours_admit]+=" $(per_call evalsha EVALSHA "$SHA_TB" 1 "$K_OURS" "${ADMIT_OURS[@]}")"
    R[naive_admit]+=" $(per_call evalsha EVALSHA "$SHA_NAIVE" 1 "$K_NAIVE" "${ADMIT_NAIVE[@]}")"
    R[fcall_admit]+=" $(per_call fcall FCALL rl_token_bucket 1 "$K_OURS" "${ADMIT_OURS[@]}")"
    R[ours_deny]+=" $(per_call evalsha EVALSHA "$SHA_TB" 1 "d$K_OURS" "${DENY_OURS[@]}")"
    R[naive_deny]+=" $(per_call evalsha EVALSHA "$SHA_NAIVE" 1 "d$K_NAIVE" "${DENY_NAIVE[@]}")"
    R[fcall_deny]+=" $(per_call fcall FCALL rl_token_bucket 1 "d$K_OURS" "${DENY_OURS[@]}")"
    R[rps_ours_admit]+=" $(rps EVALSHA "$SHA_TB" 1 "$K_OURS" "${ADMIT_OURS[@]}")"
    R[rps_naive_admit]+=" $(rps EVALSHA "$SHA_NAIVE" 1 "$K_NAIVE" "${ADMIT_NAIVE[@]}")"
    R[rps_fcall_admit]+=" $(rps FCALL rl_token_bucket 1 "$K_OURS" "${ADMIT_OURS[@]}")"
    R[rps_ours_deny]+=" $(rps EVALSHA "$SHA_TB" 1 "d$K_OURS" "${DENY_OURS[@]}")"
    R[rps_naive_deny]+=" $(rps EVALSHA "$SHA_NAIVE" 1 "d$K_NAIVE" "${DENY_NAIVE[@]}")"
    R[dirty_deny]+=" $(
        a=$(cli INFO persistence | grep rdb_changes_since_last_save | cut -d: -f2 | tr -d '\r')
        redis-benchmark -p "$PORT" -c 1 -n 1000 EVALSHA "$SHA_TB" 1 "d$K_OURS" "${DENY_OURS[@]}" >/dev/null
        b=$(cli INFO persistence | grep rdb_changes_since_last_save | cut -d: -f2 | tr -d '\r')
        echo $((b - a))
    )"

    # Sliding log: logs of 10 and 100,000 entries written in the script's
    # layout, all inside a one-hour window; limit 10^5 (admits, the log
    # grows by the calls) or exactly the log's total (denies).
    for n in 10 100000; do
        cli EVAL "
            local t = redis.call('TIME')
            local now = t[1] * 1000000 + t[2]
            local n = tonumber(ARGV[1])
            redis.call('DEL', KEYS[1], KEYS[1] .. ':c')
            redis.call('ZADD', KEYS[1] .. ':c', 0, 0)
            local i = 1
            while i <= n do
              local tz, cz = {}, {}
              for j = 1, 1000 do
                if i > n then break end
                tz[#tz + 1] = now - 1800000000 + i * 10000
                tz[#tz + 1] = i
                cz[#cz + 1] = i
                cz[#cz + 1] = i
                i = i + 1
              end
              redis.call('ZADD', KEYS[1], unpack(tz))
              redis.call('ZADD', KEYS[1] .. ':c', unpack(cz))
            end
            return n" 1 "log$n" "$n" >/dev/null
        if [ "$round" = 1 ] && [ "$n" = 100000 ]; then
            LOG_BYTES=$(cli MEMORY USAGE "log$n" SAMPLES 0)
            LOG_BYTES=$((LOG_BYTES + $(cli MEMORY USAGE "log$n:c" SAMPLES 0)))
        fi
        R[log_deny_$n]+=" $(per_call evalsha EVALSHA "$SHA_SL" 1 "log$n" "" 0 "$DL" 1 "$n" 3600000000)"
        R[log_admit_$n]+=" $(per_call evalsha EVALSHA "$SHA_SL" 1 "log$n" "" 0 "$DL" 1 100000 3600000000)"
    done
done

m() { echo "${R[$1]}" | median; }
echo "| measurement | per round | median |"
echo "|---|---|---:|"
for k in naive_admit ours_admit fcall_admit naive_deny ours_deny fcall_deny \
    rps_naive_admit rps_ours_admit rps_fcall_admit rps_naive_deny rps_ours_deny \
    dirty_deny log_admit_10 log_admit_100000 log_deny_10 log_deny_100000; do
    echo "| $k |${R[$k]} | $(m "$k") |"
done
echo
echo "| ratio (medians) | value |"
echo "|---|---:|"
echo "| server time, ours / naive, admitting | $(ratio "$(m ours_admit)" "$(m naive_admit)") |"
echo "| server time, ours / naive, denying | $(ratio "$(m ours_deny)" "$(m naive_deny)") |"
echo "| server time, FCALL / EVALSHA, admitting | $(ratio "$(m fcall_admit)" "$(m ours_admit)") |"
echo "| server time, FCALL / EVALSHA, denying | $(ratio "$(m fcall_deny)" "$(m ours_deny)") |"
echo "| throughput, ours / naive, admitting (-c 32) | $(ratio "$(m rps_ours_admit)" "$(m rps_naive_admit)") |"
echo "| throughput, ours / naive, denying (-c 32) | $(ratio "$(m rps_ours_deny)" "$(m rps_naive_deny)") |"
echo "| throughput, FCALL / EVALSHA, admitting (-c 32) | $(ratio "$(m rps_fcall_admit)" "$(m rps_ours_admit)") |"
echo "| sliding log, 100,000 / 10 entries, admitting | $(ratio "$(m log_admit_100000)" "$(m log_admit_10)") |"
echo "| sliding log, 100,000 / 10 entries, denying | $(ratio "$(m log_deny_100000)" "$(m log_deny_10)") |"

# Memory: 100,000 distinct callers, one decision each (1 per hour, burst
# 20: every key lives an hour), the same keys for both scripts.
mem() { cli INFO memory | grep '^used_memory:' | cut -d: -f2 | tr -d '\r'; }
cli FLUSHALL >/dev/null
bytes() { # <sha> <key suffix> <args...>
    local sha=$1 suffix=$2
    shift 2
    cli FLUSHALL >/dev/null
    local before keys
    before=$(mem)
    # __rand_int__ is 12 digits: keys as long as "api~customer-0000042".
    redis-benchmark -p "$PORT" -c 8 -n 400000 -r 100000 \
        EVALSHA "$sha" 1 "rl:{api~c-__rand_int__}:$suffix" "$@" >/dev/null
    keys=$(cli DBSIZE)
    awk -v a="$before" -v b="$(mem)" -v k="$keys" 'BEGIN {printf "%.1f (%d keys)", (b - a) / k, k}'
}
echo
echo "| layout | bytes per active caller |"
echo "|---|---:|"
echo "| ours, token bucket (one integer) | $(bytes "$SHA_TB" tb2 "${DENY_OURS[@]}") |"
echo "| naive hash-of-floats token bucket | $(bytes "$SHA_NAIVE" tb2 "${DENY_NAIVE[@]}") |"
echo
echo "sliding log of 100,000 entries: $LOG_BYTES bytes over its two sorted sets (MEMORY USAGE), $((LOG_BYTES / 100000)) per entry"
