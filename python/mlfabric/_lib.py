"""Finds and loads MLfabric's shared objects (built by Bazel, see README).

Search order: $MLFABRIC_LIB_DIR, this package's directory, then the
repository's bazel-bin/ (python/ and api/). libmlfabric_pycore.so is loaded
first (RTLD_LOCAL) so the pybind11 module and the TensorFlow op library
resolve to one shared client core.
"""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))


def _candidates(name):
    dirs = []
    if os.environ.get("MLFABRIC_LIB_DIR"):
        dirs += [os.environ["MLFABRIC_LIB_DIR"]]
    dirs += [_HERE]
    for sub in ("python", "api"):
        dirs += [os.path.join(_REPO, sub)]  # Bazel runfiles layout
    for sub in ("python", "api"):
        dirs += [os.path.join(_REPO, "bazel-bin", sub)]
    return [os.path.join(d, name) for d in dirs]


def find(name):
    for path in _candidates(name):
        if os.path.exists(path):
            return path
    raise ImportError(
        "mlfabric: cannot find %s (looked in %s). Build it with "
        "`bazel build //python:runtime` or set MLFABRIC_LIB_DIR."
        % (name, ", ".join(os.path.dirname(p) for p in _candidates(name))))


_core = None
_PLAIN_DEPENDENCIES = ("libmpi.so.40", "libmpi_cxx.so.40")


def load_core():
    """Loads libmlfabric_pycore.so once, in either import order.

    The core links Debian's libprotobuf, libgrpc++ and libabsl; TensorFlow
    bundles its own protobuf and Abseil and loads them RTLD_GLOBAL. The core
    is opened with RTLD_DEEPBIND: it and every library loaded with it look
    symbols up in their own dependency chain before the global scope, so
    with TensorFlow imported first they still bind to Debian's protobuf, not
    TensorFlow's. RTLD_LOCAL keeps the core's libraries out of the global
    scope, so a TensorFlow imported afterwards never binds to them.
    """
    global _core
    if _core is None:
        # Open MPI is loaded first, without deep binding: its memory hooks
        # and plugins expect the ordinary lookup order (deep-bound, its
        # finalisation double-frees). It has no protobuf to clash.
        for name in _PLAIN_DEPENDENCIES:
            try:
                ctypes.CDLL(name, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError:
                pass  # the core's own load below reports what is missing
        mode = os.RTLD_LOCAL | os.RTLD_NOW | getattr(os, "RTLD_DEEPBIND", 0)
        _core = ctypes.CDLL(find("libmlfabric_pycore.so"), mode=mode)
    return _core


def load_extension():
    """Imports the pybind11 module _mlfabric from wherever it was built."""
    load_core()
    import importlib.machinery
    import importlib.util
    path = find("_mlfabric.so")
    loader = importlib.machinery.ExtensionFileLoader("mlfabric._mlfabric", path)
    spec = importlib.util.spec_from_file_location("mlfabric._mlfabric", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
