#!/usr/bin/env python3
"""The include rules of docs/architecture.md ("Layers"), checked on the tree:

1. A file in src/<component>/ includes its own folder's headers or public
   ones (include/fullburn/...), never "../<other>/..." (another component's
   private header, or a path that climbs out of its folder).
2. A public header includes only public headers and system ones.
3. The monitoring half (its folders below) builds without libtorch: none of
   its files includes torch, ATen or c10.
4. No include cycle, among public headers or within a folder.

Prints one line per broken rule (file:line, what, the fix) and exits 1; prints
what it checked and exits 0 otherwise. Run by CTest
(every_include_stays_in_its_layer).
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MONITORING = {"common", "telemetry", "store", "diagnose", "report", "analyze", "fleet", "cli",
              "http", "config", "trackers"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def includes(path):
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            yield n, m.group(1), m.group(2)


def main():
    problems, graph = [], {}
    sources = sorted(p for p in (ROOT / "src").rglob("*") if p.suffix in (".h", ".cpp", ".cu", ".cuh"))
    public = sorted((ROOT / "include" / "fullburn").glob("*.h"))
    for path in sources + public:
        rel = path.relative_to(ROOT).as_posix()
        is_public = rel.startswith("include/")
        component = None if is_public else path.relative_to(ROOT / "src").parts[0]
        edges = graph.setdefault(rel, [])
        for n, kind, name in includes(path):
            where = f"{rel}:{n}"
            if kind == "<":
                if component in MONITORING and re.match(r"(torch|ATen|c10)/", name):
                    problems.append(f"{where}: includes <{name}>, but src/{component} is in the "
                                    "monitoring half, which builds without libtorch: move the code "
                                    "to the training half")
                continue
            if name.startswith("fullburn/"):
                target = f"include/{name}"
                if not (ROOT / target).exists():
                    problems.append(f'{where}: includes "{name}", which is not in include/fullburn/')
                edges.append(target)
            elif is_public:
                problems.append(f'{where}: public header includes private "{name}": make it '
                                "public (include/fullburn/) or move the include to a .cpp")
            elif ".." in pathlib.PurePosixPath(name).parts:
                problems.append(f'{where}: includes "{name}", another component\'s private file: '
                                "give what it needs a public header in include/fullburn/")
            else:
                target = (path.parent / name).relative_to(ROOT).as_posix()
                if (ROOT / target).exists():
                    edges.append(target)
    # Rule 4: a depth-first walk that meets a file still on its path has a cycle.
    state, stack = {}, []

    def walk(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                problems.append("include cycle: " + " -> ".join(cycle) +
                                ": split the shared part into a header of its own")
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = "done"

    sys.setrecursionlimit(10000)
    for node in list(graph):
        if node not in state:
            walk(node)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"layering: {len(sources)} source files and {len(public)} public headers: no include "
          "climbs into another component, no public header includes a private one, the monitoring "
          "half includes no libtorch, no include cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
