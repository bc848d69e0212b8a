"""@mlfabric_python_env: what the Python side builds against, found locally.

Runs the project venv's python ($TF_PYTHON, else $MLFABRIC_VENV/bin/python,
else /opt/mlfabric/venv/bin/python; tools/bootstrap creates it) to ask
TensorFlow for its include and library directories, and looks for the NCCL
and CUDA runtime headers the nvidia-* wheels install beside it. Exposes:

  :tf_headers, :tf_framework   TensorFlow's headers (with the ABI defines
                               TF was compiled with) and libtensorflow_framework
  :python_headers              Debian's python3-dev headers and the venv's
                               pybind11 (pip; numpy 2 needs pybind11 >= 2.12)
  :nccl_headers                nccl.h + cuda_runtime.h
  defs.bzl                     HAS_TF, HAS_NCCL, HAS_PYTHON_HEADERS, PYTHON,
                               NVIDIA_DIR: BUILD files leave out targets
                               whose inputs are missing instead of failing.
"""

_PROBE = """
import json, os, sys
out = {"site": "", "tf_include": "", "tf_lib": "", "pybind11": ""}
try:
    import sysconfig
    out["site"] = sysconfig.get_paths()["purelib"]
    try:
        import pybind11
        out["pybind11"] = pybind11.get_include()
    except Exception:
        pass
    import tensorflow as tf
    out["tf_include"] = tf.sysconfig.get_include()
    out["tf_lib"] = tf.sysconfig.get_lib()
except Exception as e:
    out["error"] = str(e)
print(json.dumps(out))
"""

def _impl(rctx):
    venv = rctx.os.environ.get("MLFABRIC_VENV", "/opt/mlfabric/venv")
    python = rctx.os.environ.get("TF_PYTHON", venv + "/bin/python")
    info = {"site": "", "tf_include": "", "tf_lib": "", "pybind11": ""}
    if rctx.path(python).exists:
        result = rctx.execute([python, "-c", _PROBE], timeout = 300, quiet = True,
                              environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
        if result.return_code == 0 and result.stdout.strip():
            info = json.decode(result.stdout.strip().splitlines()[-1])
    has_tf = info["tf_include"] != "" and rctx.path(info["tf_lib"] + "/libtensorflow_framework.so.2").exists
    nvidia = info["site"] + "/nvidia" if info["site"] else ""
    has_nccl = nvidia != "" and rctx.path(nvidia + "/nccl/include/nccl.h").exists and \
               rctx.path(nvidia + "/cuda_runtime/include/cuda_runtime.h").exists
    # pybind11 from the venv (pip): numpy 2 needs pybind11 >= 2.12, and
    # Debian's pybind11-dev is 2.10.
    has_python = rctx.path("/usr/include/python3.11/Python.h").exists and \
                 info.get("pybind11", "") != "" and \
                 rctx.path(info.get("pybind11", "") + "/pybind11/pybind11.h").exists

    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if has_tf:
        rctx.symlink(info["tf_include"], "tf_include")
        rctx.symlink(info["tf_lib"] + "/libtensorflow_framework.so.2", "tf_lib/libtensorflow_framework.so.2")
        build.append("""cc_library(
    name = "tf_headers",
    hdrs = glob(["tf_include/**"], exclude = ["tf_include/**/*.py", "tf_include/**/*.pyc"]),
    includes = ["tf_include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI=1", "EIGEN_MAX_ALIGN_BYTES=64"],
)

cc_import(
    name = "tf_framework",
    shared_library = "tf_lib/libtensorflow_framework.so.2",
)
""")
    if has_nccl:
        rctx.symlink(nvidia + "/nccl/include", "nccl_include")
        rctx.symlink(nvidia + "/cuda_runtime/include", "cuda_include")
        extra = []
        for sub in ["cuda_nvcc", "cuda_cccl"]:
            if rctx.path(nvidia + "/" + sub + "/include").exists:
                rctx.symlink(nvidia + "/" + sub + "/include", sub + "_include")
                extra.append(sub + "_include")
        build.append("""cc_library(
    name = "nccl_headers",
    hdrs = glob([d + "/**" for d in %r]),
    includes = %r,
)
""" % (["nccl_include", "cuda_include"] + extra, ["nccl_include", "cuda_include"] + extra))
    if has_python:
        rctx.symlink("/usr/include/python3.11", "python_include")
        rctx.symlink(info["pybind11"], "pybind11_include")
        build.append("""cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h", "pybind11_include/**/*.h"]),
    includes = ["pybind11_include", "python_include"],
)
""")
    rctx.file("BUILD", "\n".join(build))
    rctx.file("defs.bzl", "\n".join([
        "HAS_TF = %s" % has_tf,
        "HAS_NCCL = %s" % has_nccl,
        "HAS_PYTHON_HEADERS = %s" % has_python,
        "PYTHON = %r" % python,
        "NVIDIA_DIR = %r" % nvidia,
        "",
    ]))

mlfabric_python_configure = repository_rule(
    implementation = _impl,
    local = True,
    environ = ["TF_PYTHON", "MLFABRIC_VENV"],
)
