"""Declares the Debian-packaged libraries MLfabric builds against.

Each is a header-less cc_library over /usr: the headers live in the
compiler's default include path and the libraries are linked by name.
tools/bootstrap installs the packages these targets need.
"""

def mlfabric_system_libs():
    native.new_local_repository(
        name = "system",
        path = "/usr",
        build_file = "//third_party:system.BUILD",
    )
    native.new_local_repository(
        name = "openmpi",
        path = "/usr/lib/x86_64-linux-gnu/openmpi",
        build_file = "//third_party:openmpi.BUILD",
    )
