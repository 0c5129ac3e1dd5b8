#!/usr/bin/env bash
# The server's CPU per script call as an instruction count: redis-server runs
# under callgrind, and for each contender the counters are zeroed, N calls
# are sent by redis-benchmark on one connection, and the counters dumped.
# Instruction counts do not depend on what else the machine runs, where the
# server's wall time per call (INFO commandstats) does.
#
# From the repository root:  bash benches/script_instructions.sh [N]
# Needs valgrind, redis-server 7, redis-benchmark, redis-cli.
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
# The quotas' own scripts, as the store sends a lone request (numbers
# compiled in, the cost the one argument): the admitting and the denying
# bucket below.
cargo run -q --release -p ratelimit-benches --bin script_source -- token_bucket 1 1 999999999 >"$SRC/own_admit.lua"
cargo run -q --release -p ratelimit-benches --bin script_source -- token_bucket 1 3600 20 >"$SRC/own_deny.lua"
N="${1:-5000}"

# redis-server under callgrind: PORT, DIR, VG, cli.
source benches/lib/callgrind_server.sh

OURS=$SRC/token_bucket.lua
NAIVE=benches/lua/naive_token_bucket.lua
PROTO=benches/lua/prototype_token_bucket_one_integer.lua
LOG=$SRC/sliding_log.lua
SHA_TB=$(cli SCRIPT LOAD "$(cat $OURS)")
SHA_NAIVE=$(cli SCRIPT LOAD "$(cat $NAIVE)")
SHA_PROTO=$(cli SCRIPT LOAD "$(cat $PROTO)")
SHA_LOG=$(cli SCRIPT LOAD "$(cat $LOG)")
SHA_MULTI=$(cli SCRIPT LOAD "$(cat $SRC/batch.lua)")
SHA_FW=$(cli SCRIPT LOAD "$(cat $SRC/fixed_window.lua)")
SHA_SW=$(cli SCRIPT LOAD "$(cat $SRC/sliding_window.lua)")
SHA_TRIVIAL=$(cli SCRIPT LOAD "return {1, 0, 0, -1}")
SHA_OWN_ADMIT=$(cli SCRIPT LOAD "$(cat $SRC/own_admit.lua)")
SHA_OWN_DENY=$(cli SCRIPT LOAD "$(cat $SRC/own_deny.lua)")
cli FUNCTION LOAD REPLACE "#!lua name=ratelimit_bench
local function token_bucket(KEYS, ARGV)
$(cat $OURS)
end
redis.register_function('rl_token_bucket', token_bucket)" >/dev/null

n=0
measure() { # <label> <command...>: instructions per call
    local label=$1
    shift
    n=$((n + 1))
    callgrind_control -z "$VG" >/dev/null
    redis-benchmark -p "$PORT" -c 1 -n "$N" "$@" >/dev/null
    callgrind_control -d "m$n" "$VG" >/dev/null
    sleep 1
    local f
    f=$(ls -t "$DIR"/cg.out.* | head -1)
    local total
    total=$(grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}')
    printf '| %s | %d |\n' "$label" $((total / N / ${PER:-1}))
}

ADMIT_OURS=("$DL" 1000000 1 999999999000000)
DENY_OURS=("$DL" 3600000000 1 72000000000)
ADMIT_PROTO=("" 0 1 1000000 1 999999999000000)
DENY_PROTO=("" 0 1 3600000000 1 72000000000)
ADMIT_NAIVE=(1 1000000000 1)
DENY_NAIVE=(0.0002777777777777778 20 1)
for _ in $(seq 30); do
    cli EVALSHA "$SHA_TB" 1 dk1 "${DENY_OURS[@]}" >/dev/null
    cli EVALSHA "$SHA_OWN_DENY" 1 dk4 "$DL" 1 >/dev/null
    cli EVALSHA "$SHA_PROTO" 1 dk2 "${DENY_PROTO[@]}" >/dev/null
    cli EVALSHA "$SHA_NAIVE" 1 dk3 "${DENY_NAIVE[@]}" >/dev/null
done
# Sliding logs of 10 and 100,000 entries in the script's layout.
for size in 10 100000 95000; do
    cli EVAL "
        local t = redis.call('TIME')
        local now = t[1] * 1000000 + t[2]
        local n = tonumber(ARGV[1])
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
        return n" 1 "log$size" "$size" >/dev/null
done

