#!/usr/bin/env python3
"""A page of the docs as a newcomer follows it: its ```sh blocks in order, in one shell.

    e2e/page.py script PAGE > page.sh    a bash script that runs PAGE's blocks and checks them
    e2e/page.py expect OUTPUT LINE...     whether each LINE is in the file OUTPUT

In the script each ```sh block runs as written, in one shell (a variable, a `cd` or a
background job carries on to the next block), its output kept; a ```text block right after
it lists lines that output must have, `…` standing for anything within a line. A block
right after `<!-- not run by the test: <why> -->` is skipped: what the test's own set-up
has done (the clone, the cluster), said so on the page. The script stops at the first block
that fails or misses a line, printing that block and its output.
"""
import re
import shlex
import sys

BLOCK = re.compile(r"(<!--\s*not run by the test:[^>]*-->\s*\n)?```(\w*)\n(.*?)^```[ \t]*$", re.S | re.M)


def blocks(page):
    """(kind, body, skipped) of each fenced block, in order."""
    return [(m.group(2), m.group(3), m.group(1) is not None) for m in BLOCK.finditer(page)]


def script(page, name):
    out = ["set -euo pipefail", 'PAGE_OUT=$(mktemp -d)', "page_block=0"]
    out.append(
        "trap 'status=$?; if ((status)); then echo \"" + name
        + ": block $page_block failed (exit $status); it ran:\"; sed \"s/^/    /\" \"$PAGE_OUT/$page_block.sh\";"
        " echo \"its output:\"; sed \"s/^/    /\" \"$PAGE_OUT/$page_block.out\"; fi' EXIT"
    )
    runnable = 0
    last = None
    for kind, body, skipped in blocks(page):
        if kind == "sh" and not skipped:
            runnable += 1
            last = runnable
            out.append(f"page_block={runnable}")
            out.append(f"cat > \"$PAGE_OUT/{runnable}.sh\" <<'PAGE_BLOCK_{runnable}'\n{body}PAGE_BLOCK_{runnable}")
            shown = body.splitlines()[0] + (" …" if len(body.splitlines()) > 1 else "")
            out.append(f"printf '    $ %s\\n' {shlex.quote(shown)}")
            # In this shell, not a subshell: what a block sets or starts, the next one has.
            out.append(f"{{\n{body}}} >\"$PAGE_OUT/{runnable}.out\" 2>&1 </dev/null")
        elif kind == "text" and last is not None:
            lines = [line for line in body.splitlines() if line.strip()]
            out.append(
                f"python3 e2e/page.py expect \"$PAGE_OUT/{last}.out\" " + " ".join(shlex.quote(line) for line in lines)
            )
            last = None
        else:
            last = None
    if runnable == 0:
        sys.exit(f"{name}: no ```sh block to run")
    out.append("page_block=0")
    out.append(f"echo \"    {name}: {runnable} blocks run as written\"")
    return "\n".join(out) + "\n"


def matches(line, expected):
    """Whether `line` has `expected`'s parts in order (`…` stands for anything)."""
    at = 0
    for part in expected.strip().split("…"):
        part = part.strip()
        if not part:
            continue
        found = line.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return True


def expect(output_file, expected_lines):
    with open(output_file, encoding="utf-8", errors="replace") as f:
        output = f.read().splitlines()
    missing = [e for e in expected_lines if not any(matches(line, e) for line in output)]
    for e in missing:
        print(f"the page shows '{e}', and no line of the output has it", file=sys.stderr)
    return not missing


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "script":
        with open(sys.argv[2], encoding="utf-8") as f:
            sys.stdout.write(script(f.read(), sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "expect":
        sys.exit(0 if expect(sys.argv[2], sys.argv[3:]) else 1)
    else:
        sys.exit(__doc__)
