#!/usr/bin/env python3
"""Chart a `k3flow bench --out FILE` (or `--json`) result: python3 perf/plot_bench.py bench.json out.png

Per strategy, a stacked bar of the I/O time (T_io = bytes read priced at the device ceiling the
bench measured) and the compute time (T_cpu) one token needs, with the measured wall time per token as a marker
(median; min as a smaller one) and the overlap efficiency max(T_io, T_cpu) / T_wall on top. A
perfect overlap puts the marker on the taller of the two parts; a serial engine on top of the stack.

Needs Debian's python3-matplotlib (Agg backend, no display). Exit 2 on bad usage or a malformed
bench JSON, with one line naming the file and what is wrong.
"""
import json
import math
import os
import sys

USAGE = "usage: plot_bench.py BENCH_JSON OUT_PNG"


class Malformed(Exception):
    pass


def number(entry, key, where, optional=False):
    v = entry.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise Malformed(f'{where}: "{key}" must be a non-negative number, got {json.dumps(v)}')
    return float(v)


def load(path):
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise Malformed(f"cannot read: {e.strerror}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Malformed(f"not JSON: {e}")
    if not isinstance(doc, dict):
        raise Malformed("top level is not a JSON object")
    rows = doc.get("strategies")
    if not isinstance(rows, list) or not rows:
        raise Malformed('"strategies" must be a non-empty array')
    out = []
    for i, r in enumerate(rows):
        where = f"strategies[{i}]"
        if not isinstance(r, dict):
            raise Malformed(f"{where} is not an object")
        name = r.get("strategy")
        if not isinstance(name, str) or not name:
            raise Malformed(f'{where}: "strategy" must be a non-empty string')
        out.append({
            "strategy": name,
            "wall": number(r, "s_per_token", where),
            "wall_min": number(r, "s_per_token_min", where, optional=True),
            "t_io": number(r, "t_io", where),
            "t_cpu": number(r, "t_cpu", where),
            "eff": number(r, "overlap_efficiency", where),
        })
    meta = {
        "model": str(doc.get("model", "?")),
        "budget": doc.get("budget_bytes"),
        "gbps": doc.get("device_gbps"),
        "best": doc.get("best"),
        "speedup": doc.get("speedup_vs_serial"),
    }
    return meta, out


def plot(meta, rows, out_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Seconds per token spans 1e-4 (tiny synthetic) to 1e2 (the real model): pick a readable unit.
    top = max(max(r["wall"], r["t_io"] + r["t_cpu"]) for r in rows)
    scale, unit = (1.0, "s") if top >= 1 else ((1e3, "ms") if top >= 1e-3 else (1e6, "µs"))

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) + 2.5), 4.8), dpi=110)
    xs = list(range(len(rows)))
    io = [r["t_io"] * scale for r in rows]
    cpu = [r["t_cpu"] * scale for r in rows]
    ax.bar(xs, io, width=0.6, color="#4C78A8", label="I/O time per token (T_io)")
    ax.bar(xs, cpu, width=0.6, bottom=io, color="#F58518", label="compute time per token (T_cpu)")
    ax.scatter(xs, [r["wall"] * scale for r in rows], marker="D", s=55, color="black", zorder=3,
               label="wall per token (median)")
    mins = [(x, r["wall_min"] * scale) for x, r in zip(xs, rows) if r["wall_min"] is not None]
    if mins:
        ax.scatter([m[0] for m in mins], [m[1] for m in mins], marker="_", s=260, color="black", zorder=3,
                   label="wall per token (min)")
    ymax = top * scale
    for x, r in zip(xs, rows):
        y = max(r["wall"], r["t_io"] + r["t_cpu"]) * scale
        ax.annotate(f"overlap {r['eff']:.2f}", (x, y), xytext=(0, 8), textcoords="offset points",
                    ha="center", fontsize=9, fontweight="bold" if r["strategy"] == meta["best"] else "normal")
    ax.set_ylim(0, ymax * 1.25 if ymax > 0 else 1)
    ax.set_xticks(xs)
    ax.set_xticklabels([r["strategy"] for r in rows])
    ax.set_ylabel(f"{unit} per token")
    title = f"k3flow bench: {os.path.basename(meta['model'].rstrip('/')) or meta['model']}"
    parts = []
    if isinstance(meta["budget"], (int, float)) and meta["budget"] > 0:
        parts.append(f"budget {meta['budget'] / 2**30:.3g} GiB")
    if isinstance(meta["gbps"], (int, float)) and meta["gbps"] > 0:
        parts.append(f"device {meta['gbps']:.2f} GB/s")
    if meta["best"]:
        s = f"best {meta['best']}"
        if isinstance(meta["speedup"], (int, float)):
            s += f" ({meta['speedup']:.2f}x serial)"
        parts.append(s)
    ax.set_title(title + ("\n" + ", ".join(parts) if parts else ""), fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: ("T_io" not in labels[i], "T_cpu" not in labels[i], i))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    tmp = out_path + ".partial"
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, out_path)


def main(argv):
    if len(argv) != 3:
        print(USAGE, file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    try:
        meta, rows = load(src)
    except Malformed as e:
        print(f"plot_bench: {src}: {e}", file=sys.stderr)
        return 2
    try:
        plot(meta, rows, dst)
    except ImportError as e:
        print(f"plot_bench: matplotlib is missing ({e}); install Debian's python3-matplotlib and run "
              f"/usr/bin/python3", file=sys.stderr)
        return 1
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
