#!/usr/bin/env bash
# Regenerates docs/architecture.{dot,svg,png}, the picture at the top of docs/design.md, from the
# code itself, so it cannot drift from it:
#   - the code layers: one box per folder that builds a CMake library (its add_library line), an
#     arrow A -> B when files in A #include files in B, labelled with the number of #include lines;
#     a red arrow is an #include the link graph (`cmake --graphviz`) does not cover or one that
#     closes a cycle; a dashed arrow is a link with no #include behind it;
#   - the flow graph: the DOT that `k3flow generate --graph-dot` writes (its node and edge table),
#     for the embedded tiny model at a budget that streams the trunk through a ring, with the run's
#     counters (items, busy time, bytes) removed so the picture depends on the code only.
# Usage: docs/architecture.sh [BUILD_DIR]   (default: build; needs BUILD_DIR/k3flow built)
# Needs bash, python3 (standard library only) and Graphviz `dot` (all from .ci/install-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
k3=$build/k3flow
if [ ! -x "$k3" ]; then
  echo "architecture.sh: $k3 not found; build it first (cmake --build $build --target k3flow)" >&2
  exit 2
fi
command -v dot >/dev/null || { echo "architecture.sh: Graphviz 'dot' not found (.ci/install-deps)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Link edges between our targets, as CMake resolved them for this build.
cmake --graphviz="$tmp/targets.dot" "$build" >/dev/null

# The flow graph as the engine builds it, twice: over the raw trunk (the checkpoint's own shards)
# and over a trunk packed with a codec, whose graph adds the decode stage. --trunk-gb 0.002 leaves
# the tiny model's trunk a ring of slots beside the pinned layers, so every pool appears with slots.
"$k3" pack-trunk fixtures/tiny-k3 "$tmp/trunk" --codec exp3 --no-progress >"$tmp/pack.log" 2>&1 ||
  { cat "$tmp/pack.log" >&2; exit 1; }
for trunk in raw packed; do
  extra=()
  [ "$trunk" = packed ] && extra=(--trunk "$tmp/trunk")
  "$k3" generate fixtures/tiny-k3 "${extra[@]}" --ids 1,2,3 --gen 1 --trunk-gb 0.002 --cache-gb 0.001 \
    --no-progress --graph-dot "$tmp/flow-$trunk.dot" >"$tmp/generate.log" 2>&1 ||
    { cat "$tmp/generate.log" >&2; exit 1; }
done

python3 - "$tmp/targets.dot" "$tmp/flow-raw.dot" "$tmp/flow-packed.dot" docs/architecture.dot <<'PY'
import os, re, sys

targets_dot, raw_dot, packed_dot, out_path = sys.argv[1:5]
SKIP_TOP = {"build", "tests", "perf", "fixtures", "docs", "out"}  # not product code

# Folders that build a library: the add_library line of their CMakeLists.txt (interface libraries
# hold no sources and are left out).
folder_of_lib = {}
for root, dirs, files in os.walk("."):
    rel = os.path.relpath(root, ".")
    top = rel.split(os.sep)[0]
    if top.startswith(".") and rel != "." or top in SKIP_TOP or top.startswith("build"):
        dirs[:] = []
        continue
    if "CMakeLists.txt" in files and rel != ".":
        text = open(os.path.join(root, "CMakeLists.txt")).read()
        for lib, kind in re.findall(r"add_library\(\s*(\w+)\s+(\w+)", text):
            if kind != "INTERFACE":
                folder_of_lib[lib] = rel + "/"
lib_of_folder = {f: l for l, f in folder_of_lib.items()}

def owner(path):  # the deepest library folder holding path
    best = None
    for f in lib_of_folder:
        if path.startswith(f) and (best is None or len(f) > len(best)):
            best = f
    return best

# #include "..." lines between library folders.
includes = {}
for folder in lib_of_folder:
    for name in sorted(os.listdir(folder)):
        path = folder + name
        if not (name.endswith((".cpp", ".hpp", ".h")) and os.path.isfile(path)) or owner(path) != folder:
            continue
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', open(path).read(), re.M):
            to = owner(inc)
            if to and to != folder:
                includes[(folder, to)] = includes.get((folder, to), 0) + 1

# Link edges from `cmake --graphviz` ("nodeA" -> "nodeB" ... // libA -> libB), ours only.
links = set()
for a, b in re.findall(r"->.*//\s*(\S+)\s*->\s*(\S+)", open(targets_dot).read()):
    if a in folder_of_lib and b in folder_of_lib:
        links.add((folder_of_lib[a], folder_of_lib[b]))

def reach(edges, start):
    seen, todo = set(), [start]
    while todo:
        n = todo.pop()
        for a, b in edges:
            if a == n and b not in seen:
                seen.add(b)
                todo.append(b)
    return seen

# Red, and left out of the ranking: an #include the link graph does not cover (it points up a
# layer), or one that closes a cycle.
# An arrow the link graph covers points down a layer; a cycle among those would still be a fault.
why = {(a, b): "not linked" for (a, b) in includes if b not in reach(links, a)}
linked = [e for e in includes if e not in why]
for (a, b) in linked:
    if a in reach(linked, b):
        why[(a, b)] = "cycle"
# The layers read best without arrows a longer path already implies: drop an include arrow when
# another path of (non-red) arrows leads from A to B. The count of dropped arrows is in the label.
ok = {e for e in includes if e not in why}
implied = {(a, b) for (a, b) in ok if any(b in reach(ok, m) for (x, m) in ok if x == a and m != b)}

out = ['digraph k3flow_architecture {', '  compound=true; newrank=true; rankdir=TB;',
       '  node [fontname="Helvetica", fontsize=10]; edge [fontname="Helvetica", fontsize=9];',
       '  subgraph cluster_layers {',
       f'    label="code layers: a folder and its CMake library; A -> B: files in A #include files in B '
       f'(number of #include lines; {len(implied)} arrows a longer path implies are not drawn)\\l'
       'red: an #include that closes a cycle or that the link graph does not cover; '
       'dashed: linked, nothing included\\l";',
       '    fontname="Helvetica"; fontsize=12; labeljust=l;']
for folder in sorted(lib_of_folder):
    out.append(f'    "{folder}" [label="{folder}\\n{lib_of_folder[folder]}", shape=folder];')
for (a, b), n in sorted(includes.items()):
    if (a, b) in why:
        out.append(f'    "{a}" -> "{b}" [xlabel="{n}, {why[(a, b)]}", color=red, fontcolor=red, constraint=false];')
    elif (a, b) not in implied:
        out.append(f'    "{a}" -> "{b}" [label="{n}"];')
for a, b in sorted(links - includes.keys()):
    if b not in reach(includes.keys(), a):  # a link no #include path explains
        out.append(f'    "{a}" -> "{b}" [style=dashed, color=gray40];')
out.append('  }')

# The flow graph: k3flow's own DOT of the packed-trunk graph (the raw one's nodes and the decode
# stage), run counters dropped, the nodes the raw trunk's graph does not have drawn dashed, the
# raw graph's own arrows added dotted, its clusters nested in one cluster.
def node_ids(text):
    return set(re.findall(r'^\s*"([^"]+)" \[label=', text, re.M))
raw_nodes = node_ids(open(raw_dot).read())
flow = open(packed_dot).read()
flow = re.sub(r'\\n\d+ items, busy [0-9.]+ s(, [0-9.]+ [KMGT]?i?B)?', '', flow)
only_packed = sorted(node_ids(flow) - raw_nodes)
for n in only_packed:
    flow = re.sub(r'^(\s*"' + re.escape(n) + r'" \[label=.*)\];$', r'\1, style=dashed];', flow, flags=re.M)
body = flow[flow.index("{") + 1:flow.rindex("}")]
# Arrows only the raw trunk's graph has (its reads go straight to trunk_bind): drawn dotted.
def edges(text):
    return {(a, b): l for a, b, l in re.findall(r'^\s*"([^"]+)" -> "([^"]+)"(?: \[label="([^"]*)"\])?;', text, re.M)}
packed_edges = edges(flow)
only_raw = {e: l for e, l in edges(open(raw_dot).read()).items() if e not in packed_edges}
for (a, b), l in sorted(only_raw.items()):
    body += f'\n  "{a}" -> "{b}" [label="raw trunk: {l}", style=dotted];'
body = "\n".join(l for l in body.splitlines() if not l.strip().startswith(("rankdir", "node [")))
body = body.replace('subgraph "cluster_', 'subgraph "cluster_flow_')
out += ['  subgraph cluster_flow {',
        '    label="the flow graph (k3flow generate --graph-dot): boxes are tbb::flow nodes with their '
        'concurrency, cylinders the slot pools planned for tiny-k3 at --trunk-gb 0.002 --cache-gb 0.001\\l'
        'with a trunk packed by a codec (pack-trunk --codec exp3); dashed: only in that graph '
        '(the decode stage); dotted: only in the raw trunk\'s graph\\l";',
        '    fontname="Helvetica"; fontsize=12; labeljust=l;', body, '  }']
# pipeline/graph/ builds the flow graph: one arrow into it keeps the two parts in one picture.
graph_folder = next((f for f in lib_of_folder if f.rstrip("/").endswith("graph")), None)
first_flow = re.search(r'^\s*"([^"]+)" \[label=', body, re.M).group(1)
if graph_folder:
    out.append(f'  "{graph_folder}" -> "{first_flow}" [lhead=cluster_flow, style=dotted, label="builds"];')
out.append('}')
open(out_path, "w").write("\n".join(out) + "\n")
print(f"{len(lib_of_folder)} library folders, {len(includes)} folder-to-folder includes "
      f"({len(why)} red, {len(implied)} implied by a longer path), {len(links)} link edges; "
      f"flow graph: {len(node_ids(flow))} nodes and pools, {len(only_packed)} only with a packed trunk")
PY

dot -Tsvg docs/architecture.dot -o docs/architecture.svg
dot -Tpng -Gdpi=72 docs/architecture.dot -o docs/architecture.png
echo "wrote docs/architecture.dot, docs/architecture.svg, docs/architecture.png"
