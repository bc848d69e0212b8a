#!/usr/bin/env python3
"""Doxygen input filter: reads our headers' plain comments as documentation.

The public headers follow the codebase's comment style (`//` above a
declaration, `// ...` after a member, `/* */` in the C header) instead of
Doxygen's `///`. This filter, run by Doxygen on each file
(tools/docs/Doxyfile INPUT_FILTER), turns a comment above a declaration
into `///` (or `/**`), a trailing one into `///<` (or `/**<`), and marks
the file documented (`\\file`), so Doxygen renders the comments the
headers already have and warns about the names that have none.
"""
import re
import sys

ABOVE = re.compile(r"^(\s*)//(?!/)(.*)$")
ABOVE_C = re.compile(r"^(\s*)/\*(?![*!])(.*)$")
AFTER = re.compile(r"^(.*[;,{}])(\s*)//(?!/)(.*)$")
AFTER_C = re.compile(r"^(.*[;,{}])(\s*)/\*(?![*!])(.*)$")


def convert(line):
    if line.lstrip().startswith("#"):
        return line
    for pattern, mark in ((ABOVE, "///"), (ABOVE_C, "/**")):
        m = pattern.match(line)
        if m:
            return m.group(1) + mark + m.group(2)
    for pattern, mark in ((AFTER, "///<"), (AFTER_C, "/**<")):
        m = pattern.match(line)
        if m:
            return m.group(1) + m.group(2) + mark + m.group(3)
    return line


def main(path):
    out = ["/** \\file */"]
    with open(path, encoding="utf-8") as f:
        out += [convert(line.rstrip("\n")) for line in f]
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
