#!/bin/bash
# The peer profile of issue 13: the checkpoint the C reference engine (kimi-k3-in-c) was measured on
# side by side with k3flow -- hidden 4096, 26 layers (19 KDA with 32 x 128 heads, 7 MLA: every 4th
# layer and the last), bf16 trunk, 8 MXFP4 experts top-2, latent 2048 -- written by `k3flow synth`,
# packed (`k3flow pack-trunk`) and benched at 1.34 GiB (~1.44 GB), 2 threads, a 16-id prompt and 12
# tokens. Prints, per strategy, s/token, bytes read per token, the engine's effective read rate and
# the device ceiling measured in the same run (`k3flow bench`, pipeline/bench/device_probe.*).
#
#   perf/peer_profile.sh [WORK_DIR]          (default out/peer; ~17 GB of disk: model + trunk)
#
# Environment: K3FLOW (default build/k3flow), MEM_GB (1.34), THREADS (2), GEN (12), REPEAT (3),
# STRATEGY (serial,trunk,overlap,lookahead,auto), PROBE_SECONDS (3), and any K3FLOW_TRUNK_* reader
# override (pipeline/graph/reader_options.hpp) for A/B runs. Exit status: the bench's.
set -euo pipefail

K3FLOW=${K3FLOW:-build/k3flow}
WORK=${1:-out/peer}
MEM_GB=${MEM_GB:-1.34}
THREADS=${THREADS:-2}
GEN=${GEN:-12}
REPEAT=${REPEAT:-3}
STRATEGY=${STRATEGY:-serial,trunk,overlap,lookahead,auto}
PROBE_SECONDS=${PROBE_SECONDS:-3}
# 16 prompt ids, the same in every engine's run.
IDS=1008,10484,318,15383,387,2029,11,581,7245,9909,13,4711,300,25,1999,42

[ -x "$K3FLOW" ] || { echo "peer_profile.sh: no k3flow binary at $K3FLOW (set K3FLOW)" >&2; exit 2; }
mkdir -p "$WORK"
MODEL=$WORK/model
TRUNK=$WORK/trunk

# The checkpoint: synth's dense layout with the peer's dimensions. MLA placement is synth's default
# for 26 layers (4,8,...,24 and 26, one-based): 7 MLA, 19 KDA.
if [ ! -f "$MODEL/config.json" ]; then
  "$K3FLOW" synth "$MODEL" --layers 26 --hidden 4096 --heads 32 --head-dim 128 \
      --experts 8 --top-k 2 --latent 2048 --moe-inter 2048 --shared 1 --dense-inter 11264 \
      --first-dense 1 --vocab 46592 --mla-heads 32 --q-lora 1536 --kv-lora 512 \
      --qk-nope 128 --qk-rope 64 --v-head 128 --seed 13 --no-progress
fi
if [ ! -f "$TRUNK/trunk.json" ]; then
  "$K3FLOW" pack-trunk "$MODEL" "$TRUNK"
fi
du -sh --apparent-size "$MODEL" "$TRUNK"

# Page cache: the bench drops each file's cached pages (posix_fadvise DONTNEED) before every run and
# reads with O_DIRECT; dropping the whole cache as well needs root.
if sync && (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then
  echo "page cache dropped (echo 3 > /proc/sys/vm/drop_caches)"
else
  echo "NOTE: /proc/sys/vm/drop_caches refused (not root, or a container): O_DIRECT reads bypass the page cache, and the bench drops the files' cached pages before every run"
fi
echo "load: $(uptime)"

OUT=$WORK/bench-$(date -u +%Y%m%dT%H%M%SZ).json
"$K3FLOW" bench "$MODEL" --trunk "$TRUNK" --mem-gb "$MEM_GB" --threads "$THREADS" --gen "$GEN" \
    --repeat "$REPEAT" --strategy "$STRATEGY" --ids "$IDS" --probe-seconds "$PROBE_SECONDS" --out "$OUT"

/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"\npeer profile: {d['model']}, budget {d['budget_bytes'] / 2**30:.2f} GiB, {d['threads']} threads, "
      f"{d['gen']} tokens, {d['repeat']} repeats")
print(f"device ceiling: {d['ceiling_gbps']:.3f} GB/s sequential ({d['ceiling_queue_depth']} x "
      f"{d['ceiling_chunk_bytes'] >> 20} MiB in flight), {d['ceiling_random_gbps']:.3f} GB/s random expert reads; "
      f"the engine's settings on its own pattern: {d['engine_probe_gbps']:.3f} GB/s")
print(f"{'strategy':<10} {'s/token':>8} {'min':>8} {'GB/token':>9} {'read GB/s':>10} {'ceiling':>8} "
      f"{'ratio':>6} {'io wait':>8} {'read busy':>9} {'overlap':>8} {'peak RSS GiB':>13}")
for s in d["strategies"]:
    print(f"{s['strategy']:<10} {s['s_per_token']:8.4f} {s['s_per_token_min']:8.4f} {s['bytes_per_token'] / 1e9:9.3f} "
          f"{s['effective_read_gbps'] or 0:10.3f} {s['ceiling_gbps'] or 0:8.3f} {s['read_vs_ceiling'] or 0:6.3f} "
          f"{100 * (s['io_wait_share'] or 0):7.1f}% {100 * (s['io_busy_share'] or 0):8.1f}% {s['overlap_efficiency']:8.3f} "
          f"{s['peak_rss_bytes'] / 2**30:13.3f}")
print(f"best={d['best']} (json: {sys.argv[1]})")
PY
