"""Picture of the house: which source file calls which (from the objects' symbol tables, so
it is what the linker sees, not what the comments say), and any circles among them.
Usage: python reports/house/graph.py [BUILD] [--dot]  (default: an ASCII listing)
Only edges inside libtidal are drawn (objects whose source is gone are skipped); folders are prefixes of the file names."""
import collections
import os
import subprocess
import sys

build = next((a for a in sys.argv[1:] if not a.startswith("--")), "build")
objs = []
for root, _, files in os.walk(os.path.join(build, "src")):
    objs += [os.path.join(root, f) for f in files if f.endswith(".o")
             and os.path.exists(os.path.join("src", os.path.relpath(root, os.path.join(build, "src")), f[:-2] + ".c"))]
defs, uses = {}, collections.defaultdict(set)
for o in objs:
    name = os.path.relpath(o, os.path.join(build, "src"))[:-2] + ".c"
    for line in subprocess.run(["nm", o], capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDRB":
            defs[parts[2]] = name
        elif len(parts) == 2 and parts[0] == "U":
            uses[name].add(parts[1])
edges = collections.defaultdict(set)
for f, syms in uses.items():
    for s in syms:
        if s in defs and defs[s] != f:
            edges[f].add(defs[s])


def circles():
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(set(edges) | set(defs.values())):
        if v not in index:
            visit(v)
    return out


files = sorted(set(edges) | {d for ds in edges.values() for d in ds})
if "--dot" in sys.argv:
    print("digraph tidal {\n  rankdir=LR; node [shape=box, fontsize=10];")
    for folder in sorted({os.path.dirname(f) for f in files}):
        print(f'  subgraph "cluster_{folder}" {{ label="src/{folder}";')
        for f in files:
            if os.path.dirname(f) == folder:
                print(f'    "{f}";')
        print("  }")
    for f in files:
        for d in sorted(edges.get(f, ())):
            print(f'  "{f}" -> "{d}";')
    print("}")
else:
    for f in files:
        if edges.get(f):
            print(f"{f:28s} -> {', '.join(sorted(edges[f]))}")
    cs = circles()
    print("\ncircles:" if cs else "\ncircles: none")
    for c in cs:
        print("  " + " <-> ".join(c))
