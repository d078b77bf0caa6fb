#!/usr/bin/env python3
"""Checks the relative links of README.md, crates/README.md and the book (docs/**/*.md).

Every relative link or image must name a file (or directory) that exists, and every `#anchor`,
on the same page or on another Markdown page, must be the slug of one of that page's headings
(mdBook's and GitHub's rule: lowercase, whitespace to '-', every other character dropped
except letters, digits, '-' and '_'; a repeated heading gets '-1', '-2', ...). mdBook's
`{{#include FILE}}` directives must name a file that exists too. Links inside code blocks and
code spans are not links and are skipped, as are absolute URLs (http:, https:, mailto:).

Usage: python3 docs/check_links.py [ROOT]   (ROOT: the repository, default: this file's parent's
parent). Prints each broken link as FILE:LINE: ... and exits 1 if there is any. Stdlib only.
"""

import os
import re
import sys
from functools import lru_cache

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
INCLUDE = re.compile(r"\{\{#(?:include|rustdoc_include)\s+([^\s}:]+)")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
EXPLICIT_ID = re.compile(r"\s*\{#([^}\s]+)[^}]*\}\s*$")


def slug(text):
    """The anchor mdBook and GitHub make of a heading's text."""
    # What the reader sees: code spans without their backticks, links by their text, no emphasis.
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    out = []
    for ch in text.strip():
        if ch.isalnum() or ch in "-_":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def lines_outside_code(path):
    """(line number, line) for every line not inside a fenced code block."""
    fence = None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line)
            if m:
                marker = m.group(1)
                if fence is None:
                    fence = marker[0] * 3
                elif marker.startswith(fence):
                    fence = None
                continue
            if fence is None:
                yield n, line.rstrip("\n")


@lru_cache(maxsize=None)
def anchors(path):
    """Every anchor a Markdown file's headings make."""
    seen = {}
    result = set()
    for _, line in lines_outside_code(path):
        m = HEADING.match(line)
        if not m:
            continue
        text = m.group(2)
        explicit = EXPLICIT_ID.search(text)
        if explicit:
            result.add(explicit.group(1))
            text = text[: explicit.start()]
        base = slug(text)
        k = seen.get(base, 0)
        seen[base] = k + 1
        result.add(base if k == 0 else f"{base}-{k}")
    # Explicit HTML anchors (<a id="..."> / <a name="...">) count too.
    with open(path, encoding="utf-8") as f:
        for m in re.finditer(r"<a\s+(?:id|name)=\"([^\"]+)\"", f.read()):
            result.add(m.group(1))
    return frozenset(result)


def targets(path):
    """(line, target, kind) for every link, image and include of a Markdown file."""
    for n, line in lines_outside_code(path):
        for m in INCLUDE.finditer(line):
            yield n, m.group(1), "include"
        bare = CODE_SPAN.sub("", line)
        for m in INLINE_LINK.finditer(bare):
            yield n, m.group(1), "link"
        m = REF_DEF.match(bare)
        if m:
            yield n, m.group(1), "link"


def check(root, path):
    problems = []
    rel = os.path.relpath(path, root)
    for n, target, kind in targets(path):
        if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # empty, or an absolute URL
        where = f"{rel}:{n}"
        file_part, _, anchor = target.partition("#")
        if file_part:
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                problems.append(f"{where}: {kind} {target}: no such file ({os.path.relpath(dest, root)})")
                continue
            if not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep):
                problems.append(f"{where}: {kind} {target}: outside the repository")
                continue
        else:
            dest = path
        if anchor and kind == "link":
            if not dest.endswith(".md") or os.path.isdir(dest):
                problems.append(f"{where}: link {target}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(dest):
                problems.append(
                    f"{where}: link {target}: no heading with the anchor #{anchor} in "
                    f"{os.path.relpath(dest, root)}"
                )
    return problems


def main():
    root = os.path.abspath(
        sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    )
    files = [os.path.join(root, "README.md"), os.path.join(root, "crates", "README.md")]
    for d, dirs, names in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        files += [os.path.join(d, x) for x in sorted(names) if x.endswith(".md")]
    problems = []
    links = 0
    for f in files:
        links += sum(1 for _ in targets(f))
        problems += check(root, f)
    for p in problems:
        print(p)
    print(
        f"check_links: {len(files)} files, {links} links, images and includes, "
        f"{len(problems)} broken"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
