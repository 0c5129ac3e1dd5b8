#!/usr/bin/env bash
# Reproduces every table of BENCHMARKS.md. From the repository root:
#
#   bash benches/run.sh            # everything (about 25 minutes on 2 cores)
#   RUNS=1 bash benches/run.sh     # one run of each (about 10 minutes)
#
# Needs redis-server, redis-cli and redis-benchmark (Debian: redis-server,
# redis-tools). Output: target/bench-results/*.md
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-3}"
OUT=target/bench-results
mkdir -p "$OUT"

# In-process: criterion, RUNS runs saved as baselines run1..runN, then the
# medians and same-run ratios.
baselines=()
for i in $(seq 1 "$RUNS"); do
    cargo bench -p ratelimit-benches --bench local -- --save-baseline "run$i" | tee "$OUT/local-run$i.txt"
    baselines+=("run$i")
done
cargo run -q --release -p ratelimit-benches --bin bench_report -- "${baselines[@]}" | tee "$OUT/local.md"
cargo bench -p ratelimit-benches --bench local_memory | tee "$OUT/local_memory.md"

# Redis scripts: server time per call through the store's real calls, ours
# against the naive script, sliding log cost against its length, the batch
# script per decision (starts its own redis-server).
cargo run -q --release -p ratelimit-benches --bin script_cost -- --rounds "$RUNS" | tee "$OUT/script_cost.md"
bash benches/multi_cost.sh "$RUNS" | tee "$OUT/multi_cost.md"
# The same contenders as server instructions per call (callgrind; needs
# valgrind): deterministic where the server's wall time is not.
bash benches/script_instructions.sh 5000 | grep '^|' | tee "$OUT/script_instructions.md"

# Redis: one process starts its own servers; RUNS runs of load and overhead.
cargo run -q --release -p ratelimit-benches --features fred --bin redis_load -- \
    --runs "$RUNS" --cluster | tee "$OUT/redis.md"

# Peers on one redis-server: ours (batched and single), the naive script,
# redis-cell, Limitador (builds redis-cell's module and its own workspace).
benches/peers/run.sh --runs "$RUNS" | tee "$OUT/peers.md"
benches/peers/run.sh --runs "$RUNS" --pin | tee "$OUT/peers_pinned.md"

# The failure path: a dead Redis with and without the circuit breaker, and
# the recovery once it is back (starts its own redis-server).
cargo run -q --release -p ratelimit-benches --bin dead_redis | tee "$OUT/dead_redis.md"
# The local store's sweep: decision latency while 200,000 callers expire
# (exits with status 1 when the p99.9 goal is missed; the table is kept).
cargo run -q --release -p ratelimit-benches --bin sweep_latency -- --rounds "$RUNS" \
    | tee "$OUT/sweep_latency.md" || echo "sweep_latency: goal missed, see $OUT/sweep_latency.md"
# The deny cache in a retry storm and acquire across two processes, on a
# redis-server of their own.
redis-server --port 6399 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes
cargo run -q --release -p ratelimit-examples --bin retry_storm -- --redis redis://127.0.0.1:6399/ | tee "$OUT/retry_storm.md"
cargo run -q --release -p ratelimit-examples --bin workers -- --redis redis://127.0.0.1:6399/ | tee "$OUT/workers.md"
redis-cli -p 6399 shutdown nosave || true
# Several quotas per call on the local store (1, 2, 3 quotas).
cargo bench -p ratelimit-benches --bench multi_quota | tee "$OUT/multi_quota.txt"
