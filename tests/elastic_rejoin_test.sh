#!/usr/bin/env bash
# Elastic re-rendezvous end to end: mlfabric-run --host-discovery-script
# (this machine, 3 slots) runs tests/elastic_rejoin_check.py, a numpy
# elastic program (ObjectState, an allreduce and a commit per step). Rank
# VICTIM (the argument, default 1) is killed with SIGKILL mid-run; the
# survivors see the membership change at their next commit (rank 1) or at
# once, their rounds failing with the root rank 0 served gone (rank 0), and
# go on as 2 ranks; the launcher starts a replacement, which joins, and all
# three rebuild their AllReducer for the new membership and sync the state
# of the lowest rank that has it (the replacement for rank 0 is rank 0
# again, with no state). The job ends with 0, every rank having written the
# same final state, size 3 and membership generation.
# Skips, saying why, when the venv has no numpy.
set -euo pipefail
victim_rank=${1:-1}
program=${2:-python}  # cpp: tests/elastic_cpp_check (api/elastic.h) in every rank
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
root="$TEST_SRCDIR/mlfabric"
if [[ $program == cpp ]]; then
  rank_command=("$root/tests/elastic_cpp_check")
else
  require_python numpy
  export PYTHONPATH="$root/python"
  rank_command=("$python" -X faulthandler "$root/tests/elastic_rejoin_check.py")
fi
work="$TEST_TMPDIR/rejoin"
mkdir -p "$work"
printf '#!/bin/sh\necho localhost:3\n' > "$work/discover.sh"
chmod +x "$work/discover.sh"
log="$work/run.txt"

timeout 100 "$root/tools/run/mlfabric-run" --host-discovery-script "$work/discover.sh" \
  --discovery_interval_s 0.2 "${rank_command[@]}" "$work" 40 3 > "$log" 2>&1 &
pid=$!
fail() { echo "FAILED: $*"; cat "$log"; kill "$pid" 2>/dev/null || true; exit 1; }

# Rank 0 has done some steps with all three ranks.
for _ in $(seq 600); do
  [[ -s $work/progress && $(cat "$work/progress") -ge 5 ]] && break
  kill -0 "$pid" 2>/dev/null || fail "the job ended before step 5"
  sleep 0.1
done
[[ -s $work/progress && $(cat "$work/progress") -ge 5 ]] || fail "rank 0 did not reach step 5"
[[ -s $work/pid-rank$victim_rank ]] || fail "rank $victim_rank wrote no pid"
victim=$(cat "$work/pid-rank$victim_rank")
kill -KILL "$victim"

code=0; wait "$pid" || code=$?
cat "$log"
[[ $code == 0 ]] || { echo "FAILED: the job exited with $code"; exit 1; }
grep -q "rank $victim_rank on localhost exited with 137: failure 1 of 3 on localhost; replacing it" "$log"
[[ $(cat "$work/pid-rank$victim_rank") != "$victim" ]] ||
  { echo "FAILED: rank $victim_rank was not replaced"; exit 1; }
if [[ $victim_rank == 0 ]]; then
  # The survivors' rounds failed with the root gone, and they rebuilt for
  # the two of them at once (no rank 0 left to agree through).
  grep -q "rank 0 left the job: membership generation [0-9]*, 2 member(s) (rank1, rank2)" "$log" ||
    { echo "FAILED: the survivors did not rebuild without rank 0"; exit 1; }
fi
# The survivors rebuilt for the joiner (first, most often, for the two of
# them alone).
grep -q "the job's membership changed: generation [0-9]*, 3 member(s) (rank0, rank1, rank2)" "$log"
finals=("$work"/final-rank0 "$work"/final-rank1 "$work"/final-rank2)
for f in "${finals[@]}"; do [[ -s $f ]] || { echo "FAILED: no $f"; exit 1; }; done
cat "${finals[@]}"
# step, total, size: the same on every rank; size 3; ranks 0, 1, 2 by name.
[[ $(cut -d' ' -f1-3 "${finals[@]}" | sort -u | wc -l) == 1 ]] ||
  { echo "FAILED: the ranks ended with different states"; exit 1; }
[[ $(cut -d' ' -f5 "${finals[@]}" | sort -u | wc -l) == 1 ]] ||
  { echo "FAILED: the ranks ended in different membership generations"; exit 1; }
# The members each rank trained with last: the three workers, in rank order.
[[ $(cut -d' ' -f6 "${finals[@]}" | sort -u) == "rank0,rank1,rank2" ]] ||
  { echo "FAILED: the members seen at the end differ"; exit 1; }
read -r step total size _ < "$work/final-rank0"
[[ $size == 3 && $step -ge 40 ]] || { echo "FAILED: final size $size, step $step"; exit 1; }
for r in 0 1 2; do
  [[ $(cut -d' ' -f4 "$work/final-rank$r") == "$r" ]] || { echo "FAILED: rank$r's rank"; exit 1; }
done
# Every step added the size of its membership (2 or 3) to each element.
first=${total%%,*}
[[ $total == "$first,$first,$first,$first" ]] || { echo "FAILED: total $total"; exit 1; }
awk -v t="$first" -v s="$step" 'BEGIN { exit !(t >= 2 * s && t <= 3 * s) }' ||
  { echo "FAILED: total $first is not between 2 and 3 times $step steps"; exit 1; }
echo "elastic_rejoin_test: OK"
