#!/usr/bin/env python3
"""Every link between the repository's Markdown pages leads somewhere.

    scripts/check-links.py

For each tracked *.md file, each relative link `[text](target)` must name a file or
directory of the repository (not one outside it: a clone has nothing beside it), and a
`#fragment` into a Markdown page must be one of that page's headings, as GitHub makes
their anchors. Links to http(s) and mail addresses are not followed. Prints each broken
link with its file and line, and exits 1 if there is one.
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def tracked_pages(root):
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=root, check=True, capture_output=True, text=True)
    return [line for line in listed.stdout.splitlines() if line]


def lines_outside_code(text):
    """(line number, line) of the lines not inside a fenced code block."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found = set()
    with open(path, encoding="utf-8") as f:
        for _, line in lines_outside_code(f.read()):
            heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if heading:
                base = anchor(heading.group(1))
                name, n = base, 1
                while name in found:
                    name, n = f"{base}-{n}", n + 1
                found.add(name)
    return found


def broken_links(root):
    root = os.path.realpath(root)
    broken = []
    for page in tracked_pages(root):
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = f.read()
        for number, line in lines_outside_code(text):
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^(https?:|mailto:)", target):
                    continue
                path, _, fragment = target.partition("#")
                where = os.path.join(root, page) if not path else os.path.join(root, os.path.dirname(page), path)
                where = os.path.realpath(where)
                if not (where == root or where.startswith(root + os.sep)):
                    broken.append(f"{page}:{number}: {target} is outside the repository")
                elif not os.path.exists(where):
                    broken.append(f"{page}:{number}: {target}: no such file")
                elif fragment and where.endswith(".md") and fragment not in anchors(where):
                    broken.append(f"{page}:{number}: {target}: {os.path.relpath(where, root)} has no heading #{fragment}")
    return broken


if __name__ == "__main__":
    problems = broken_links(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("every link between the repository's Markdown pages leads somewhere")
