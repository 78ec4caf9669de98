#!/usr/bin/env python3
"""A page of the docs as a newcomer follows it: its ```sh blocks in order, in one shell.

    e2e/page.py script PAGE > page.sh    a bash script that runs PAGE's blocks and checks them
    e2e/page.py expect OUTPUT LINE...     whether each LINE is in the file OUTPUT

In the script each ```sh block runs as written, in one shell (a variable, a `cd` or a
background job carries on to the next block), its output kept; a ```text block right after
it lists lines that output must have, `…` standing for anything within a line. A block
right after `<!-- not run by the test: <why> -->` is skipped: what the test's own set-up
has done (the clone, the cluster), said so on the page. The script stops at the first block
that fails or misses a line, printing that block and its output; once every block has run
it writes their count to the file $PAGE_DONE names. A fence that is indented or not closed,
or a ```text block that checks nothing, is refused before anything runs.
"""
import os
import re
import shlex
import sys

FENCE = re.compile(r"^(\s*)```(.*)$")


class PageError(Exception):
    pass


def blocks(page):
    """(kind, body, skipped) of each fenced block, in order; a fence that is indented, has
    no end, or a ```text block that follows no block to run, is an error: the page would
    not read as the test runs it."""
    found, lines, at = [], page.splitlines(keepends=True), 0
    skip_next = False
    while at < len(lines):
        line = lines[at]
        fence = FENCE.match(line)
        if not fence:
            if re.match(r"^<!--\s*not run by the test:", line):
                skip_next = True
            elif line.strip():
                skip_next = False  # the comment is for the block right after it
            at += 1
            continue
        indent, kind = fence.group(1), fence.group(2).strip()
        if indent:
            raise PageError(f"line {at + 1}: an indented fence; the page's blocks start at the margin")
        end = next((i for i in range(at + 1, len(lines)) if lines[i].rstrip("\n").rstrip() == "```"), None)
        if end is None:
            raise PageError(f"line {at + 1}: a ```{kind} block with no end")
        found.append((kind, "".join(lines[at + 1 : end]), skip_next, at + 1))
        skip_next = False
        at = end + 1
    return found


def script(page, name, page_py):
    """The bash script that runs `page`'s blocks; `page_py` is this file, for the checks."""
    out = [
        "set -euo pipefail",
        # The report of a failed block goes where the script's own output goes, not into
        # the file the block's output was going to.
        "exec 3>&1 4>&2",
        'PAGE_OUT=$(mktemp -d)',
        "page_block=0",
        "trap 'status=$?; exec 1>&3 2>&4; if ((status)); then echo \"" + name
        + ": block $page_block failed (exit $status); it ran:\"; sed \"s/^/    /\" \"$PAGE_OUT/$page_block.sh\";"
        " echo \"its output:\"; tail -n 60 \"$PAGE_OUT/$page_block.out\" | sed \"s/^/    /\"; fi' EXIT",
    ]
    runnable = 0
    last = None
    for kind, body, skipped, line in blocks(page):
        if kind == "sh" and skipped:
            out.append(f"printf '    (not run: line {line} of the page is done by the test set-up)\\n'")
            last = None
        elif kind == "sh":
            runnable += 1
            last = runnable
            out.append(f"page_block={runnable}")
            out.append(f"cat > \"$PAGE_OUT/{runnable}.sh\" <<'PAGE_BLOCK_{runnable}'\n{body}PAGE_BLOCK_{runnable}")
            shown = body.splitlines()[0] + (" …" if len(body.splitlines()) > 1 else "")
            out.append(f"printf '    $ %s\\n' {shlex.quote(shown)}")
            # In this shell, not a subshell: what a block sets or starts, the next one has.
            out.append(f"{{\n{body}}} >\"$PAGE_OUT/{runnable}.out\" 2>&1 </dev/null")
        elif kind == "text":
            lines = [text for text in body.splitlines() if text.strip()]
            if last is None:
                raise PageError(f"line {line}: a ```text block that follows no block the test runs")
            if not lines or any(not text.replace("…", "").strip() for text in lines):
                raise PageError(f"line {line}: a ```text block with a line that would match anything")
            out.append(
                f"python3 {shlex.quote(page_py)} expect \"$PAGE_OUT/{last}.out\" "
                + " ".join(shlex.quote(text) for text in lines)
            )
            last = None
        else:
            last = None
    if runnable == 0:
        raise PageError("no ```sh block to run")
    out.append("page_block=0")
    # Reached only after the last block: a block that ends the shell early (`exit 0`) is
    # not a page that ran.
    out.append(f"echo {runnable} > \"${{PAGE_DONE:?}}\"")
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
            try:
                sys.stdout.write(script(f.read(), sys.argv[2], os.path.abspath(__file__)))
            except PageError as error:
                sys.exit(f"{sys.argv[2]}: {error}")
    elif len(sys.argv) >= 3 and sys.argv[1] == "expect":
        sys.exit(0 if expect(sys.argv[2], sys.argv[3:]) else 1)
    else:
        sys.exit(__doc__)
