#!/usr/bin/env bash
# Measures everything BENCHMARKS.md reports, then writes BENCHMARKS.md and
# docs/benchmarks.svg from the results. From the repository root:
#
#   bash benches/run.sh            # every benchmark, 3 runs of each
#   RUNS=1 bash benches/run.sh     # one run of each
#
# Run it on a quiet machine: the figures are only as good as the machine is
# still. Needs redis-server, redis-cli and redis-benchmark (Debian:
# redis-server, redis-tools), valgrind, wrk and taskset (util-linux); the
# peers' script fetches redis-cell's and Limitador's sources with cargo. The
# service's comparison runs throttlecrab-server and Limitador's server when
# THROTTLECRAB_SERVER and LIMITADOR_SERVER name their binaries (how to build
# them: ratelimit-server/benches/loadgen.rs), and without them otherwise.
#
# Output: target/bench-results/*.md (one file per benchmark, as each program
# prints it), then BENCHMARKS.md and docs/benchmarks.svg, assembled from
# those files by `cargo run -p ratelimit-benches --bin bench_page`, which can
# also be run again on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-3}"
OUT=target/bench-results
mkdir -p "$OUT"

# The machine, stated once in the page.
{
    echo "cpu: $(nproc) vCPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1) (family $(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1), model $(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -1))"
    echo "memory: $(awk '/^MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "software: $(rustc --version | cut -d' ' -f1-2), $(redis-server --version | cut -d' ' -f1-3)"
    echo "load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.md"

# In process. The local store against governor and throttlecrab, every
# contender in turn in short slices (interleaved), RUNS runs.
for i in $(seq 1 "$RUNS"); do
    LOCAL_INTERLEAVED=1 cargo bench -p ratelimit-benches --bench local | tee "$OUT/local-interleaved-run$i.md"
done
# The core model's step (criterion, RUNS runs saved as baselines), medians.
baselines=()
for i in $(seq 1 "$RUNS"); do
    cargo bench -p ratelimit-benches --bench local -- model_step --save-baseline "run$i"
    baselines+=("run$i")
done
cargo run -q --release -p ratelimit-benches --bin bench_report -- \
    --dir "${CARGO_TARGET_DIR:-target}/criterion" "${baselines[@]}" | tee "$OUT/local.md"
cargo bench -p ratelimit-benches --bench local_memory | tee "$OUT/local_memory.md"
# Several quotas per call on the local store (1, 2, 3 quotas).
cargo bench -p ratelimit-benches --bench multi_quota | tee "$OUT/multi_quota.txt"
# The local store's sweep: decision latency while 200,000 callers expire
# (exits with status 1 when the p99.9 goal is missed; the table is kept).
cargo run -q --release -p ratelimit-benches --bin sweep_latency -- --rounds "$RUNS" \
    | tee "$OUT/sweep_latency.md" || echo "sweep_latency: goal missed, see $OUT/sweep_latency.md"
# Instructions per decision, in process and on a Redis decision's client
# side (callgrind; deterministic where wall time is not).
bash benches/instructions.sh | tee "$OUT/instructions.md"

# Redis scripts: server time per call through the store's real calls, ours
# against the naive script, sliding log cost against its length, the batch
# script per decision (starts its own redis-server).
cargo run -q --release -p ratelimit-benches --bin script_cost -- --rounds "$RUNS" | tee "$OUT/script_cost.md"
bash benches/multi_cost.sh "$RUNS" | tee "$OUT/multi_cost.md"
# The same contenders as server instructions per call (callgrind).
bash benches/script_instructions.sh 5000 | grep '^|' | tee "$OUT/script_instructions.md"
# Bytes per active caller in Redis (a fresh redis-server per layout).
cargo run -q --release -p ratelimit-benches --features fred --bin redis_load -- \
    --skip-throughput --skip-overhead | tee "$OUT/redis_memory.md"
# A Redis decision's client side: the store and the limiter over the bare
# EVALSHA of the same script on the same client and connection. One
# caller, the client and its redis-server on one CPU (so no wake-up crosses
# CPUs); then 32 callers over 4 connections, unpinned.
cargo build -q --release -p ratelimit-benches --features fred --bin redis_load
taskset -c 0 cargo run -q --release -p ratelimit-benches --features fred --bin redis_load -- \
    --runs "$RUNS" --seconds 10 --skip-memory --skip-overhead --ratio-only --tasks 1 --connections 1 \
    | tee "$OUT/client_side.md"
cargo run -q --release -p ratelimit-benches --features fred --bin redis_load -- \
    --runs 1 --seconds 10 --skip-memory --skip-overhead --ratio-only | tee "$OUT/client_side_concurrent.md"

# Peers on one redis-server: ours (batched and single), the naive script,
# redis-cell, Limitador (builds redis-cell's module and its own workspace).
benches/peers/run.sh --runs "$RUNS" | tee "$OUT/peers.md"
benches/peers/run.sh --runs "$RUNS" --pin | tee "$OUT/peers_pinned.md"

# Under load and under faults: two example servers under wrk, a cluster
# master killed (thousands of callers on one Redis: overload, below).
# Every section starts its own servers.
cargo build -q --release -p ratelimit-examples --bin server
cargo run -q --release -p ratelimit-benches --features fred --bin under_faults -- \
    --runs "$RUNS" --only servers --only cluster | tee "$OUT/under_faults.md"
# A dead Redis and its restart, both clients (starts its own redis-server).
cargo run -q --release -p ratelimit-benches --features fred --bin dead_redis -- --runs 5 | tee "$OUT/dead_redis.md"

# Overload: the store's capacity, arrivals at multiples of it (open loop)
# and 256 / 4,096 callers (closed loop), with both clients, on a quiet host
# (the server sharing the load's CPUs, then on a CPU of its own) and beside
# two spinning processes; then two service instances taking
# bursts beside one spinning process per CPU.
cargo run -q --release -p ratelimit-benches --features fred --bin overload -- \
    --runs "$RUNS" | tee "$OUT/overload.md"
cargo run -q --release -p ratelimit-benches --features fred --bin overload -- \
    --runs "$RUNS" --server-cpu 1 | tee "$OUT/overload_pinned.md"
cargo run -q --release -p ratelimit-benches --features fred --bin overload -- \
    --runs "$RUNS" --busy 2 | tee "$OUT/overload_busy.md"
cargo bench -p ratelimit-server --bench bursts | tee "$OUT/bursts.md"

# The production controls: the deny cache in a retry storm and acquire
# across two processes, on a redis-server of their own.
redis-server --port 6399 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes
cargo run -q --release -p ratelimit-examples --bin retry_storm -- --redis redis://127.0.0.1:6399/ | tee "$OUT/retry_storm.md"
cargo run -q --release -p ratelimit-examples --bin workers -- --redis redis://127.0.0.1:6399/ | tee "$OUT/workers.md"
redis-cli -p 6399 shutdown nosave || true

# The service against throttlecrab-server and Limitador's server under the
# same gRPC load (closed and open loop; local, Redis and cluster backends).
cargo bench -p ratelimit-server --bench loadgen -- --rounds "$RUNS" | tee "$OUT/server.md"

# TLS against plain text: the handshake and a decision's cost.
cargo run -q --release -p ratelimit-benches --bin tls_cost -- --runs 5 --seconds 3 | tee "$OUT/tls_cost.md"

echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.md"
cargo run -q --release -p ratelimit-benches --bin bench_page -- --results "$OUT"
