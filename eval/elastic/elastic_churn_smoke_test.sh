#!/usr/bin/env bash
# elastic_churn.sh end to end at a tiny size: 3 slots, one non-zero rank
# SIGKILLed and replaced, 60 steps; checks the JSON it writes for what
# breaks when elasticity does: the replacement took a step, every rank
# ended at size 3 with the same weights, no (generation, step) whose
# ranks logged different weights or sums, completed and failed on
# different ranks, or held workers of another generation. No timing is
# asserted. MODEL (the argument, default softmax): keras trains the Keras
# MLP in a KerasState, 200 steps (a replacement's TensorFlow import takes
# seconds). Skips, saying why, without numpy/sklearn (and TensorFlow for
# keras) in the venv.
set -euo pipefail
model=${1:-softmax}
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
steps=60
if [[ $model == keras ]]; then
  require_python numpy sklearn tensorflow
  steps=200
else
  require_python numpy sklearn
fi
root="$TEST_SRCDIR/mlfabric"
out="$TEST_TMPDIR/churn.json"
"$root/eval/elastic/elastic_churn.sh" --slots 3 --kills 1 --steps "$steps" --warmup_steps 10 \
  --spacing_s 0 --skip no_faults,shrink --model "$model" --work "$TEST_TMPDIR/work" --json "$out"
"$python" - "$out" <<'PY'
import json, sys
figures = json.load(open(sys.argv[1]))["figures"]
churn = figures["churn"]
def check(ok, what):
    if not ok:
        sys.exit("FAILED: %s: %s" % (what, json.dumps(churn)))
check(len(churn["kills"]) == 1, "one kill")
check(churn["kills"][0]["replacement_first_step_s"] is not None, "the replacement stepped")
check(churn["kills"][0]["survivors_next_step_s"] is not None, "the survivors stepped on")
check(churn["exit_code"] == 0, "the job exited with 0")
check(churn["final_ranks"] == 3 and churn["final_sizes"] == [3], "3 ranks at the end")
check(churn["final_weights_equal"], "the same final weights on every rank")
check(churn["final_step"] >= figures["steps"], "%d steps" % figures["steps"])
rounds = churn["rounds"]
check(rounds["rounds"] >= figures["steps"], "a round per step")
for bad in ("weights_differ", "sums_differ", "mixed_outcome", "mixed_generation"):
    check(rounds.get(bad, 0) == 0, bad)
check(churn["membership_changes"] >= 1, "a membership change")
check(not churn["unplanned_exits"], "no rank exit the test did not cause")
print("elastic_churn_smoke_test (%s): OK" % figures.get("model", "softmax"))
PY
