#!/usr/bin/env python3
"""Checks docs/architecture.md's index of NOTE blocks against the sources: every row's anchor
must be the line where its note is defined (a comment that starts with ``NOTE [name]``), and every
note defined in the sources must have a row. ``--fix`` rewrites stale line numbers in place (new
notes are only listed: their row needs a sentence written by a person).

    python3 tools/note_index.py [--fix]
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "architecture.md")
ROW = re.compile(r"^\| (?P<name>[^|]+?) \| \[(?P<path>[^:\]]+):(?P<line>\d+)\]"
                 r"\(\.\./(?P=path)#L(?P=line)\)")
# A definition: a comment (or docstring) that starts with the note's name followed by a colon or
# the end of the line (`// NOTE [x]`, `# NOTE [x]: ...`, `"""NOTE [x]: ...`), not a reference such
# as `(NOTE [x])`, `NOTE [x] in file` or `NOTE [x]: see file`.
DEFINITION = re.compile(r'^\s*(?://+|#+|\*|/\*+|"""|r""")?\s*NOTE \[(?P<name>[^\]]+)\]'
                        r"(?::(?! see )|\s*$)")


def _lines(path):
    try:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            return f.readlines()
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return []


def definitions():
    """{name: [(path, line)]} of the notes defined in the tracked sources."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    out = {}
    for path in files:
        if path.startswith("docs/") or path.endswith((".md", ".png", ".json")):
            continue
        for number, text in enumerate(_lines(path), 1):
            m = DEFINITION.match(text)
            if m:
                out.setdefault(m.group("name"), []).append((path, number))
    return out


def main():
    fix = "--fix" in sys.argv[1:]
    defined = definitions()
    with open(DOC, encoding="utf-8") as f:
        doc = f.readlines()
    rows, stale, lost = set(), 0, []
    for i, text in enumerate(doc):
        m = ROW.match(text)
        if not m:
            continue
        name, path, line = m.group("name"), m.group("path"), int(m.group("line"))
        rows.add(name)
        lines = _lines(path)
        if 0 < line <= len(lines) and f"NOTE [{name}]" in lines[line - 1]:
            continue  # the row's anchor still shows the note
        here = [n for p, n in defined.get(name, []) if p == path]
        if not here:
            lost.append(f"{name} ({path}:{line})")
            continue
        new = min(here, key=lambda n: abs(n - line))
        stale += 1
        print(f"stale: {name}: {path}:{line} -> {new}")
        anchor = f"[{path}:{new}](../{path}#L{new})"
        doc[i] = f"| {name} | {anchor}" + text[m.end():]
    for name in sorted(set(defined) - rows):
        print(f"no row: {name} ({', '.join(f'{p}:{n}' for p, n in defined[name])})")
    for what in lost:
        print(f"row whose note is not in its file any more: {what}")
    if fix and stale:
        with open(DOC, "w", encoding="utf-8") as f:
            f.writelines(doc)
        print(f"fixed {stale} anchors")
    return 1 if (stale and not fix) or lost else 0


if __name__ == "__main__":
    sys.exit(main())
