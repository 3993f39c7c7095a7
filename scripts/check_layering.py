#!/usr/bin/env python3
"""The include rules of docs/architecture.md ("Layers"), checked on the tree.

Headers live in two places, both spelt "fullburn/<name>.h" in an include:
include/fullburn/ (public: installed, a user's program may include them) and
src/internal/fullburn/ (internal: shared between components, never
installed).

1. A file in src/<component>/ includes its own folder's headers, public or
   internal ones, never "../<other>/..." (another component's private
   header, or a path that climbs out of its folder).
2. A public header includes only public headers and system ones: never an
   internal one (an installed header would name a file that is not there).
3. The monitoring half (its folders below) builds without libtorch: none of
   its files includes torch, ATen or c10, directly or through an internal
   header.
4. No include cycle, among headers or within a folder.
5. A header name is in one place: public or internal, not both.

Prints one line per broken rule (file:line, what, the fix) and exits 1; prints
what it checked and exits 0 otherwise. Run by CTest
(every_include_stays_in_its_layer).
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PUBLIC = ROOT / "include" / "fullburn"
INTERNAL = ROOT / "src" / "internal" / "fullburn"
MONITORING = {"common", "telemetry", "store", "diagnose", "report", "analyze", "fleet", "cli",
              "http", "config", "trackers"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
TORCH = re.compile(r"(torch|ATen|c10)/")


def includes(path):
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            yield n, m.group(1), m.group(2)


def resolve(name):
    """The file a "fullburn/x.h" include names, and whether it is internal."""
    base = name[len("fullburn/"):]
    if (PUBLIC / base).exists():
        return PUBLIC / base, False
    if (INTERNAL / base).exists():
        return INTERNAL / base, True
    return None, False


def torch_through(header, memo, seen=()):
    """The torch include an internal header reaches, or None."""
    if header in memo:
        return memo[header]
    memo[header] = None
    for _, kind, name in includes(header):
        if kind == "<" and TORCH.match(name):
            memo[header] = f"<{name}>"
            break
        if kind == '"' and name.startswith("fullburn/"):
            target, _ = resolve(name)
            if target and target not in seen:
                via = torch_through(target, memo, seen + (header,))
                if via:
                    memo[header] = f"{name} -> {via}"
                    break
    return memo[header]


def main():
    problems, graph, memo = [], {}, {}
    public = sorted(PUBLIC.glob("*.h"))
    internal = sorted(INTERNAL.glob("*.h"))
    for both in sorted({p.name for p in public} & {p.name for p in internal}):
        problems.append(f"fullburn/{both} is both in include/fullburn/ and in src/internal/fullburn/: "
                        "keep one (public if a user's program needs it, else internal)")
    sources = sorted(p for p in (ROOT / "src").rglob("*")
                     if p.suffix in (".h", ".cpp", ".cu", ".cuh") and INTERNAL not in p.parents)
    for path in sources + public + internal:
        rel = path.relative_to(ROOT).as_posix()
        is_public = PUBLIC in path.parents
        is_header = is_public or INTERNAL in path.parents
        component = None if is_header else path.relative_to(ROOT / "src").parts[0]
        edges = graph.setdefault(rel, [])
        for n, kind, name in includes(path):
            where = f"{rel}:{n}"
            if kind == "<":
                if component in MONITORING and TORCH.match(name):
                    problems.append(f"{where}: includes <{name}>, but src/{component} is in the "
                                    "monitoring half, which builds without libtorch: move the code "
                                    "to the training half")
                continue
            if name.startswith("fullburn/"):
                target, is_internal = resolve(name)
                if target is None:
                    problems.append(f'{where}: includes "{name}", which is neither in include/fullburn/ '
                                    "nor in src/internal/fullburn/")
                    continue
                if is_public and is_internal:
                    problems.append(f'{where}: public header includes internal "{name}", which is not '
                                    "installed: include it from the .cpp files that need it, or make "
                                    "it public (git mv to include/fullburn/)")
                if component in MONITORING and is_internal:
                    via = torch_through(target, memo)
                    if via:
                        problems.append(f'{where}: includes "{name}", which reaches {via}, but '
                                        f"src/{component} is in the monitoring half, which builds "
                                        "without libtorch")
                edges.append(target.relative_to(ROOT).as_posix())
            elif is_header:
                problems.append(f'{where}: shared header includes a folder\'s private "{name}": '
                                "give it a header of its own in src/internal/fullburn/ (or "
                                "include/fullburn/ if users need it)")
            elif ".." in pathlib.PurePosixPath(name).parts:
                problems.append(f'{where}: includes "{name}", another component\'s private file: '
                                "give what it needs a header in src/internal/fullburn/ (shared, not "
                                "installed) or include/fullburn/ (public)")
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
    print(f"layering: {len(sources)} source files, {len(public)} public and {len(internal)} internal "
          "headers: no include climbs into another component, no public header includes an "
          "internal one, the monitoring half reaches no libtorch, no include cycle, each header "
          "in one place")
    return 0


if __name__ == "__main__":
    sys.exit(main())
