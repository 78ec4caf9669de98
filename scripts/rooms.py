#!/usr/bin/env python3
"""Halls in the house: the import circles between the modules of each crate, the files over
600 lines and the non-test functions over 100 lines, so the change that grows one is seen when
it lands, not three issues later.

    scripts/rooms.py            print what it finds; exit 1 if anything is new or has grown
                                since scripts/rooms-baseline.txt (the halls known today)
    scripts/rooms.py --bless    write what it finds as the new baseline (after a clean-up,
                                so the baseline only ever shrinks)

A module is a file (`src/a.rs` and `src/a/mod.rs` are `a`, `src/a/b.rs` is `a::b`). One module
depends on another when its code outside `#[cfg(test)]` names it: a `use` or a path through
`crate::`, `super::`, `self::`, or a child module's name; a module and the modules inside it
(a folder's `mod.rs` and its files, the crate's root and everything) are one room, not a
circle. A circle is a set of modules each of
which reaches every other through those names (a strongly connected component). Lines are the
file's lines; a function's run from its `fn` line to its closing brace. Standard library only.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASELINE = ROOT / "scripts" / "rooms-baseline.txt"
# Every crate of the workspace, as Cargo.toml lists them: a crate added is checked at once.
CRATES = re.findall(r'"([^"]+)"', re.search(r"^members = \[(.*)\]", (ROOT / "Cargo.toml").read_text(), re.M).group(1))
MEASURED = ["operator/src", "runtime/src", "builder/src", "outbound/src", "edge/src", "host/src", "node-agent/src", "events/src"]
MOST_FILE_LINES = 600
MOST_FUNCTION_LINES = 100


def blank_comments_and_strings(text):
    """The text with comments, strings and char literals blanked (newlines kept), so braces and
    paths inside them do not count."""
    out, i, n = [], 0, len(text)

    def blank(part):
        return re.sub(r"[^\n]", " ", part)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(blank(text[i:end]))
            i = end
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(blank(text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'" and (m := re.compile(r"'(\\.[^']*|[^'\\\n])'").match(text, i)):
            out.append(blank(m.group(0)))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def closing_brace(text, open_at):
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def test_spans(code):
    """Spans of `#[cfg(test)]` items and `#[test]` functions."""
    spans = []
    for m in re.finditer(r"#\[(cfg\(test\)|test|tokio::test[^\]]*)\]", code):
        brace, semicolon = code.find("{", m.end()), code.find(";", m.end())
        if brace < 0 or (0 <= semicolon < brace):
            continue
        spans.append((m.start(), closing_brace(code, brace)))
    return spans


def outside(spans, at):
    return not any(start <= at <= end for start, end in spans)


def module_files(crate):
    src = ROOT / crate / "src"
    modules = {}
    for path in sorted(src.rglob("*.rs")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[0] == "bin":
            continue
        if parts in (["lib"], ["main"]):
            parts = []
        elif parts[-1] == "mod":
            parts = parts[:-1]
        modules["::".join(parts)] = path
    return modules


def expand_use(tree):
    """`a::{b, c::{d, e}}` as ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+", "", tree)
    depth = 0
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                prefix, inner = tree[:i], tree[i + 1 : tree.rindex("}")]
                parts, start, level = [], 0, 0
                for j, d in enumerate(inner):
                    level += d == "{"
                    level -= d == "}"
                    if d == "," and level == 0:
                        parts.append(inner[start:j])
                        start = j + 1
                parts.append(inner[start:])
                return [p for part in parts if part for p in expand_use(prefix + part)]
            depth += 1
    return [tree.split("as")[0] if "::" in tree else tree]


def related(one, other):
    """Whether one module holds the other (or is it): a folder's `mod.rs` and the files in it
    are one room's parts, as a crate's root is of every module."""
    def holds(outer, inner):
        return outer == inner or outer == "" or inner.startswith(outer + "::")

    return holds(one, other) or holds(other, one)


