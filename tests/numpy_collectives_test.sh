#!/usr/bin/env bash
# The numpy API's alltoall and reducescatter (tests/numpy_collectives_check.py)
# on 2 and on 3 ranks under mlfabric-run, with the mpi and the mlfabric
# AllReduce backends: uneven splits, exact integer results, bad arguments
# failing every rank with ValueError. Skips, saying why, when the venv has
# no numpy.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
require_python numpy
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python"
for np in 2 3; do
  for backend in mpi mlfabric; do
    out="$TEST_TMPDIR/out-$np-$backend.txt"
    echo "== $np ranks, backend $backend"
    MLFABRIC_ALLREDUCE_BACKEND="$backend" \
      timeout 220 "$root/tools/run/mlfabric-run" -np "$np" --ranks_per_host 1 \
      "$python" -X faulthandler "$root/tests/numpy_collectives_check.py" 2>&1 | tee "$out"
    [[ $(grep -c "numpy_collectives_check rank [0-9]: OK" "$out") == "$np" ]]
  done
done
