#!/usr/bin/env bash
# tests/tf_dtypes_check.py under mlfabric-run with 4 ranks: a host (daemon)
# per rank, 2 hosts of 2 ranks, then one host of 4 (shared memory and MPI),
# every call between hosts on the
# mlfabric backend's own path (MLFABRIC_ALLREDUCE_MPI_BELOW=0): every
# collective of mlfabric.tensorflow, every dtype and reduce op, eagerly and
# in a tf.function, exactly as computed and as Open MPI's, and the
# gradients against numerical gradients. Skips, saying
# why, when the venv has no TensorFlow (fails instead under
# MLFABRIC_REQUIRE_PREREQS=1).
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
require_python tensorflow numpy
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python" TMPDIR="$TEST_TMPDIR" MLFABRIC_ALLREDUCE_MPI_BELOW=0
for per_host in 1 2 4; do
  out="$TEST_TMPDIR/out-$per_host.txt"
  echo "== 4 ranks, $per_host per host"
  timeout 560 "$root/tools/run/mlfabric-run" -np 4 --ranks_per_host "$per_host" \
    "$python" -X faulthandler "$root/tests/tf_dtypes_check.py" 2>&1 | tee "$out"
  [[ $(grep -c "tf_dtypes_check rank [0-3]: OK" "$out") == 4 ]]
done
