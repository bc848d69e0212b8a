#!/usr/bin/env bash
# mlfabric-run's elastic mode on this machine (tools/run/elastic.h): a host
# discovery script that prints a file the test rewrites; ranks are real
# processes that record their MLFABRIC_* variables and run until told to
# finish. Checks that ranks start per slot, that a rank killed with SIGKILL
# is replaced under its number, that fewer slots and a vanished host stop
# ranks (and the host's daemon), that bad discovery output later is a
# warning that keeps the last hosts, that the host coming back starts ranks
# with the freed numbers, and that the job ends with 0 when its ranks exit
# 0. Then: min-np past --elastic_timeout_s ends a job with an error naming
# the count, a host whose ranks keep failing is blacklisted, bad discovery
# output or a failing script at start is fatal, and bad flags are refused.
# Multi-host elastic runs: tests/mlfabric_run_elastic_hosts_test.sh.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
root="$TEST_SRCDIR/mlfabric"
run="$root/tools/run/mlfabric-run"
work="$TEST_TMPDIR/elastic"
mkdir -p "$work"

# The discovery script prints $work/hosts, or fails if it says "fail".
cat > "$work/discover.sh" <<EOF
#!/bin/sh
grep -q '^fail' "$work/hosts" && { echo "discovery failing on purpose" >&2; exit 3; }
cat "$work/hosts"
EOF
chmod +x "$work/discover.sh"
# A rank: records its variables and pid, runs until $work/done exists.
cat > "$work/rank.sh" <<EOF
#!/bin/sh
echo "start rank=\$MLFABRIC_RANK size=\$MLFABRIC_SIZE host=\$MLFABRIC_HOSTNAME" \
  "elastic=\$MLFABRIC_ELASTIC local=\$MLFABRIC_LOCAL_RANK/\$MLFABRIC_LOCAL_SIZE" \
  "worker=\$MLFABRIC_WORKER_NAME socket=\$MLFABRIC_DAEMON_SOCKET" >> "$work/ranks.txt"
test -S "\$MLFABRIC_DAEMON_SOCKET" || { echo "rank \$MLFABRIC_RANK: no daemon socket" >&2; exit 9; }
echo \$\$ > "$work/rank\$MLFABRIC_RANK.pid"
while [ ! -e "$work/done" ]; do sleep 0.1; done
EOF
chmod +x "$work/rank.sh"

log="$work/run.txt"
# Waits (60 s at most) until the launcher's output has $2 lines matching $1.
wait_for() {
  local pattern=$1 count=${2:-1}
  for _ in $(seq 600); do
    [[ $(grep -c -- "$pattern" "$log" || true) -ge $count ]] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAILED: no${count:+ $count} line(s) '$pattern' in the launcher's output:"; cat "$log"; exit 1
}

echo "== slots, a killed rank, fewer slots, a vanished host, bad output, the host back"
echo "localhost:3" > "$work/hosts"
"$run" --host-discovery-script "$work/discover.sh" --discovery_interval_s 0.2 \
  "$work/rank.sh" > "$log" 2>&1 &
pid=$!
wait_for "host localhost appeared: starting rank 2 (slot 3 of 3; size 3)"
wait_for "host localhost: starting its mlfabricd"
for r in 0 1 2; do
  for _ in $(seq 600); do [[ -s $work/rank$r.pid ]] && break; sleep 0.1; done
done
grep -q "start rank=1 size=3 host=localhost elastic=1 local=1/3 worker=rank1 socket=/tmp/mlfabric-run-hosts-.*/localhost.sock" "$work/ranks.txt"
dir=$(sed -n 's/.*socket=\(.*\)\/localhost.sock$/\1/p' "$work/ranks.txt" | head -1)

old=$(cat "$work/rank1.pid"); rm "$work/rank1.pid"
kill -KILL "$old"
wait_for "rank 1 on localhost exited with 137: failure 1 of 3 on localhost; replacing it"
wait_for "host localhost: starting rank 1 (slot 2 of 3; size 3)"
for _ in $(seq 600); do [[ -s $work/rank1.pid ]] && break; sleep 0.1; done
[[ $(grep -c "start rank=1 " "$work/ranks.txt") == 2 ]]

echo "localhost:1" > "$work/hosts"
wait_for "host localhost has fewer slots: stopping rank 1"
wait_for "host localhost has fewer slots: stopping rank 2"
wait_for "rank 2 on localhost exited with 143 (stopped)"
wait_for "rank 1 on localhost exited with 143 (stopped)"

: > "$work/hosts"
wait_for "host localhost vanished: stopping rank 0"
wait_for "rank 0 on localhost exited with 143 (stopped)"
wait_for "host localhost: stopped its mlfabricd"
[[ ! -e $dir/localhost.sock ]] || { echo "FAILED: the vanished host's socket is left"; exit 1; }

