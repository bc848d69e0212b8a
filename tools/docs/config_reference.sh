#!/bin/bash
# config_reference.sh --write | --check: runs config_reference.py with the
# three binaries from the runfiles. --write (bazel run) rewrites the
# workspace's docs/operations/configuration.md; --check (the test) compares
# it with what the binaries print and checks every config key is in --help.
set -euo pipefail
runfiles="${RUNFILES_DIR:-${TEST_SRCDIR:-$0.runfiles}}/mlfabric"
bins=("$runfiles/scheduler/mlfabric-scheduler" "$runfiles/daemon/mlfabricd"
      "$runfiles/tools/run/mlfabric-run")
script="$runfiles/tools/docs/config_reference.py"
case "${1:-}" in
  --write)
    if [[ -z ${BUILD_WORKSPACE_DIRECTORY:-} ]]; then
      echo "config_reference: run it with bazel run //tools/docs:config_reference" >&2
      exit 2
    fi
    exec python3 "$script" "${bins[@]}" --write "$BUILD_WORKSPACE_DIRECTORY/docs/operations/configuration.md"
    ;;
  --check)
    root="$(cd "$(dirname "$(readlink -f "$script")")/../.." && pwd)"
    if [[ ! -f $root/WORKSPACE ]]; then
      echo "config_reference_test: cannot find the source tree from $script (got $root)" >&2
      exit 1
    fi
    # The check itself: a loader key the help does not name, and a stale
    # reference, must both fail it.
    fixture="$(mktemp -d)"
    trap 'rm -rf "$fixture"' EXIT
    mkdir -p "$fixture/scheduler/service" "$fixture/daemon"
    printf 'reader.Int("no_such_key_anywhere", &x, 0, 1);\n' >"$fixture/scheduler/service/scheduler_config.cc"
    printf 'reader.Int("data_port", &x, 0, 1);\n' >"$fixture/daemon/daemon_config.cc"
    printf '# stale\n' >"$fixture/configuration.md"
    if out="$(python3 "$script" "${bins[@]}" --check "$fixture/configuration.md" --sources "$fixture")"; then
      echo "config_reference_test: the check passed an undocumented key and a stale file" >&2
      exit 1
    fi
    for expected in "reads key 'no_such_key_anywhere'" "configuration.md is out of date"; do
      if ! grep -qF "$expected" <<<"$out"; then
        echo "config_reference_test: the check did not report \"$expected\"; it said:" >&2
        echo "$out" >&2
        exit 1
      fi
    done
    if grep -qF "'data_port'" <<<"$out"; then
      echo "config_reference_test: the check reported data_port, which --help documents" >&2
      exit 1
    fi
    python3 "$script" "${bins[@]}" --check "$root/docs/operations/configuration.md" --sources "$root"
    ;;
  *)
    echo "usage: config_reference.sh --write | --check" >&2
    exit 2
    ;;
esac
