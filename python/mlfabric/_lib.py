"""Finds and loads MLfabric's shared objects (built by Bazel, see README).

Search order: $MLFABRIC_LIB_DIR, this package's directory, then the
repository's bazel-bin/ (python/ and api/). libmlfabric_pycore.so is loaded
first (RTLD_LOCAL) so the pybind11 module and the TensorFlow op library
resolve to one shared client core.
"""
import ctypes
import os
import sys

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


def load_core():
    global _core
    if _core is None:
        # TensorFlow bundles its own protobuf and exports it globally. The
        # core's Debian libprotobuf must neither become global (TF would bind
        # to it: RTLD_LOCAL) nor resolve its symbols lazily after TF arrived
        # (it would bind to TF's: RTLD_NOW, and load before TensorFlow).
        if "tensorflow" in sys.modules:
            raise ImportError(
                "import mlfabric before tensorflow/keras: MLfabric's core must load "
                "first (its protobuf runtime differs from TensorFlow's bundled one)")
        _core = ctypes.CDLL(find("libmlfabric_pycore.so"), mode=os.RTLD_LOCAL | os.RTLD_NOW)
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