echo "| contender ($N calls each, one connection) | server instructions per call |"
echo "|---|---:|"
measure "PING (the floor of any command)" PING
measure "EVALSHA of a script returning {1, 0, 0, -1}" EVALSHA "$SHA_TRIVIAL" 0
measure "naive hash-of-floats token bucket, admitting" EVALSHA "$SHA_NAIVE" 1 k3 "${ADMIT_NAIVE[@]}"
measure "prototype one-integer token bucket, admitting" EVALSHA "$SHA_PROTO" 1 k2 "${ADMIT_PROTO[@]}"
measure "ours token bucket (tb2), the quota's own script (as the store sends it), admitting" EVALSHA "$SHA_OWN_ADMIT" 1 k4 "$DL" 1
measure "ours token bucket (tb2), EVALSHA, admitting" EVALSHA "$SHA_TB" 1 k1 "${ADMIT_OURS[@]}"
measure "ours token bucket (tb2), FCALL, admitting" FCALL rl_token_bucket 1 k1 "${ADMIT_OURS[@]}"
measure "naive hash-of-floats token bucket, denying" EVALSHA "$SHA_NAIVE" 1 dk3 "${DENY_NAIVE[@]}"
measure "prototype one-integer token bucket, denying" EVALSHA "$SHA_PROTO" 1 dk2 "${DENY_PROTO[@]}"
measure "ours token bucket (tb2), the quota's own script (as the store sends it), denying" EVALSHA "$SHA_OWN_DENY" 1 dk4 "$DL" 1
measure "ours token bucket (tb2), EVALSHA, denying" EVALSHA "$SHA_TB" 1 dk1 "${DENY_OURS[@]}"
measure "ours token bucket (tb2), FCALL, denying" FCALL rl_token_bucket 1 dk1 "${DENY_OURS[@]}"
measure "ours sliding log (sl2), 10 entries, denying" EVALSHA "$SHA_LOG" 1 log10 "$DL" 1 10 3600000000
measure "ours sliding log (sl2), 100,000 entries, denying" EVALSHA "$SHA_LOG" 1 log100000 "$DL" 1 100000 3600000000
measure "ours sliding log (sl2), 10 entries growing by the calls, admitting" EVALSHA "$SHA_LOG" 1 log10 "$DL" 1 100000 3600000000
measure "ours sliding log (sl2), 95,000 entries growing to 100,000, admitting" EVALSHA "$SHA_LOG" 1 log95000 "$DL" 1 100000 3600000000
# Several quotas in one call (issue 12): every call admitted, limits far
# above N; the 3 quotas are a fixed window, a sliding window counter and a
# token bucket, as in benches/multi_cost.sh.
TB_ARGS=(1 1 1000000000)
WIN_ARGS=(1 1000000000 1000000)
measure "single token bucket script (a 1-quota call)" EVALSHA "$SHA_TB" 1 "m:{c}:tb2" "$DL" "${TB_ARGS[@]}"
measure "single fixed window script" EVALSHA "$SHA_FW" 1 "m:{c}:fw" "$DL" "${WIN_ARGS[@]}"
measure "single sliding window script" EVALSHA "$SHA_SW" 1 "m:{c}:sw" "$DL" "${WIN_ARGS[@]}"
# Batch layout as the store sends it on the server's clock: min expiry, 1
# field per request (one quota set), the earliest deadline, keys distinct
# (1), 1 quota set (id 1, n quotas, 5 args per quota), then the requests'
# deadlines in one argument.
measure "batch script, the token bucket alone" EVALSHA "$SHA_MULTI" 1 "m:{c}:tb2" 0 1 "$DL" 1 1 1 1 4 0 "${TB_ARGS[@]}" "$DL"
measure "batch script, 3 quotas (a 3-quota call)" EVALSHA "$SHA_MULTI" 3 "m:{c}:fw" "m:{c}:sw" "m:{c}:tb2" 0 1 "$DL" 1 1 1 3 \
    1 0 "${WIN_ARGS[@]}" 2 0 "${WIN_ARGS[@]}" 4 0 "${TB_ARGS[@]}" "$DL"
# Batches as the store sends them on the server's clock (compact layout):
# B requests of B callers, each admitted; instructions per decision.
for B in 16 128; do
    BATCH_KEYS=() BATCH_DLS=""
    for i in $(seq "$B"); do
        BATCH_KEYS+=("rl:{caller-$B-$i}:tb2")
        BATCH_DLS="${BATCH_DLS:+$BATCH_DLS }$DL"
    done
    PER=$B measure "batch script, $B requests of one quota each, per decision" EVALSHA "$SHA_MULTI" "$B" \
        "${BATCH_KEYS[@]}" 0 1 "$DL" 1 1 1 1 4 0 "${TB_ARGS[@]}" "$BATCH_DLS"
done
