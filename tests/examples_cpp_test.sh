#!/usr/bin/env bash
# README examples in C++: `mlfabric-run -np 4 ./cpp_worker` (examples/cpp_worker.cc:
# async PS training + AllReduce, exact applied counts) and the many-hosts
# launcher examples/many_hosts.sh with a hostfile naming this machine
# (scheduler + one daemon per slot started by the script, reused by
# mlfabric-run, all stopped afterwards).
set -euo pipefail
root="$TEST_SRCDIR/mlfabric"
run="$root/tools/run/mlfabric-run"
worker="$root/examples/cpp_worker"
out="$TEST_TMPDIR/out.txt"

echo "== mlfabric-run -np 4 cpp_worker"
timeout 120 "$run" -v -np 4 "$worker" 2>&1 | tee "$out"
[[ $(grep -c "cpp_worker rank [0-3]: OK" "$out") == 4 ]]
grep -q "planner mlfabric" "$out"  # mlfabric-run's default planner

echo "== examples/many_hosts.sh hosts.txt 4 cpp_worker"
# The script wants the binaries in one tree: link them from the runfiles.
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin/scheduler" "$bin/daemon" "$bin/tools/run"
ln -sf "$root/scheduler/mlfabric-scheduler" "$bin/scheduler/"
ln -sf "$root/daemon/mlfabricd" "$bin/daemon/"
ln -sf "$run" "$bin/tools/run/"
echo "localhost slots=4" > "$TEST_TMPDIR/hosts.txt"
# Unix socket paths are short (108 bytes): not under $TEST_TMPDIR.
dir=$(mktemp -d /tmp/mlfabric-hosts-test-XXXXXX)
trap 'rm -rf "$dir"' EXIT
MLFABRIC_BIN="$bin" SOCKET_DIR="$dir" timeout 120 "$root/examples/many_hosts.sh" \
  "$TEST_TMPDIR/hosts.txt" 4 "$worker" 2>&1 | tee "$out"
[[ $(grep -c "cpp_worker rank [0-3]: OK" "$out") == 4 ]]
# The ranks used the script's daemons (mlfabric-run started none) ...
grep -q "scheduler at 127.0.0.1:[0-9]*, 4 daemons" "$out"
if grep -q "started mlfabric-scheduler" "$out"; then
  echo "FAIL: mlfabric-run started its own scheduler instead of using the script's"
  exit 1
fi
# ... and the script stopped them (they may take a moment to exit).
for _ in $(seq 100); do
  pgrep -f "$dir/h0.sock" > /dev/null || break
  sleep 0.1
done
if pgrep -f "$dir/h0.sock" > /dev/null; then
  echo "FAIL: a daemon of many_hosts.sh ($dir/h0.sock) still runs 10 s after the script ended"
  exit 1
fi
echo "examples_cpp_test: OK"
