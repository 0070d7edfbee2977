#!/bin/bash
# Issue 13 side by side: the C reference engine (kimi-k3-in-c) and k3flow on the peer checkpoint
# (perf/peer_profile.sh writes it), alternating C, k3flow, C, k3flow, ... for ROUNDS rounds with the
# same 16 prompt ids, GEN greedy tokens and THREADS compute threads, the page cache dropped before
# every run. Per run: s/token over the decode steps (step 0, the prefill, left out), peak RSS (the
# kernel's, from /usr/bin/time -f %M, and the engine's own figure), bytes read, generated ids and the
# 1-minute load; then min and median per engine and the ratio k3flow/C of the medians. Fails (exit 3)
# if the two engines emit different ids: a speed figure for a different answer is worth nothing.
#
#   perf/peer_vs_c.sh C_ENGINE_DIR K3FLOW_BINARY [WORK_DIR]      (WORK_DIR default out/peer)
#
# WORK_DIR holds model/ and trunk/ as peer_profile.sh leaves them; the C engine's own packed trunk
# goes to C_PACK (default C_ENGINE_DIR/pack, ~6.4 GB) and is written once if missing. Before each
# round `k3flow probe` measures the device's sequential read ceiling on k3flow's trunk (PROBE_SECONDS,
# default 2), so every round's figures are read beside the disk they ran on.
# Environment: ROUNDS (3), GEN (12), THREADS (2), MEM_GB (1.34, k3flow's budget in GiB), STRATEGY
# (overlap), K3_TRUNK (k3flow's packed trunk, default WORK_DIR/trunk; e.g. an exp3 one written by
# `k3flow pack-trunk MODEL DIR --codec exp3`), PROBE_SECONDS (2),
# C_TRUNK_GB (0.51) and C_CACHE_GB (0.1) -- the C engine's two budgets, in 1e9 bytes --,
# C_PACK, OUT (WORK_DIR/peer-vs-c-<utc time>), C_ENV (environment assignments for the C engine's
# runs only, e.g. C_ENV="OMP_WAIT_POLICY=passive"; default none), READ_CAP (bytes a second: every
# run and probe reads the disk under WORK_DIR/model through perf/read_cap.sh at that cap, a slow
# device on demand -- keep C_PACK on the same disk; needs root; default none, the device as it is).
#
# On a host whose 2 cores carry other tenants' load, the C engine's libgomp threads spin while they
# wait (OMP_WAIT_POLICY unset: 2 compute threads plus its 4 expert-read threads) and lose the cores
# they spin on: measured at load 10-13, its decode took 9.2-10.6 s/token by default and 3.1 s/token
# with C_ENV="OMP_WAIT_POLICY=passive", the same ids either way. Quote both when the host is busy.
#
# How the C engine was obtained and built (2026-12-01, commit 01a7334ad58530fd3178f883582afd0717550b6f
# of github.com/Speedstu/kimi-k3-in-c, a fork extending its v1.0.0), into a folder $CREF:
#   git clone https://github.com/Speedstu/kimi-k3-in-c $CREF      (or `git archive HEAD | tar -x`)
#   make -C $CREF -j2 bin/k3       # its Makefile: cc -O3 -std=gnu99 -march=native -fopenmp
#                                       # -pthread -ffp-contract=off, libm + libgomp, no other deps
#   python3 $CREF/tools/pack_trunk.py MODEL $CREF/pack 26    # stdlib only; this script
#                                       # runs the same command when C_PACK/trunk.json is missing
# Its run, per its README (`k3 --help`): `bin/k3 MODEL --trunk PACK --trunk-gb X --cache-gb Y
# --threads N --incremental --ids ... --gen N --out run.json` (greedy is its default, temperature 0).
# Memory: --trunk-gb 0.51 is the smallest trunk budget that gives it two ring slots (read/compute
# overlap): layer 0 (0.447 GB, the dense one) takes the whole 0.509 GB arena, then layers 1..25
# (<= 0.254 GB) share it as two slots. With 0.763 GB of resident embed + lm_head and a 0.1 GB expert
# cache (14 slots x 6.69 MB) its peak RSS is ~1.41-1.44 GB, k3flow's at --mem-gb 1.34 is ~1.43 GB.
# Its expert-read team (K3_ASYNC_IO_THREADS, default 4) is left at the default.
set -euo pipefail

