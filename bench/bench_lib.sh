# Shell helpers shared by the benchmark scripts that alternate mlfabric and
# Open MPI under mlfabric-run and write their runs as JSON
# (allreduce_hosts.sh, collectives_one_host.sh). Sourced, not run; the
# script sets `prog` (its name, for messages) and `invocation` (its $0 and
# arguments) first.

# The mean milliseconds of one run of `allreduce_benchmark` printing "X ms
# per $1" (the rest: the command); exits the script, saying why, if the
# run fails or prints no such line.
mean_ms() {
  local name="$1" out ms
  shift
  if ! out=$("$@" 2>&1); then
    echo "$prog: failed: $*" >&2
    echo "$out" | tail -5 >&2
    exit 1
  fi
  ms=$(echo "$out" | sed -n "s/.*: \([0-9.]*\) ms per $name .*/\1/p" | tail -1)
  if [[ -z "$ms" ]]; then
    echo "$prog: no \"ms per $name\" line in the output of: $*" >&2
    echo "$out" | tail -5 >&2
    exit 1
  fi
  echo "$ms"
}

# The arguments after the first, joined by the first.
join_by() {
  local separator="$1" out="" item
  shift
  for item in "$@"; do out+="${out:+$separator}$item"; done
  echo "$out"
}

# A JSON string of $1 (command lines hold no control characters).
json_string() {
  local s="${1//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '"%s"' "$s"
}

# The command that measured this run, without --json and --bazel_bin:
# arguments with spaces in double quotes, as docs/results.md writes them.
measured_command() {
  local words=("bench/$prog") i
  for ((i = 1; i < ${#invocation[@]}; ++i)); do
    case "${invocation[i]}" in
      --json|--bazel_bin) ((++i)); continue ;;
    esac
    if [[ "${invocation[i]}" =~ [[:space:]] ]]; then
      words+=("\"${invocation[i]}\"")
    else
      words+=("${invocation[i]}")
    fi
  done
  echo "bazel build //api:allreduce_benchmark //tools/run:mlfabric-run && ${words[*]}"
}

# Sum of the first list over the sum of the second ("a b -- c d").
ratio_of() {
  printf '%s\n' "$@" | awk '/--/{m=1; next} {if (m) b+=$1; else a+=$1} END {printf "%.2f", a / b}'
}