echo "localhost:two" > "$work/hosts"
wait_for "warning: host discovery script $work/discover.sh: line 1 'localhost:two': slots must be an integer >= 1 (expected host or host:slots); keeping the hosts (none)"
echo "fail" > "$work/hosts"
wait_for "warning: host discovery script $work/discover.sh exited with 3; keeping the hosts (none)"

rm -f "$work"/rank*.pid
echo "localhost:2" > "$work/hosts"
wait_for "host localhost appeared: starting rank 1 (slot 2 of 2; size 2)"
wait_for "host localhost: starting its mlfabricd" 2
for r in 0 1; do
  for _ in $(seq 600); do [[ -s $work/rank$r.pid ]] && break; sleep 0.1; done
done
grep -q "start rank=0 size=2 host=localhost elastic=1 local=0/2" "$work/ranks.txt"
touch "$work/done"
code=0; wait "$pid" || code=$?
cat "$log"
[[ $code == 0 ]] || { echo "FAILED: the job exited with $code"; exit 1; }
# Both ranks see $work/done within one poll of each other: either ends first.
grep -qE "rank [01] on localhost exited with 0; the job is finishing" "$log"
[[ ! -e $dir ]] || { echo "FAILED: $dir is left after a job that succeeded"; exit 1; }
[[ -z $(pgrep -f "$dir" || true) ]] || { echo "FAILED: left running:"; pgrep -af "$dir"; exit 1; }

echo "== min-np past the timeout, and a host blacklisted for failing ranks"
echo "localhost:1" > "$work/hosts"
code=0
"$run" --host-discovery-script "$work/discover.sh" --min-np 2 --elastic_timeout_s 1 \
  --discovery_interval_s 0.2 "$work/rank.sh" > "$log" 2>&1 || code=$?
cat "$log"
[[ $code == 1 ]]
grep -q "only 0 rank(s) running, fewer than --min-np 2, for more than 1 s (--elastic_timeout_s); ending the job" "$log"
! grep -q "starting rank" "$log"
# A failed job keeps its logs; the job's config lets rounds finish with
# the ranks that are left.
kept=$(sed -n 's/.*the job exited with 1; logs in \(.*\)$/\1/p' "$log")
grep -q '"member_loss": "shrink"' "$kept/scheduler.json"
rm -rf "$kept"

code=0
"$run" --host-discovery-script "$work/discover.sh" --elastic_timeout_s 1 \
  --discovery_interval_s 0.2 /bin/sh -c 'exit 4' > "$log" 2>&1 || code=$?
cat "$log"
[[ $code == 1 ]]
grep -q "rank 0 on localhost exited with 4: failure 2 of 3 on localhost; replacing it" "$log"
grep -q "rank 0 on localhost exited with 4: failure 3 of 3 on localhost; localhost is blacklisted" "$log"
grep -q "only 0 rank(s) running, fewer than --min-np 1" "$log"
rm -rf "$(sed -n 's/.*the job exited with 1; logs in \(.*\)$/\1/p' "$log")"

echo "== bad discovery at start, bad flags"
expect_refused() {  # expect_refused MESSAGE ARGS...: exit 2 with MESSAGE
  local message=$1; shift
  local out code=0
  out=$("$run" "$@" 2>&1) || code=$?
  [[ $code == 2 && "$out" == *"$message"* ]] ||
    { echo "FAILED: mlfabric-run $*: exit $code, wanted 2 and '$message': $out"; exit 1; }
}
printf 'localhost:2\nlocalhost slots=2\n' > "$work/hosts"
expect_refused "host discovery script $work/discover.sh: line 2 'localhost slots=2': more than one word" \
  --host-discovery-script "$work/discover.sh" true
echo "fail" > "$work/hosts"
expect_refused "host discovery script $work/discover.sh exited with 3" \
  --host-discovery-script "$work/discover.sh" true
printf '#!/bin/sh\nsleep 30\n' > "$work/slow.sh"; chmod +x "$work/slow.sh"
expect_refused "host discovery script $work/slow.sh ran longer than 0.5 s (--discovery_timeout_s) and was killed" \
  --host-discovery-script "$work/slow.sh" --discovery_timeout_s 0.5 true
expect_refused "-np does not go with --host-discovery-script" \
  -np 2 --host-discovery-script "$work/discover.sh" true
expect_refused "--min-np and --max-np need --host-discovery-script" --min-np 2 true
expect_refused "--min-np 3 is more than --max-np 2" \
  --host-discovery-script "$work/discover.sh" --min-np 3 --max-np 2 true
expect_refused "--elastic_timeout_s must be a number of seconds" \
  --host-discovery-script "$work/discover.sh" --elastic_timeout_s soon true
echo "mlfabric-run elastic: ranks followed the discovered slots"
