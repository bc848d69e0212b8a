#!/usr/bin/env python3
"""Writes the seed corpus of the grpc_handlers fuzz target
(scheduler/service/scheduler_handlers_fuzzer.cc) into grpc_handlers/ beside
this script: a few call sequences a cluster of daemons makes, each a flags
byte then [handler][2-byte big-endian length][request proto] per call.

The protos are encoded by hand (proto/scheduler.proto field numbers) so the
script needs nothing but Python. Run it again after changing the fuzzer's
handler numbering or the protos' field numbers:

    python3 scheduler/service/testdata/fuzz/make_grpc_handlers_corpus.py
"""
import os
import struct

# The fuzzer's Handler enum, in order.
(REGISTER_HOST, REGISTER_ENTITY, SUBMIT_UPDATE, REPORT_COMPLETION, REPORT_BANDWIDTH,
 RESOLVE_SERVER, SYNC_CLOCK, AWAIT_CLOCK, STREAM, END_STREAM, TICK) = range(11)
WORKER, SERVER, REPLICA = 1, 2, 3
FLOAT32, FLOAT64, OPAQUE = 0, 1, 2


def varint(n):
    n &= (1 << 64) - 1  # negative int64s are ten bytes, as protobuf writes them
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def message(*fields):
    """fields: (number, value); str/bytes are length-delimited, float is a
    double, int a varint, a list of bytes repeated embedded messages."""
    out = b""
    for number, value in fields:
        if isinstance(value, list):
            for item in value:
                out += varint(number << 3 | 2) + varint(len(item)) + item
        elif isinstance(value, (str, bytes)):
            data = value.encode() if isinstance(value, str) else value
            out += varint(number << 3 | 2) + varint(len(data)) + data
        elif isinstance(value, float):
            out += varint(number << 3 | 1) + struct.pack("<d", value)
        else:
            out += varint(number << 3) + varint(value)
    return out


def call(handler, payload=b""):
    return bytes([handler]) + struct.pack(">H", len(payload)) + payload


def tick(ms):
    return bytes([TICK]) + struct.pack(">H", ms)


def host(name, up=0.0, down=0.0, version=1):
    return call(REGISTER_HOST, message((1, version), (2, name), (3, "127.0.0.1:1"),
                                       (4, up), (5, down)))


def host_again(name, applied=(), held=()):
    """A host registering again with a restarted scheduler: `applied` the
    pushes its servers applied, `held` (copy, source, incomplete) the
    replica copies its daemon kept."""
    fields = [(1, 1), (2, name), (3, "127.0.0.1:1")]
    fields.append((8, [message((1, t), (2, 3), (3, 1)) for t in applied]))
    fields.append((9, [message((1, "demo"),
                               (2, message((1, copy), (2, 0), (3, "replica:ps0"), (4, 9),
                                           (5, 4096), (6, "w1"), (9, 1.0), (14, 1),
                                           (15, source))),
                               (3, int(incomplete)))
                       for copy, source, incomplete in held]))
    return call(REGISTER_HOST, message(*fields))


def entity(job, token, role, name, on, **extra):
    fields = [(1, job), (2, token), (3, role), (4, name), (5, on)]
    numbers = {"round_size": 6, "delay_bound": 7, "divergence_bound": 8,
               "backup_workers": 9, "app_user": 10, "app_uid": 11}
    fields += [(numbers[k], v) for k, v in extra.items()]
    return call(REGISTER_ENTITY, message(*fields))


def shard(name, on, group, index, count, begin, end):
    """A shard of a server group (RegisterEntityRequest.shard)."""
    spec = message((1, group), (2, index), (3, count), (4, begin), (5, end))
    return call(REGISTER_ENTITY, message((1, "demo"), (2, "demo-token"), (3, SERVER),
                                         (4, name), (5, on), (13, spec)))


def part_ready(name, transfer):
    return call(REPORT_COMPLETION, message((1, name), (2, transfer), (7, 1)))


def push(job, src, server, nbytes=4096, version=0, norm=1.0, dtype=FLOAT32, local_id=1,
         tensors=None):
    fields = [(1, job), (2, src), (3, src), (4, server), (5, nbytes), (6, version),
              (7, norm), (9, local_id), (10, dtype)]
    if tensors:
        fields.append((8, [message((1, i), (2, b)) for i, b in enumerate(tensors)]))
    return call(SUBMIT_UPDATE, message(*fields))


