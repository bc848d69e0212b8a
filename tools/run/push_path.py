#!/usr/bin/env python3
"""Where a push's time goes between its daemon and its first packet.

Reads the debug logs of a kept cluster directory (mlfabric-run with
MLFABRIC_KEEP_CLUSTER_DIR=1 --daemon_arg --log_level=debug
--scheduler_arg --log_level=debug) and prints, stage by stage, the
median, mean and maximum in milliseconds. The daemons and the scheduler
stamp these lines with the steady clock, which processes on one machine
share, so stages that cross processes are differences of their stamps.

  tools/run/push_path.py /tmp/mlfabric-cluster-XXXXXX [more dirs...]

Per push (each push that its daemon sent over the network):
  submit RPC            the daemon's SubmitUpdate, issue to reply
  daemon -> scheduler   "submitting push" to the scheduler's "push ... at"
  push -> command       "submitting push" to its send command at the daemon
  command -> packet     the send command to "sending transfer ... from"
  push -> first packet  "submitting push" to "sending transfer ... from"
Per synchronous round, along its last push (the one that completed it):
  last submit -> round complete, round complete -> batch cycle,
  batch cycle -> commands queued, round complete -> first/last send
  command at a daemon, last submit -> first packet of the round.
"""
import os
import re
import statistics
import sys

T = r'([0-9]+\.[0-9]+)'


def parse(directory):
    """Returns (pushes by (host, local id), batch cycles, rounds)."""
    pushes = {}
    by_transfer = {}
    hosts = sorted(f[:-4] for f in os.listdir(directory)
                   if f.endswith('.log') and f != 'scheduler.log')
    for host in hosts:
        with open(os.path.join(directory, host + '.log')) as log:
            for line in log:
                m = re.search(r'submitting push \(local id (\d+)\).* at ' + T, line)
                if m:
                    pushes[(host, int(m.group(1)))] = {'host': host, 'submit': float(m.group(2))}
                    continue
                m = re.search(r'submitted push \(local id (\d+)\) as (\d+) in ' + T + ' ms', line)
                if m and (host, int(m.group(1))) in pushes:
                    push = pushes[(host, int(m.group(1)))]
                    push['rpc_ms'] = float(m.group(3))
                    by_transfer[int(m.group(2))] = push
                    continue
                m = re.search(r'send command for transfer (\d+) \(local id (\d+)\) to (\S+) at ' + T,
                              line)
                if m and (host, int(m.group(2))) in pushes:
                    push = pushes[(host, int(m.group(2)))]
                    push['command'] = float(m.group(4))
                    push['remote'] = m.group(3) != host
                    by_transfer[int(m.group(1))] = push
                    continue
                m = re.search(r'sending transfer (\d+) from ' + T, line)
                if m and int(m.group(1)) in by_transfer:
                    by_transfer[int(m.group(1))].setdefault('packet', float(m.group(2)))
    cycles = []
    rounds = {}
    with open(os.path.join(directory, 'scheduler.log')) as log:
        for line in log:
            m = re.search(r'push (\d+) \(local id \d+\) from \S+ for round (\d+) at ' + T, line)
            if m and int(m.group(1)) in by_transfer:
                push = by_transfer[int(m.group(1))]
                push['scheduler'] = float(m.group(3))
                rounds.setdefault(int(m.group(2)), []).append(push)
                continue
            m = re.search(r'batch cycle at ' + T + r': \d+ batch\(es\) planned in ' + T +
                          r' ms, commands queued after ' + T, line)
            if m:
                cycles.append((float(m.group(1)), float(m.group(3))))
    return pushes, cycles, rounds


def main(directories):
    stages = {}

    def add(name, seconds):
        stages.setdefault(name, []).append(seconds * 1e3)

    for directory in directories:
        pushes, cycles, rounds = parse(directory)
        for push in pushes.values():
            if 'rpc_ms' in push:
                stages.setdefault('submit RPC', []).append(push['rpc_ms'])
            if 'scheduler' in push:
                add('daemon -> scheduler', push['scheduler'] - push['submit'])
            if 'command' in push:
                add('push -> command', push['command'] - push['submit'])
            if push.get('remote') and 'packet' in push:
                add('command -> packet', push['packet'] - push['command'])
                add('push -> first packet', push['packet'] - push['submit'])
        for members in rounds.values():
            if not all('command' in p for p in members):
                continue
            last = max(members, key=lambda p: p['scheduler'])
            complete = last['scheduler']
            if min(p['command'] for p in members) < complete:
                continue  # planned before it was complete (a batch tick): not a round's path
            add('round: last submit -> round complete', complete - last['submit'])
            cycle = next((c for c in cycles if c[0] >= complete - 1e-6), None)
            if cycle is not None:
                add('round: round complete -> batch cycle', cycle[0] - complete)
                stages.setdefault('round: batch cycle -> commands queued', []).append(cycle[1])
            add('round: round complete -> first command', min(p['command'] for p in members) -
                complete)
            add('round: round complete -> last command', max(p['command'] for p in members) -
                complete)
            packets = [p['packet'] for p in members if p.get('remote') and 'packet' in p]
            if packets:
                add('round: last submit -> first packet', min(packets) - last['submit'])
    print('%-42s %6s %8s %8s %8s' % ('stage (ms)', 'n', 'median', 'mean', 'max'))
    for name, values in stages.items():
        print('%-42s %6d %8.3f %8.3f %8.3f' % (name, len(values), statistics.median(values),
                                               statistics.mean(values), max(values)))
    return 0 if stages else 1


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
