"""Run in every rank by //tests:elastic_rejoin_test under mlfabric-run's
elastic mode (3 slots): a numpy elastic program (mlfabric.elastic.run,
ObjectState with a step counter and a numpy array, one allreduce and one
commit per step) that trains at least STEPS steps and until its size is
WANT again, so a rank killed mid-run must be replaced and re-rendezvous
before the job can end. Each rank writes its pid to DIR/pid-<worker
name>, rank 0 its step to DIR/progress, and every rank its final state
to DIR/final-<worker name>: "step total size rank generation members".

    elastic_rejoin_check.py DIR STEPS WANT
"""
import faulthandler
import os
import sys
import time

faulthandler.dump_traceback_later(120, exit=True)  # never hang the test
import numpy as np

import mlfabric
import mlfabric.elastic

out, steps, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
name = os.environ["MLFABRIC_WORKER_NAME"]
with open(os.path.join(out, "pid-" + name), "w") as f:
    f.write("%d\n" % os.getpid())

mlfabric.init()
state = mlfabric.elastic.ObjectState(step=0, total=np.zeros(4, np.float64))


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


@mlfabric.elastic.run
def train(state):
    while state.step < steps or mlfabric.size() < want:
        # Every rank adds one: the sum is the size of this membership.
        state.total = state.total + mlfabric.allreduce(np.ones(4, np.float64))
        state.step += 1
        if mlfabric.rank() == 0:
            write(os.path.join(out, "progress"), "%d\n" % state.step)
        state.commit()
        time.sleep(0.02)  # a step of real training takes a while


train(state)
# The generation the ranks trained under last, not the job's membership
# now: a rank that finished first may have left the job already.
generation, members = mlfabric._generation, mlfabric._members
write(os.path.join(out, "final-" + name), "%d %s %d %d %d %s\n" % (
    state.step, ",".join("%g" % v for v in state.total), mlfabric.size(), mlfabric.rank(),
    generation, ",".join(members)))
print("elastic_rejoin_check %s: rank %d of %d, step %d" % (name, mlfabric.rank(), mlfabric.size(),
                                                           state.step))
