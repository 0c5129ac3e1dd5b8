#!/usr/bin/env bash
# Instructions per decision, counted by callgrind: deterministic where wall
# time is not (the count does not depend on what else the machine runs).
#
#   1. In process (benches/examples/local_profile.rs): governor's
#      `check_key`, the local store's fastest path (`decide_now`), a
#      decision through the one door (`dyn Store`), and `Limiter::check`
#      (taken with `into_ready`, and awaited in a task), on one hot key, for
#      the sold plan (100 per minute, burst 20: mostly denials) and for a
#      bucket that admits everything (1e9 per second, burst 1000). Only the
#      measured loop is counted (`--toggle-collect`; the whole program for
#      the awaited check), and the count is the difference of a run of N1
#      and one of N2 decisions over N2 - N1, so what runs once (the set-up,
#      the clock's first catch-up) cancels out.
#   2. A Redis decision's client side (benches/examples/redis_profile.rs):
#      the bare EVALSHA of the quota's own script, `RedisStore`, and
#      `Limiter::check` over it, sequential calls on one connection, with
#      redis-rs and with fred; the client process only (callgrind does not
#      follow the redis-server it starts), runs of C1 and C2 calls
#      differenced the same way.
#
# From the repository root:  bash benches/instructions.sh
# Prints two markdown tables. Needs valgrind and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
N1=200000 N2=1200000
C1=2000 C2=6000
target="${CARGO_TARGET_DIR:-target}"
cargo build -q --release -p ratelimit-benches --features fred --example local_profile --example redis_profile
bin="$target/release/examples"
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

total() { # <callgrind output file>: the instructions it counted
    grep -E '^(summary|totals):' "$1" | head -1 | awk '{print $2}'
}
# One run of a program under callgrind: <count> <valgrind option...> --
# <program and arguments, `@N@` standing for the count>; prints the
# instructions counted.
counted() {
    local n=$1
    shift
    local opts=() args=()
    while [ "$1" != "--" ]; do opts+=("$1"); shift; done
    shift
    for a in "$@"; do args+=("${a//@N@/$n}"); done
    valgrind --tool=callgrind "${opts[@]}" --callgrind-out-file="$DIR/out" "${args[@]}" >/dev/null 2>&1
    total "$DIR/out"
}
# <n1> <n2> <as for counted...>: instructions per call, from two runs.
per_call() {
    local n1=$1 n2=$2 a b
    shift 2
    a=$(counted "$n1" "$@")
    b=$(counted "$n2" "$@")
    echo $(((b - a) / (n2 - n1)))
}
local_row() { # <label> <local_profile mode> [whole]
    # Only the measured loop is counted, except with `whole`: the awaited
    # check's loop runs inside the runtime's poll, which the toggle does
    # not catch, so the whole program is counted (the differencing still
    # takes the set-up out).
    local plan admit toggle=(--toggle-collect='*measured*')
    [ "${3:-}" = whole ] && toggle=()
    plan=$(per_call "$N1" "$N2" "${toggle[@]}" -- "$bin/local_profile" "$2" 1 @N@ plan)
    admit=$(per_call "$N1" "$N2" "${toggle[@]}" -- "$bin/local_profile" "$2" 1 @N@)
    printf '| %s | %s | %s |\n' "$1" "$plan" "$admit"
}

echo "| contender | hot key, 100/min burst 20 | hot key, 1e9/s burst 1000 |"
echo "|---|---:|---:|"
local_row "governor \`check_key\`" governor
local_row "fastest path (\`LocalStore::decide_now\`)" sync
local_row "\`dyn Store\` decide" store
local_row "\`Limiter::check\`, \`into_ready\`" limiter_ready
local_row "\`Limiter::check\`, awaited in a task" limiter whole
echo
echo "| client | bare \`EVALSHA\` | \`RedisStore\` | \`Limiter::check\` |"
echo "|---|---:|---:|---:|"
for client in redis-rs fred; do
    prefix=""
    [ "$client" = fred ] && prefix="fred-"
    bare=$(per_call "$C1" "$C2" -- "$bin/redis_profile" "${prefix}bare" @N@)
    store=$(per_call "$C1" "$C2" -- "$bin/redis_profile" "${prefix}store" @N@)
    limiter=$(per_call "$C1" "$C2" -- "$bin/redis_profile" "${prefix}limiter" @N@)
    printf '| %s | %s | %s | %s |\n' "$client" "$bare" "$store" "$limiter"
done
