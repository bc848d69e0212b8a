#!/usr/bin/env bash
# A TensorFlow/Keras check script on 2 ranks under mlfabric-run (mpirun +
# scheduler + a daemon per rank):
#
#   tf_check_test.sh CHECK [BACKEND...]     (the arguments come from BUILD)
#
# runs tests/CHECK.py once per BACKEND (MLFABRIC_ALLREDUCE_BACKEND; none
# given: the default backend) and passes when both ranks print
# "CHECK rank R: OK" every time. Skips, saying why, when the venv has no
# TensorFlow/Keras (fails instead under MLFABRIC_REQUIRE_PREREQS=1).
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
check="${1:?usage: tf_check_test.sh CHECK [BACKEND...]}"
shift
backends=("$@")
[[ ${#backends[@]} -gt 0 ]] || backends=("")
require_python tensorflow keras
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python" MPLCONFIGDIR="$TEST_TMPDIR/matplotlib" TMPDIR="$TEST_TMPDIR"
for backend in "${backends[@]}"; do
  out="$TEST_TMPDIR/out-${backend:-default}.txt"
  echo "== $check, backend ${backend:-default}"
  env ${backend:+MLFABRIC_ALLREDUCE_BACKEND="$backend"} \
    timeout 290 "$root/tools/run/mlfabric-run" -np 2 --ranks_per_host 1 \
    "$python" -X faulthandler "$root/tests/$check.py" 2>&1 | tee "$out"
  [[ $(grep -c "$check rank [0-1]: OK" "$out") == 2 ]]
done
