#!/usr/bin/env python3
"""clang-tidy over the translation units of a compile_commands.json, skipping those whose exact
input was already found clean (.ci/tidy calls this; see its header for the why).

A translation unit's key is the SHA-256 of everything clang-tidy's result depends on:
  - clang-tidy's version and the .clang-tidy configuration files of the tree,
  - the header filter,
  - the compile command (flags, definitions, include directories),
  - the unit's preprocessed text with comments kept (clang++ -E -C): the .cpp and every header it
    includes, project and system alike, with line markers,
  - the raw bytes of every file of this tree the unit includes (a NOLINT comment on a #define line
    is not in the preprocessed text),
with this tree's absolute path replaced by a placeholder, so that a clone elsewhere has the same
keys. clang-tidy is deterministic: the same key gives the same diagnostics. A unit whose key is in
the record file was checked clean with that input and is not checked again; every other unit is
checked, and the ones found clean are added to the record (written whole to a temporary file and
renamed, never partially). --all checks every unit and ignores the record.

Exit status: 0 clean, 1 findings (each unit's output is printed), 2 usage or tool errors.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

PLACEHOLDER = b"@K3_SOURCE_DIR@"
LINE_MARKER = re.compile(rb'^# \d+ "([^"]+)"', re.M)


def die(msg):
    print(f"tidy: {msg}", file=sys.stderr)
    sys.exit(2)


def command_args(entry):
    if "arguments" in entry:
        return list(entry["arguments"])
    return shlex.split(entry["command"])


def preprocess_args(args, clangxx):
    """The compile command turned into one that writes the preprocessed unit to stdout."""
    out = [clangxx]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-o"):
            continue
        out.append(a)
    return out + ["-E", "-C", "-Wno-unknown-warning-option", "-o", "-"]


def unit_key(entry, root, common, clangxx):
    args = command_args(entry)
    proc = subprocess.run(preprocess_args(args, clangxx), cwd=entry["directory"], capture_output=True)
    if proc.returncode != 0:
        return None  # cannot be keyed: always checked
    root_b = root.encode()
    h = hashlib.sha256(common)
    h.update("\0".join(args).encode().replace(root_b, PLACEHOLDER))
    h.update(b"\0")
    h.update(proc.stdout.replace(root_b, PLACEHOLDER))
    own = sorted({m.group(1) for m in LINE_MARKER.finditer(proc.stdout) if m.group(1).startswith(root_b + b"/")})
    for path in own:
        h.update(b"\0" + path.replace(root_b, PLACEHOLDER) + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def read_record(path):
    record = {}
    if not os.path.exists(path):
        return record
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]):
                die(f"{path}:{n}: not '<sha256> <file>'")
            record[parts[1]] = parts[0]
    return record


def write_record(path, record):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("# Written by .ci/tidy: the translation units clang-tidy found clean, each with the SHA-256\n"
                "# of the exact input it checked (.ci/tidy_run.py says what goes into it). A unit whose\n"
                "# key still matches is not checked again; a stale or deleted line only costs a re-check.\n")
        for rel in sorted(record):
            f.write(f"{record[rel]} {rel}\n")
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True, help="build directory with compile_commands.json")
    p.add_argument("--root", required=True, help="the source tree")
    p.add_argument("--record", required=True, help="the record file of units found clean")
    p.add_argument("--header-filter", required=True)
    p.add_argument("--all", action="store_true", help="check every unit; ignore the record")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--tidy", default="clang-tidy-14")
    p.add_argument("--clangxx", default="clang++-14")
    p.add_argument("files", nargs="+", help="regexes of the units to check")
    a = p.parse_args()

    root = os.path.realpath(a.root)
    db_path = os.path.join(a.build, "compile_commands.json")
    try:
        with open(db_path, encoding="utf-8") as f:
            db = json.load(f)
    except (OSError, ValueError) as e:
        die(f"{db_path}: {e}")
    regexes = [re.compile(r) for r in a.files]
    units = {}
    for entry in db:
        path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
        if any(r.search(path) for r in regexes):
            units[os.path.relpath(path, root)] = entry
    if not units:
        die(f"no translation unit in {db_path} matches {' '.join(a.files)}")

    try:
        version = subprocess.run([a.tidy, "--version"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"{a.tidy}: {e}")
    common = hashlib.sha256(version)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("build", ".git")))
        if ".clang-tidy" in filenames:
            with open(os.path.join(dirpath, ".clang-tidy"), "rb") as f:
                common.update(os.path.relpath(dirpath, root).encode() + b"\0" + f.read())
    common.update(a.header_filter.encode().replace(root.encode(), PLACEHOLDER))
    common = common.digest()

    record = read_record(a.record)
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        keys = dict(zip(units, pool.map(lambda rel: unit_key(units[rel], root, common, a.clangxx), units)))
    todo = sorted(rel for rel in units if a.all or keys[rel] is None or record.get(rel) != keys[rel])
    print(f"tidy: {len(units)} units; {len(units) - len(todo)} unchanged since found clean, {len(todo)} to check",
          flush=True)

    def check(rel):
        proc = subprocess.run([a.tidy, "-p", a.build, "-quiet", f"-header-filter={a.header_filter}",
                               os.path.join(root, rel)], capture_output=True, text=True)
        return rel, proc.returncode, proc.stdout + proc.stderr

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for rel, rc, out in pool.map(check, todo):
            # clang-tidy prints "N warnings generated." for the suppressed system-header ones.
            out = "\n".join(l for l in out.splitlines() if not re.fullmatch(r"\d+ warnings? generated\.", l))
            if rc != 0:
                failed.append(rel)
                print(f"tidy: {rel}: findings\n{out}", flush=True)
            else:
                if out.strip():
                    print(out, flush=True)
                if keys[rel] is not None:
                    record[rel] = keys[rel]
    known = {os.path.relpath(os.path.realpath(os.path.join(e["directory"], e["file"])), root) for e in db}
    record = {rel: k for rel, k in record.items() if rel in known}
    write_record(a.record, record)
    if failed:
        print(f"tidy: findings in {len(failed)} of {len(todo)} checked units: {' '.join(failed)}", file=sys.stderr)
        return 1
    print(f"tidy: {len(todo)} checked, all clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
