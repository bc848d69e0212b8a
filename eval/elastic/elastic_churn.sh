#!/usr/bin/env bash
# The elastic-training experiment (eval/elastic/README.md): 4 ranks of
# elastic_train.py under mlfabric-run --host-discovery-script, non-zero
# ranks killed with SIGKILL, figures against the targets.
#   eval/elastic/elastic_churn.sh --kills 1 --steps 300 --json /tmp/churn.json
#   eval/elastic/elastic_churn.sh --help
# From the source tree it uses bazel-bin/ (build first:
# bazel build //tools/run:mlfabric-run //python:runtime); under bazel run or
# bazel test, its runfiles.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -n ${RUNFILES_DIR:-} && -d $RUNFILES_DIR/mlfabric ]]; then
  root=$RUNFILES_DIR/mlfabric
elif [[ -d $0.runfiles/mlfabric ]]; then
  root=$0.runfiles/mlfabric
elif [[ -n ${TEST_SRCDIR:-} && -d $TEST_SRCDIR/mlfabric ]]; then
  root=$TEST_SRCDIR/mlfabric
else
  root=$(cd "$here/../.." && pwd)
fi
run=$root/tools/run/mlfabric-run
[[ -x $run ]] || run=$root/bazel-bin/tools/run/mlfabric-run
built_lib=false
for dir in "$root/python" "$root/bazel-bin/python"; do
  [[ -e $dir/libmlfabric_pycore.so ]] && built_lib=true
done
if [[ ! -x $run || $built_lib == false ]]; then
  echo "elastic_churn: MLfabric is not built (needs bazel-bin/tools/run/mlfabric-run and" \
       "bazel-bin/python/libmlfabric_pycore.so); run:" \
       "bazel build //tools/run:mlfabric-run //python:runtime" >&2
  exit 2
fi
python=${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python
if ! "$python" -c "import numpy, sklearn" 2>/dev/null; then
  echo "elastic_churn: $python cannot import numpy and sklearn" \
       "(set MLFABRIC_VENV, or run tools/bootstrap)" >&2
  exit 2
fi
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
export MLFABRIC_COMMAND="eval/elastic/elastic_churn.sh $*"
MLFABRIC_COMMIT=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
export MLFABRIC_COMMIT
exec "$python" "$root/eval/elastic/elastic_churn.py" --run "$run" --python "$python" "$@"
