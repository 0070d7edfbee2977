#!/usr/bin/env python3
"""Chart `k3flow cache-sim TRACE --json` results: python3 perf/plot_routing.py OUT_PNG JSON [JSON...]

One panel per JSON (its title: the file name without .json): the hit rate of every replayed policy
and of Belady's offline optimum against the cache capacity (GiB, log scale), with the compulsory-miss
ceiling as a dashed line. Reproduce docs/routing.md's figure with

  for o in incremental recorded; do
    k3flow cache-sim fixtures/expert_trace.bin --order $o --json > $o.json; done
  python3 perf/plot_routing.py docs/routing.png incremental.json recorded.json

Needs Debian's python3-matplotlib (Agg backend, no display). Exit 2 on bad usage or a JSON that is
not cache-sim's, with one line naming the file.
"""
import json
import os
import sys

USAGE = "usage: plot_routing.py OUT_PNG CACHE_SIM_JSON [CACHE_SIM_JSON...]"


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        rows = d["rows"]
        caps = [float(r["cache_gib"]) for r in rows]
        policies = list(rows[0]["policies"].keys()) if rows else []
        curves = {p: [100 * float(r["policies"][p]["hit_rate"]) for r in rows] for p in policies}
        curves["belady"] = [100 * float(r["belady"]["hit_rate"]) for r in rows]
        return caps, curves, 100 * float(d["hit_ceiling"]), d.get("order", "")
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        sys.exit(f"plot_routing.py: {path}: not a `k3flow cache-sim --json` result ({e})")


def main(argv):
    if len(argv) < 3:
        print(USAGE, file=sys.stderr)
        return 2
    out, inputs = argv[1], argv[2:]
    data = [(p, *load(p)) for p in inputs]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4.5), squeeze=False)
    for ax, (path, caps, curves, ceiling, order) in zip(axes[0], data):
        for name, ys in curves.items():
            style = dict(linestyle="--", color="black") if name == "belady" else {}
            ax.plot(caps, ys, marker="o", label=name, **style)
        ax.axhline(ceiling, color="grey", linestyle=":", label=f"ceiling {ceiling:.1f} %")
        ax.set_xscale("log", base=2)
        ax.set_xticks(caps)
        ax.set_xticklabels([f"{c:g}" for c in caps])
        ax.set_xlabel("expert cache (GiB)")
        ax.set_ylabel("hit rate (%)")
        ax.set_title(f"{os.path.splitext(os.path.basename(path))[0]} ({order} order)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