def dependencies(module, code, modules):
    """The modules this module's non-test code names."""
    spans = test_spans(code)
    here = module.split("::") if module else []
    children = {name for name in modules if name.startswith(module + "::" if module else "") and name and "::" not in name[len(module) + 2 if module else 0 :]}
    child_names = {name.split("::")[-1] for name in children}
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        if outside(spans, m.start()):
            paths += expand_use(m.group(1))
    for m in re.finditer(r"\b(crate|super|self|[a-z_][a-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)+)", code):
        if outside(spans, m.start()):
            paths.append(m.group(1) + m.group(2))
    found = set()
    for path in paths:
        segments = [s for s in path.split("::") if s]
        if not segments:
            continue
        if segments[0] == "crate":
            absolute = segments[1:]
        elif segments[0] in ("super", "self"):
            base = list(here)
            while segments and segments[0] in ("super", "self"):
                if segments.pop(0) == "super":
                    base = base[:-1]
            absolute = base + segments
        elif segments[0] in child_names:
            absolute = here + segments
        else:
            continue
        for length in range(len(absolute), -1, -1):
            name = "::".join(absolute[:length])
            if name in modules:
                if not (related(name, module)):
                    found.add(name)
                break
    return found


def circles(crate):
    modules = module_files(crate)
    graph = {m: dependencies(m, blank_comments_and_strings(p.read_text()), modules) for m, p in modules.items()}
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def connect(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def long_functions(path):
    text = path.read_text()
    code = blank_comments_and_strings(text)
    spans = test_spans(code)
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", code):
        if not outside(spans, m.start()):
            continue
        brace, semicolon = code.find("{", m.end()), code.find(";", m.end())
        if brace < 0 or (0 <= semicolon < brace):
            continue
        lines = code.count("\n", m.start(), closing_brace(code, brace)) + 1
        if lines > MOST_FUNCTION_LINES:
            yield m.group(1), lines


def findings():
    """Each hall as (key, size): the key names it, the size says how big."""
    found = {}
    for crate in CRATES:
        for component in circles(crate):
            found[f"circle {crate}: {' '.join(m or '(root)' for m in component)}"] = len(component)
    for folder in MEASURED:
        for path in sorted((ROOT / folder).rglob("*.rs")):
            relative = path.relative_to(ROOT)
            lines = path.read_text().count("\n")
            if lines > MOST_FILE_LINES:
                found[f"file {relative}"] = lines
            for name, length in long_functions(path):
                found[f"function {relative} {name}"] = max(length, found.get(f"function {relative} {name}", 0))
    return found


def within_a_known_circle(key, known):
    crate, _, members = key.partition(": ")
    return any(
        other.startswith(crate + ": ") and set(members.split()) <= set(other.partition(": ")[2].split())
        for other in known
    )


def main():
    found = findings()
    if "--bless" in sys.argv[1:]:
        BASELINE.write_text(
            "# The halls scripts/rooms.py knows of: `<what> = <size>` (a circle's modules, a file's or a\n"
            "# function's lines). Only ever shrinks: scripts/rooms.py --bless after a clean-up.\n"
            + "".join(f"{key} = {size}\n" for key, size in sorted(found.items()))
        )
        print(f"wrote {len(found)} halls to {BASELINE.relative_to(ROOT)}")
        return 0
    known = {}
    if BASELINE.exists():
        for line in BASELINE.read_text().splitlines():
            if line and not line.startswith("#"):
                key, _, size = line.rpartition(" = ")
                known[key] = int(size)
    grown = []
    for key, size in sorted(found.items()):
        if key.startswith("circle") and key not in known and within_a_known_circle(key, known):
            continue  # a circle that lost modules since the baseline: smaller, not new
        if key not in known:
            grown.append(f"new:   {key} ({size})")
        elif size > known[key]:
            grown.append(f"grown: {key} ({known[key]} -> {size})")
    shrunk = [key for key in known if key not in found or found[key] < known[key]]
    kinds = {kind: sum(1 for key in found if key.startswith(kind)) for kind in ("circle", "file", "function")}
    print(
        f"{kinds['circle']} import circles, {kinds['file']} files over {MOST_FILE_LINES} lines, "
        f"{kinds['function']} non-test functions over {MOST_FUNCTION_LINES} lines (in {', '.join(MEASURED)})"
    )
    for key, size in sorted(found.items()):
        print(f"  {key} ({size})")
    if shrunk:
        print(f"smaller than the baseline (run scripts/rooms.py --bless to keep it so): {', '.join(shrunk)}")
    if grown:
        print("\nA hall appeared or grew: split it by concern (docs/architecture.md, 'Inside the operator'),")
        print("or, if it must stay, say why in the commit and run scripts/rooms.py --bless.")
        print("\n".join(grown))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
