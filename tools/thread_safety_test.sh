#!/usr/bin/env bash
# Proves that clang's thread-safety analysis, with the flags the asan build
# applies to every non-test source (.bazelrc; tools/thread_safety_check
# uses the same), fails on a violation: a small class touching an
# ABSL_GUARDED_BY member without its lock and calling a ...Locked helper
# unlocked must fail with clang's thread-safety errors, and the same class
# used correctly must pass (both with common/mutex.h's Mutex, the
# daemon's). The analysis of the tree itself is part of the asan build
# (tools/test). Without clang this reports a skip with the reason (a
# failure under CI, where tools/bootstrap installs clang).
set -euo pipefail
source "${TEST_SRCDIR:-.}/mlfabric/testing/prereq.sh"
if ! command -v clang++ >/dev/null; then
  skip_or_fail "clang++ is not installed (tools/bootstrap installs it from tools/deps/clang.deb)"
fi
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

# snippet NAME BODY: a class with a guarded counter, and BODY as one of its
# methods; writes it to $tmp/NAME.cc.
snippet() {
  cat >"$tmp/$1.cc" <<SNIPPET
#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

using mlfabric::Mutex;
using mlfabric::MutexLock;

class Counter {
 public:
  $2

 private:
  void BumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++count_; }

  Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};
SNIPPET
}
snippet unguarded 'int Bump() { BumpLocked(); return count_; }'
snippet guarded 'int Bump() { MutexLock lock(&mu_); BumpLocked(); return count_; }'

if tools/thread_safety_check "$tmp/unguarded.cc" >"$tmp/unguarded.log" 2>&1; then
  cat "$tmp/unguarded.log"
  echo "thread_safety_test: an unguarded access passed the check; it checks nothing" >&2
  exit 1
fi
for expected in "calling function 'BumpLocked' requires holding mutex 'mu_'" \
                "reading variable 'count_' requires holding mutex 'mu_'"; do
  if ! grep -qF "$expected" "$tmp/unguarded.log"; then
    cat "$tmp/unguarded.log"
    echo "thread_safety_test: the check failed, but without \"$expected\"" >&2
    exit 1
  fi
done
echo "thread_safety_test: an unguarded access fails the check, as it should"
if ! tools/thread_safety_check "$tmp/guarded.cc" >"$tmp/guarded.log" 2>&1; then
  cat "$tmp/guarded.log"
  echo "thread_safety_test: a correctly locked access failed the check" >&2
  exit 1
fi
echo "thread_safety_test: the same access under MutexLock passes"