def stream(name, incarnation):
    return call(STREAM, message((1, name), (2, incarnation)))


def complete(name, transfer, applied=True, version=1, error=""):
    fields = [(1, name), (2, transfer), (3, int(applied)), (4, version)]
    if error:
        fields.append((5, error))
    return call(REPORT_COMPLETION, message(*fields))


CORPUS = {
    # Async pushes planned by fifo, streamed, applied; one overdue.
    "async_fifo": bytes([0]) + b"".join([
        host("s1"), host("w1", 1e9, 1e9), host("w2"),
        entity("demo", "demo-token", SERVER, "ps0", "s1"),
        entity("demo", "demo-token", WORKER, "w1", "w1", delay_bound=4),
        push("demo", "w1", "ps0"), push("demo", "w1", "ps0", version=1, local_id=2),
        tick(100), stream("s1", 1), stream("w1", 2),
        complete("s1", 1), call(REPORT_BANDWIDTH, message((1, "w1"), (2, 5e8), (3, 5e8))),
        call(RESOLVE_SERVER, message((1, "demo"), (2, "ps0"))),
        call(SYNC_CLOCK, message((1, "w1"))), tick(5000), stream("w1", 2),
    ]),
    # The mlfabric planner with aggregators w1/w2 and a replica on w2.
    "aggregate_replica": bytes([1]) + b"".join([
        host("s1"), host("w1"), host("w2"), host("w3"),
        entity("demo", "demo-token", SERVER, "ps0", "s1"),
        entity("demo", "demo-token", REPLICA, "ps0", "w2"),
        entity("demo", "demo-token", WORKER, "a", "w1", divergence_bound=0.5),
        entity("demo", "demo-token", WORKER, "b", "w3"),
        push("demo", "w1", "ps0", 1 << 20, norm=0.3),
        push("demo", "w3", "ps0", 1 << 20, norm=0.2, tensors=[1 << 19, 1 << 19]),
        push("demo", "w3", "ps0", 1 << 20, dtype=FLOAT64),
        tick(100), stream("s1", 1), stream("w1", 2), stream("w2", 3), stream("w3", 4),
        complete("s1", 4, version=2), complete("s1", 5, applied=False, error="lost"),
        complete("w2", 6), tick(2000), stream("s1", 1),
    ]),
    # Registrations after a restart: r1 kept two replica copies (one whole,
    # one still arriving), s1 applied one of their pushes; then r1's copy
    # is delivered and reported applied, and a late, bogus one.
    "restart_replica": bytes([1]) + b"".join([
        host_again("r1", held=[(17, 7, False), (18, 8, True), (19, 9, False)]),
        host_again("s1", applied=[7, 9]), host("w1"),
        entity("demo", "demo-token", SERVER, "ps0", "s1"),
        entity("demo", "demo-token", REPLICA, "ps0", "r1"),
        tick(100), stream("r1", 1), complete("r1", 17), complete("r1", 19, applied=False),
        tick(40000), complete("r1", 18),
    ]),
    # A synchronous round of three with one backup worker; a late push.
    "sync_round": bytes([1]) + b"".join([
        host("s1"), host("w1"), host("w2"), host("w3"),
        entity("sync", "sync-token", SERVER, "root", "s1", round_size=3, backup_workers=1),
        push("sync", "w1", "root"), push("sync", "w2", "root"), tick(1),
        push("sync", "w3", "root"), tick(100), stream("s1", 1), stream("w1", 2),
        complete("s1", 1), complete("s1", 2), tick(10000),
        call(RESOLVE_SERVER, message((1, "sync"), (2, "root"))),
    ]),
    # Stale-synchronous workers; one host's stream breaks, then it returns.
    "ssp_clock": bytes([0]) + b"".join([
        host("s1"), host("w1"), host("w2"),
        entity("ssp", "ssp-token", SERVER, "ps", "s1", app_user="alice"),
        entity("ssp", "ssp-token", WORKER, "fast", "w1", app_user="alice"),
        entity("ssp", "ssp-token", WORKER, "slow", "w2", app_user="alice"),
        entity("ssp", "ssp-token", WORKER, "eve", "w2", app_user="eve", app_uid=1001),
        push("ssp", "w1", "ps"), push("ssp", "w1", "ps"), push("ssp", "w1", "ps"),
        call(AWAIT_CLOCK, message((1, "ssp"), (2, "fast"))),
        call(END_STREAM, message((1, "w2"), (2, 3))),
        call(AWAIT_CLOCK, message((1, "ssp"), (2, "fast"))),
        host("w2"), tick(100), stream("w1", 2),
    ]),
    # A server group of three shards: push 1's parts (2-4) are
    # reported ready, released and applied; push 5's part 7 fails before
    # its release; then shard registrations that must be refused.
    "server_group": bytes([1]) + b"".join([
        host("s1"), host("s2"), host("s3"), host("w1"),
        shard("ps-0", "s1", "ps", 0, 3, 0, 1000), shard("ps-1", "s2", "ps", 1, 3, 1000, 2000),
        shard("ps-2", "s3", "ps", 2, 3, 2000, 3000),
        entity("demo", "demo-token", WORKER, "a", "w1"),
        call(RESOLVE_SERVER, message((1, "demo"), (2, "ps"))),
        push("demo", "w1", "ps", 3000), push("demo", "w1", "ps", 3000, local_id=2),
        push("demo", "w1", "ps", 2999), push("demo", "w1", "ps-1", 1000),
        tick(100), stream("s1", 1), stream("s2", 2), stream("s3", 3), stream("w1", 4),
        part_ready("s1", 2), part_ready("s2", 3), part_ready("s3", 4),
        complete("s1", 2), complete("s2", 3), complete("s3", 4),
        part_ready("s1", 6), complete("w1", 7, applied=False, error="connection reset"),
        part_ready("s3", 8), part_ready("s3", 99), tick(5000), stream("s1", 1),
        shard("ps-3", "s1", "ps", 3, 3, 3000, 4000), shard("x", "s1", "ps", 1, 3, 1000, 2000),
        shard("ps-1", "s2", "ps", 1, 4, 1000, 2000), shard("y", "s1", "ps", 0, 1, 5, 9),
        shard("ps", "s1", "ps", 0, 1, 0, 8), shard("z", "s1", "q", 0, 0, 0, 8),
        shard("ps-2", "s3", "ps", 2, 3, 2000, 1000),
    ]),
    # Requests each handler must refuse, naming the field.
    "bad_requests": bytes([0]) + b"".join([
        host("x", version=7), host(""), host("s1", up=float("nan")), host("s1", down=-1.0),
        host("s1"), host("w1"),
        entity("nope", "t", SERVER, "ps0", "s1"),
        entity("demo", "wrong", SERVER, "ps0", "s1"),
        entity("demo", "demo-token", SERVER, "ps0", "ghost"),
        entity("demo", "demo-token", SERVER, "ps0", "s1", round_size=-1),
        entity("demo", "demo-token", SERVER, "ps0", "s1", round_size=2, backup_workers=2),
        entity("demo", "demo-token", WORKER, "w", "w1", delay_bound=-2),
        entity("demo", "demo-token", WORKER, "w", "w1", divergence_bound=float("inf")),
        entity("demo", "demo-token", 9, "w", "w1"),
        entity("demo", "demo-token", SERVER, "ps0", "s1"),
        push("demo", "w1", "ps0", nbytes=-5), push("demo", "w1", "ps0", nbytes=1 << 50),
        push("demo", "w1", "ps0", version=-1), push("demo", "w1", "ps0", norm=float("nan")),
        push("demo", "w1", "ps0", dtype=77), push("demo", "w1", "ps0", tensors=[100]),
        push("demo", "w1", "ps9"), push("demo", "ghost", "ps0"),
        complete("s1", 99), call(REPORT_BANDWIDTH, message((1, "w1"), (2, 0.0), (3, 1.0))),
        call(REPORT_BANDWIDTH, message((1, "ghost"), (2, 1.0), (3, 1.0))),
        call(RESOLVE_SERVER, message((1, "demo"), (2, "ps1"))),
        call(AWAIT_CLOCK, message((1, "nope"))), stream("s1", 42),
    ]),
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpc_handlers")
    os.makedirs(out, exist_ok=True)
    for name, data in CORPUS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