usage() { echo "usage: perf/peer_vs_c.sh C_ENGINE_DIR K3FLOW_BINARY [WORK_DIR]" >&2; exit 2; }
[ $# -ge 2 ] || usage
CDIR=$(realpath "$1")
K3FLOW=$(realpath "$2")
WORK=$(realpath "${3:-out/peer}")
ROUNDS=${ROUNDS:-3}
GEN=${GEN:-12}
THREADS=${THREADS:-2}
MEM_GB=${MEM_GB:-1.34}
STRATEGY=${STRATEGY:-overlap}
C_TRUNK_GB=${C_TRUNK_GB:-0.51}
C_CACHE_GB=${C_CACHE_GB:-0.1}
C_PACK=${C_PACK:-$CDIR/pack}
C_ENV=${C_ENV:-}
READ_CAP=${READ_CAP:-}
PROBE_SECONDS=${PROBE_SECONDS:-2}
OUT=${OUT:-$WORK/peer-vs-c-$(date -u +%Y%m%dT%H%M%SZ)}
# 16 prompt ids, the same as perf/peer_profile.sh.
IDS=1008,10484,318,15383,387,2029,11,581,7245,9909,13,4711,300,25,1999,42

CBIN=$CDIR/bin/k3
MODEL=$WORK/model
TRUNK=$(realpath -m "${K3_TRUNK:-$WORK/trunk}")
[ -x "$CBIN" ] || { echo "peer_vs_c.sh: no C engine binary at $CBIN (make -C $CDIR bin/k3)" >&2; exit 2; }
[ -x "$K3FLOW" ] || { echo "peer_vs_c.sh: no k3flow binary at $K3FLOW" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "peer_vs_c.sh: no checkpoint at $MODEL (run perf/peer_profile.sh $WORK)" >&2; exit 2; }
[ -f "$TRUNK/trunk.json" ] || { echo "peer_vs_c.sh: no k3flow trunk at $TRUNK (run perf/peer_profile.sh $WORK, or give K3_TRUNK a packed trunk)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "peer_vs_c.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }
if [ ! -f "$C_PACK/trunk.json" ]; then
  layers=$(/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config", c)["num_hidden_layers"])' "$MODEL/config.json")
  python3 "$CDIR/tools/pack_trunk.py" "$MODEL" "$C_PACK" "$layers"
fi
# With READ_CAP, each engine and probe runs under the capped disk (perf/read_cap.sh checks the cap).
CAP=()
[ -z "$READ_CAP" ] || CAP=("$(dirname "$(realpath "$0")")/read_cap.sh" "$READ_CAP" "$MODEL" --)
mkdir -p "$OUT"

# Every run starts from a cold page cache; both engines read with O_DIRECT anyway, but the
# shards' headers and the tokenizer-free start-up are buffered reads.
drop_cache() {
  if sync && (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo dropped; else echo refused; fi
}

run_c() {  # $1 = run tag
  local tag=$1
  echo "$(drop_cache) $(cut -d' ' -f1 /proc/loadavg)" > "$OUT/$tag.pre"
  # shellcheck disable=SC2086  # C_ENV is a list of NAME=VALUE words
  ( cd "$OUT" && /usr/bin/time -o "$tag.time" -f %M "${CAP[@]}" env $C_ENV "$CBIN" "$MODEL" --trunk "$C_PACK" \
      --trunk-gb "$C_TRUNK_GB" --cache-gb "$C_CACHE_GB" --threads "$THREADS" --incremental \
      --ids "$IDS" --gen "$GEN" --out "$tag.json" > "$tag.log" 2>&1 ) \
    || { echo "peer_vs_c.sh: C engine failed, see $OUT/$tag.log" >&2; exit 1; }
  echo "$tag (C): $(grep -m1 'tokens in' "$OUT/$tag.log")"
}

run_k3flow() {
  local tag=$1
  echo "$(drop_cache) $(cut -d' ' -f1 /proc/loadavg)" > "$OUT/$tag.pre"
  /usr/bin/time -o "$OUT/$tag.time" -f %M "${CAP[@]}" "$K3FLOW" generate "$MODEL" --trunk "$TRUNK" \
      --mem-gb "$MEM_GB" --threads "$THREADS" --ids "$IDS" --gen "$GEN" --strategy "$STRATEGY" \
      --no-progress --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1 \
    || { echo "peer_vs_c.sh: k3flow failed, see $OUT/$tag.log" >&2; exit 1; }
  echo "$tag (k3flow): $(grep -m1 'tokens in' "$OUT/$tag.log")"
}

# The device's sequential read ceiling now (GB/s), from k3flow's own probe of its trunk.
probe_device() {
  local tag=$1
  "${CAP[@]}" "$K3FLOW" probe "$MODEL" --trunk "$TRUNK" --seconds "$PROBE_SECONDS" --cpu-threads 0 --json \
      > "$OUT/$tag.probe.json" 2> "$OUT/$tag.probe.log" \
    || { echo "peer_vs_c.sh: k3flow probe failed, see $OUT/$tag.probe.log" >&2; exit 1; }
  echo "$tag: device ceiling $(/usr/bin/python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["ceiling"]["sequential"]["gbps"], 2))' "$OUT/$tag.probe.json") GB/s sequential"
}

echo "C engine: ${C_ENV:+$C_ENV }$CBIN --trunk $C_PACK --trunk-gb $C_TRUNK_GB --cache-gb $C_CACHE_GB"
echo "k3flow:   $K3FLOW --trunk $TRUNK --mem-gb $MEM_GB --strategy $STRATEGY"
echo "$ROUNDS rounds, $GEN tokens, $THREADS threads; logs in $OUT"
if [ -n "$READ_CAP" ]; then
  echo "$READ_CAP" > "$OUT/read_cap"
  echo "reads capped at $READ_CAP bytes/s (perf/read_cap.sh)"
fi
for r in $(seq 1 "$ROUNDS"); do
  probe_device "r$r"
  run_c "c$r"
  run_k3flow "k$r"
done

/usr/bin/python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def pre(tag):
    cache, load = open(f"{out}/{tag}.pre").read().split()
    return cache, float(load)

def c_run(tag):
    log = open(f"{out}/{tag}.log").read()
    # The step table: STEP TOKEN SECONDS CACHE-HIT READ-GB TOK/S, one line per token.
    steps = [(int(m[1]), int(m[2]), float(m[3]))
             for m in re.finditer(r"^(\d+)\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s*$", log, re.M)]
    trunk = re.search(r"^trunk \[final\].*?^\s+read ([\d.]+) GB", log, re.M | re.S)
    experts = re.search(r"experts, whole run: ([\d.]+) GB read", log)
    own_rss = re.search(r"PEAK RSS for the whole run: ([\d.]+) GB", log)
    ids = json.load(open(f"{out}/{tag}.json"))["generated_ids"]
    return dict(step_s=[s for _, _, s in steps], ids=ids,
                read_gb=float(trunk[1]) + float(experts[1]) if trunk and experts else float("nan"),
                own_rss_gb=float(own_rss[1]) if own_rss else float("nan"))

def k_run(tag):
    d = json.load(open(f"{out}/{tag}.json"))
    return dict(step_s=[t["wall_seconds"] for t in d["tokens"]], ids=d["generated_ids"],
                read_gb=(d["trunk_bytes_read"] + d["expert_bytes_read"]) / 1e9,
                own_rss_gb=d["peak_rss_bytes"] / 1e9)

rows = []
for r in range(1, rounds + 1):
    for engine, tag, f in (("C", f"c{r}", c_run), ("k3flow", f"k{r}", k_run)):
        x = f(tag)
        x["engine"], x["tag"] = engine, tag
        x["cache"], x["load"] = pre(tag)
        x["device"] = json.load(open(f"{out}/r{r}.probe.json"))["ceiling"]["sequential"]["gbps"]
        x["rss_gb"] = int(open(f"{out}/{tag}.time").read().split()[-1]) * 1024 / 1e9
        decode = x["step_s"][1:]
        x["s_tok"] = sum(decode) / len(decode) if decode else float("nan")
        x["prefill"] = x["step_s"][0] if x["step_s"] else float("nan")
        rows.append(x)

print(f"\n{'run':<4} {'engine':<7} {'load1':>6} {'device GB/s':>11} {'cache':>8} {'prefill s':>10} {'s/token':>8} "
      f"{'peak RSS GB':>12} {'(own)':>6} {'read GB':>8}  ids")
ref = rows[0]["ids"]
for x in rows:
    same = "same" if x["ids"] == ref else "DIFFERENT"
    print(f"{x['tag']:<4} {x['engine']:<7} {x['load']:6.2f} {x['device']:11.2f} {x['cache']:>8} {x['prefill']:10.2f} "
          f"{x['s_tok']:8.3f} {x['rss_gb']:12.3f} {x['own_rss_gb']:6.2f} {x['read_gb']:8.2f}  {same}")
print("ids:", " ".join(map(str, ref)))

print(f"\n{'engine':<7} {'s/token min':>12} {'median':>8} {'peak RSS GB max':>16} {'load1 median':>13} "
      f"{'read GB median':>15}")
med = {}
for engine in ("C", "k3flow"):
    xs = [x for x in rows if x["engine"] == engine]
    s = [x["s_tok"] for x in xs]
    med[engine] = statistics.median(s)
    print(f"{engine:<7} {min(s):12.3f} {med[engine]:8.3f} {max(x['rss_gb'] for x in xs):16.3f} "
          f"{statistics.median(x['load'] for x in xs):13.2f} {statistics.median(x['read_gb'] for x in xs):15.2f}")
dev = [x["device"] for x in rows if x["engine"] == "C"]
cap = f"{out}/read_cap"
cap = f", reads capped at {int(open(cap).read()) / 1e9:.2f} GB/s" if os.path.exists(cap) else ""
print(f"device ceiling over the rounds: {min(dev):.2f}-{max(dev):.2f} GB/s sequential (k3flow probe){cap}")
mins = {e: min(x["s_tok"] for x in rows if x["engine"] == e) for e in ("C", "k3flow")}
print(f"k3flow/C s/token: {med['k3flow'] / med['C']:.3f} (medians), {mins['k3flow'] / mins['C']:.3f} (mins); "
      "issue 13 asks <= 0.7")
if any(x["ids"] != ref for x in rows):
    print("the engines' ids DIFFER: the timing compares two different answers", file=sys.stderr)
    sys.exit(3)
PY
