# Sourced by the instruction-count benches: starts redis-server under
# callgrind on a free loopback port and waits for it. Sets PORT, DIR (the
# server's directory, where callgrind writes cg.out.*), VG (valgrind's pid)
# and cli (redis-cli on that port); on exit the server is stopped and DIR
# and $SRC (if set) are removed.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$DIR/cg.out" \
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
    >"$DIR/server.log" 2>&1 &
VG=$!
trap 'kill "$VG" 2>/dev/null; rm -rf "$DIR" ${SRC:+"$SRC"}' EXIT
cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 300); do cli ping >/dev/null 2>&1 && break; sleep 0.2; done
