#!/usr/bin/env python3
"""Dependencies between top-level packages run one way: down the layer order.

Reads the source tree and fails, naming file:line, on
  - a C++ `#include "pkg/..."` or a BUILD label `//pkg...` (in deps, data,
    srcs, ...; visibility lists are not dependencies) from one top-level
    package to another that is not in a lower layer (packages of one layer
    are peers and may not use each other either, so no cycle can form);
  - an import between modules of python/mlfabric that is not to a lower
    module in PYTHON_ORDER (module-level or inside a function alike);
  - a top-level directory that is in no layer (place a new package first);
  - a cycle of `#include`s between our files, within a package or across
    (a .cc including its own private header that includes the public one is
    no cycle: only headers can close one).
Test code (cc_test/sh_test rules, testonly targets, *_test.cc and fuzzer
sources) may also use TEST_HELPERS, leaves of the test infrastructure with
no dependencies of their own.

    python3 tools/layering/check_layering.py [ROOT]   # exit 0, or 1 with the offences
"""
import ast
import os
import re
import sys

# Lowest first. A package may depend only on packages of lower layers.
LAYERS = [
    ("third_party", "the system libraries and rule stand-ins, declared once"),
    ("proto", "the wire formats: generated code, nothing of ours below it"),
    ("common", "status macros, config, logging, clocks, secrets: used by every component"),
    ("ipc aggregator monitor",
     "the building blocks: local protocol, reduction kernels, bandwidth estimation"),
    ("scheduler daemon api",
     "the three programs' components: scheduler, per-host daemon, application library"),
    ("launch", "starts the built binaries and whole clusters on one machine"),
    ("python examples", "bindings and example applications on the API"),
    ("tools", "user tools (mlfabric-run, the demo, the planner CLI): ship, so no test code"),
    ("testing", "test infrastructure on the real system; nothing that ships needs it"),
    ("tests eval bench", "cross-process tests, evaluation and benchmarks: the top"),
]
# Top-level directories that hold no code (data and documentation only).
NOT_CODE = {"configs", "docs"}

# (package-level label or include path) -> why test code of any layer may use it.
TEST_HELPERS = {
    "//testing:prereq": "how a test reports a missing prerequisite; no dependencies",
    "//testing:prereq.sh": "the same for shell tests",
    "testing/prereq.h": "the header of //testing:prereq",
    "//testing:wait_for": "polls a condition for a unit test; header-only, no dependencies",
    "testing/wait_for.h": "the header of //testing:wait_for",
    "//testing:fuzz_corpus_main": "runs a fuzz target over its corpus under gcc; no dependencies",
    "//tools:mlfabric-plan": "the planner CLI, run by the planner's own CLI test as a binary",
}

# python/mlfabric modules, lowest first; a module may import lower ones only.
PYTHON_ORDER = [
    ("mlfabric._lib", "loads the native core"),
    ("mlfabric._elastic_errors", "the membership-change error the collectives raise"),
    ("mlfabric", "the core API (the package's __init__)"),
    ("mlfabric.elastic", "Horovod's elastic State, ObjectState and run, on the core API"),
    ("mlfabric._tensorflow_elastic", "the TensorFlow and Keras elastic states"),
    ("mlfabric.compression", "TensorFlow compression of tensors"),
    ("mlfabric._sync_batch_norm", "SyncBatchNormalization, on the core API's allreduce"),
    ("mlfabric.tensorflow", "TensorFlow ops and the Horovod TensorFlow API"),
    ("mlfabric.keras", "Keras 3 API, built on mlfabric.tensorflow"),
]

INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')
LABEL = re.compile(r'"(?:@mlfabric)?//([^"]*)"')
RULE_START = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\(")
CPP_SUFFIXES = (".cc", ".h", ".cpp", ".hpp")
TEST_SOURCE = re.compile(r"(_test|_fuzzer|_check)\.(cc|h)$")


def layer_of():
    rank = {}
    for i, (packages, _) in enumerate(LAYERS):
        for p in packages.split():
            rank[p] = i
    return rank


def walk(root, top):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            yield os.path.join(dirpath, f)


def build_rules(lines):
    """Yields (line number, text, is_test) for each line, is_test when the
    line is inside a test rule or a testonly target."""
    out = []
    block, kind = [], None
    for n, line in enumerate(lines, 1):
        m = RULE_START.match(line)
        if m and kind is None:
            kind, block = m.group(1), []
        if kind is None:
            out.append((n, line, False))
            continue
        block.append((n, line))
        if line.startswith(")"):
            text = "".join(l for _, l in block)
            test = kind.endswith("_test") or re.search(r"testonly\s*=\s*(True|1)", text)
            out.extend((bn, bl, bool(test)) for bn, bl in block)
            kind = None
    out.extend((bn, bl, False) for bn, bl in block if kind is not None)
    return out


def check_packages(root, rank, problems):
    tops = sorted(d for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d)) and not d.startswith((".", "bazel-")))
    for top in tops:
        if top not in rank and top not in NOT_CODE:
            problems.append(f"{top}/: a top-level package in no layer of LAYERS "
                            f"(tools/layering/check_layering.py)")

    def edge(src_top, dst, key, where, test):
        dst_top = dst.split("/")[0]
        if dst_top == src_top or dst_top not in rank or src_top not in rank:
            return
        if rank[dst_top] < rank[src_top]:
            return
        if test and key in TEST_HELPERS:
            return
        kind = "a peer" if rank[dst_top] == rank[src_top] else "a higher layer"
        problems.append(f"{where}: {src_top}/ uses {key} ({dst_top}/ is {kind}: "
                        f"{LAYERS[rank[dst_top]][1]})")

    for top in tops:
        if top not in rank:
            continue
        for path in walk(root, top):
            rel = os.path.relpath(path, root)
            name = os.path.basename(path)
            if name.endswith(CPP_SUFFIXES):
                test = bool(TEST_SOURCE.search(name)) or "fuzz" in name
                with open(path, errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m:
                            edge(top, m.group(1), m.group(1), f"{rel}:{n}", test)
            elif name in ("BUILD", "BUILD.bazel") or name.endswith(".bzl"):
                with open(path) as f:
                    lines = f.readlines()
                for n, line, test in build_rules(lines):
                    code = line.split("#", 1)[0]
                    for m in LABEL.finditer(code):
                        label = m.group(1)
                        if label.startswith("visibility:") or label.endswith(
                                (":__pkg__", ":__subpackages__")):
                            continue  # who may use us, not what we use
                        target = label.split("/")[0].split(":")[0]
                        key = "//" + label
                        edge(top, target + "/" + label, key, f"{rel}:{n}", test)


def include_cycles(root, tops):
    """The strongly connected sets of two or more of our files under `tops`
    that include each other (Tarjan's algorithm, iterative), each sorted."""
    edges = {}
    for top in tops:
        for path in walk(root, top):
            if not path.endswith(CPP_SUFFIXES):
                continue
            rel = os.path.relpath(path, root)
            with open(path, errors="replace") as f:
                included = [m.group(1) for m in map(INCLUDE.match, f) if m]
            edges[rel] = [i for i in included if os.path.isfile(os.path.join(root, i))]
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    cycles.append(sorted(members))
    return cycles


def check_include_cycles(root, rank, problems):
    tops = sorted(t for t in rank if os.path.isdir(os.path.join(root, t)))
    for cycle in include_cycles(root, tops):
        problems.append("files that include each other: " + " -> ".join(cycle) +
                        " (move what they share into a header below both)")


def python_module(package_dir, path):
    rel = os.path.relpath(path, os.path.dirname(package_dir))[:-3].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def python_rank(module):
    """The layer of a python/mlfabric module: its entry in PYTHON_ORDER, or
    that of the package it is in (mlfabric.keras.callbacks: mlfabric.keras).
    The package's own __init__ ("mlfabric") matches only itself."""
    for i, (name, _) in enumerate(PYTHON_ORDER):
        if module == name or (name != "mlfabric" and module.startswith(name + ".")):
            return i
    return None


def check_python(root, problems):
    package_dir = os.path.join(root, "python", "mlfabric")
    if not os.path.isdir(package_dir):
        return
    files = [p for p in walk(os.path.join(root, "python"), "mlfabric") if p.endswith(".py")]
    modules = {python_module(package_dir, p) for p in files}
    for path in files:
        rel = os.path.relpath(path, root)
        module = python_module(package_dir, path)
        own = python_rank(module)
        if own is None:
            problems.append(f"{rel}: module {module} is in no layer of PYTHON_ORDER")
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), rel)
        for node in ast.walk(tree):  # imports inside functions count too
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package
                    parts = module.split(".")
                    package = parts if path.endswith("__init__.py") else parts[:-1]
                    package = package[:len(package) - node.level + 1]
                    base = ".".join(package + ([base] if base else []))
                # `from mlfabric import keras` imports the module mlfabric.keras.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                if target != "mlfabric" and not target.startswith("mlfabric."):
                    continue
                other = python_rank(target)
                if other is not None and other < own:
                    continue
                if other == own and target.startswith(module + "."):
                    continue  # a package importing its own submodules
                why = PYTHON_ORDER[other][1] if other is not None else "in no layer"
                problems.append(f"{rel}:{node.lineno}: {module} imports {target} "
                                f"(not below it in PYTHON_ORDER: {why})")


def main(argv):
    root = argv[1] if len(argv) > 1 else os.getcwd()
    problems = []
    check_packages(root, layer_of(), problems)
    check_include_cycles(root, layer_of(), problems)
    check_python(root, problems)
    if problems:
        print("Dependencies that do not run down the layer order "
              "(tools/layering/check_layering.py):")
        for p in problems:
            print("  " + p)
        return 1
    print(f"layering: OK ({len(LAYERS)} layers, {len(PYTHON_ORDER)} Python modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
