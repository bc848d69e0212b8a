#!/usr/bin/env python3
"""Fails naming every public name of the Python package without a docstring.

  check_docstrings.py PACKAGE_DIR

Public: a module-level function or class, or a method of a public class,
whose name does not start with "_", in a module whose name does not start
with "_". The source is parsed, not imported, so the check needs neither
TensorFlow nor the native module.
"""
import ast
import os
import sys


def public_modules(root):
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        for name in sorted(files):
            if name.endswith(".py") and (name == "__init__.py" or not name.startswith("_")):
                yield os.path.join(here, name)


def missing(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    if not ast.get_docstring(tree):
        yield "%s: the module has no docstring" % path
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        if not ast.get_docstring(node):
            yield "%s:%d: %s has no docstring" % (path, node.lineno, node.name)
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if (isinstance(member, ast.FunctionDef) and not member.name.startswith("_")
                        and not ast.get_docstring(member)):
                    yield "%s:%d: %s.%s has no docstring" % (path, member.lineno, node.name,
                                                               member.name)


def main(root):
    problems = [p for path in public_modules(root) for p in missing(path)]
    for problem in problems:
        print(problem)
    print("check_docstrings: %s" % ("OK" if not problems else "%d undocumented" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: check_docstrings.py PACKAGE_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
