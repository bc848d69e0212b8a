#!/usr/bin/env python3
"""Checks the repository's Markdown like code.

  check_docs.py ROOT

Fails (exit 1), naming file and line, when:
  - a relative link in a Markdown file names a file that does not exist, or
    an anchor that is not a heading of the file it points into;
  - README.md is longer than README_MAX_LINES lines, or docs/results.md
    than RESULTS_MAX_LINES;
  - a command in one of README.md's shell code blocks names a Bazel target
    that no BUILD file defines, or a script that does not exist;
  - any text file (Markdown prose, source, comments) mentions an issue
    number ("issue 17"): the tracker is not in the repository, and docs
    and comments say what is, not how it came to be;
  - any text file refers to a path outside the repository (the parent
    directory's "shared" folder, which a clone does not have).
"""
import os
import re
import sys

README_MAX_LINES = 200
RESULTS_MAX_LINES = 600  # docs/results.md: today's figures only
SKIP_DIRS = {".git", "node_modules", "__pycache__"}
TEXT_SUFFIXES = (".md", ".h", ".cc", ".py", ".sh", ".bzl", ".proto", ".json", ".txt", "BUILD",
                 ".toml", ".cfg", ".html", ".js", ".css")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
OUTSIDE = "../" + "shared"  # spelled in two parts so this file does not match itself
SELF = {os.path.join("tools", "docs", "check_docs.py"), os.path.join("tools", "docs", "docs_test.sh")}
LABEL = re.compile(r"(?<![\w@])//([\w/.+-]*):([\w/.+-]+)")
BAZEL_BIN = re.compile(r"\bbazel-bin/([\w/.+-]+)")
SCRIPT = re.compile(r"(?:^|&&\s*|;\s*|\$\s+)((?:tools|bench|eval|examples|testing)/[\w/.+-]+)")


def walk(root):
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(("bazel-", ".")))
        for name in sorted(files):
            yield os.path.join(here, name)


def slug(heading):
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            if fence or not line.startswith("#"):
                continue
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else "%s-%d" % (base, n))
    return found


def prose_lines(path):
    """(line number, text) of lines outside code fences, inline code removed."""
    fence = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            if not fence:
                yield number, re.sub(r"`[^`]*`", "", line)


def check_links(root, path, errors):
    rel = os.path.relpath(path, root)
    for number, line in prose_lines(path):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                errors.append("%s:%d: link to %s: no such file" % (rel, number, target))
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                errors.append("%s:%d: link to %s: %s has no heading '#%s'" %
                              (rel, number, target, os.path.relpath(dest, root), anchor))


def build_defines(root, package, name):
    build = os.path.join(root, package, "BUILD")
    if not os.path.exists(build):
        return False
    with open(build, encoding="utf-8") as f:
        text = f.read()
    return re.search(r"name\s*=\s*\"%s\"" % re.escape(name), text) is not None


def check_readme_commands(root, errors):
    path = os.path.join(root, "README.md")
    shell = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                shell = line.strip() in ("```sh", "```bash", "```shell")
                continue
            if not shell:
                continue
            for package, name in LABEL.findall(line):
                if name == "all" or name == "*":
                    continue
                if not build_defines(root, package, name):
                    errors.append("README.md:%d: //%s:%s: no such Bazel target" % (number, package, name))
            for output in BAZEL_BIN.findall(line):
                package, name = os.path.dirname(output), os.path.basename(output)
                if not build_defines(root, package, name):
                    errors.append("README.md:%d: bazel-bin/%s: no Bazel target builds it" % (number, output))
            for script in SCRIPT.findall(line.strip()):
                if not os.path.exists(os.path.join(root, script)):
                    errors.append("README.md:%d: %s: no such script" % (number, script))


def main(root):
    root = os.path.abspath(root)
    errors = []
    for path in walk(root):
        rel = os.path.relpath(path, root)
        if path.endswith(".md"):
            check_links(root, path, errors)
            for number, line in prose_lines(path):
                match = ISSUE.search(line)
                if match:
                    errors.append("%s:%d: '%s': docs name no issue numbers" % (rel, number, match.group(0)))
        if path.endswith(TEXT_SUFFIXES) and os.path.getsize(path) < 4 << 20:
            try:
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        match = None if path.endswith(".md") or rel in SELF else ISSUE.search(line)
                        if match:
                            errors.append("%s:%d: '%s': comments name no issue numbers" %
                                          (rel, number, match.group(0)))
                        if OUTSIDE in line:
                            errors.append("%s:%d: refers to a path outside the repository (%s)" %
                                          (rel, number, OUTSIDE))
            except UnicodeDecodeError:
                pass
    readme = os.path.join(root, "README.md")
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > README_MAX_LINES:
            errors.append("README.md: %d lines; keep it to %d (move detail into docs/)" % (lines, README_MAX_LINES))
        check_readme_commands(root, errors)
    results = os.path.join(root, "docs", "results.md")
    if os.path.exists(results):
        with open(results, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > RESULTS_MAX_LINES:
            errors.append("docs/results.md: %d lines; keep it to %d (today's figures only)" %
                          (lines, RESULTS_MAX_LINES))
    for error in errors:
        print(error)
    if errors:
        print("check_docs: %d problem(s)" % len(errors))
        return 1
    print("check_docs: OK")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: check_docs.py ROOT", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
