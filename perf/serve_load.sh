#!/bin/sh
# `k3flow serve` under load, on loopback: the embedded tiny model (resident) and a synthetic
# checkpoint streamed within a budget. Each run starts the server on a free port, waits for
# /health, runs perf/serve_load.py (bounded: CLIENTS x REQUESTS streamed completions of TOKENS
# tokens), then stops the server with SIGTERM. Results: OUT/*.json and one summary line per run.
#
#   perf/serve_load.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, out/serve_load)
#   CLIENTS=4 REQUESTS=8 TOKENS=32 MAX_SEQS=4 SERVE_FLAGS="--prefill separate" perf/serve_load.sh
#   RANKS=2 perf/serve_load.sh   (under `mpirun --oversubscribe -np 2`: rank 0 serves, and is the one
#                                 measured and sent SIGTERM; as root also export OMPI_ALLOW_RUN_AS_ROOT=1
#                                 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
set -eu
BUILD=${1:-build}
OUT=${2:-out/serve_load}
CLIENTS=${CLIENTS:-4}
REQUESTS=${REQUESTS:-8}
TOKENS=${TOKENS:-32}
MAX_SEQS=${MAX_SEQS:-4}
SERVE_FLAGS=${SERVE_FLAGS:-}  # more serve flags for both runs (e.g. --prefill, --prefill-chunk)
RANKS=${RANKS:-1}             # > 1: every run under mpirun -np RANKS (docs/serve.md)
LAUNCH=
[ "$RANKS" -gt 1 ] && LAUNCH="mpirun --oversubscribe -np $RANKS"
HERE=$(dirname "$0")
mkdir -p "$OUT"
K3=$BUILD/k3flow

run() {  # NAME MODEL_DIR [serve flags...]
  name=$1 model=$2
  shift 2
  log="$OUT/$name.server.log"
  # shellcheck disable=SC2086 # SERVE_FLAGS and LAUNCH are lists of words
  $LAUNCH "$K3" serve "$model" --port 0 --max-seqs "$MAX_SEQS" --queue 64 --no-progress "$@" $SERVE_FLAGS >"$OUT/$name.listen" 2>"$log" &
  pid=$!
  port=
  for _ in $(seq 600); do
    port=$(sed -n 's/^listening on http:\/\/127.0.0.1:\([0-9]*\)$/\1/p' "$OUT/$name.listen")
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "serve did not listen: $(cat "$log")"; kill "$pid"; exit 1; }
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.1
  done
  server=$pid  # the process that serves: under mpirun rank 0, whose pid its log names
  [ "$RANKS" -gt 1 ] && server=$(sed -n 's/.*rank 0 of [0-9]* (pid \([0-9]*\)).*/\1/p' "$log")
  echo "== $name: $model $* $SERVE_FLAGS (max-seqs $MAX_SEQS, ranks $RANKS; $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
  status=0
  timeout 1800 python3 "$HERE/serve_load.py" --port "$port" --pid "$server" --clients "$CLIENTS" \
    --requests "$REQUESTS" --max-tokens "$TOKENS" --json "$OUT/$name.json" || status=$?
  curl -s "http://127.0.0.1:$port/metrics" >"$OUT/$name.metrics.txt"
  kill -TERM "$server"
  wait "$pid" || { echo "serve exited $?"; status=1; }
  return $status
}

run tiny fixtures/tiny-k3
SYNTH=$OUT/synth-small
[ -f "$SYNTH/config.json" ] || "$K3" synth "$SYNTH" --size tiny --layers 8 --shards 3 --seed 4 >/dev/null
run synth-streamed "$SYNTH" --mem-gb 0.02 --context 256
