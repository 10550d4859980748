#!/usr/bin/env python3
"""Kafka listener against the native protocol on the same workload (issue 13).

Each round starts a fresh `shardlog serve --kafka-listen`, writes N records
read from one prepared file of 1 KB lines, then reads them all back from
offset 0, once through the Kafka listener with `kcat` (librdkafka) and once
with the native CLI (`shardlog produce` / `shardlog consume`, the native
client's defaults). The two sides alternate (ABBA order over the rounds) so
that drift of this shared machine hits both alike.

Both sides are command-line tools reading lines from the same file and
writing values to /dev/null, with the same batching: librdkafka
linger.ms=5, batch.size=1000000, no compression, acks=1,
max.partition.fetch.bytes=1 MiB; the native client's defaults are linger 5
ms, batch 1 MiB, acks leader, 1 MiB per partition. kcat is used rather than
confluent-kafka's Python API because a Python loop calling produce() per
record costs more CPU per record than librdkafka itself (the client would
be the bottleneck, not the listener); kcat -P -l feeds librdkafka from C.

Per phase: wall time, MB/s, broker CPU (utime + stime of the broker process
from /proc/<pid>/stat, all threads) and the client's CPU (rusage of the
child), each per GB moved. With `--mode shared` or `--mode per-shard` only
the Kafka side runs, once per mode (`--kafka-advertise`), for the
forwarding comparison.

    bench/scripts/kafka-vs-native.py --bin target/release/shardlog \
        --records 1000000 --rounds 3 --out perf-reports/x.json
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def broker_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of stat (utime, stime), counted after the comm field.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Broker:
    def __init__(self, binary, shards, partitions, advertise, data_root):
        self.dir = tempfile.mkdtemp(prefix="kbench-", dir=data_root)
        args = [binary, "serve", "--listen", "127.0.0.1:0", "--no-pin-cores", "--shards", str(shards),
                "--data-dir", self.dir, "--kafka-listen", "127.0.0.1:0"]
        if advertise:
            args += ["--kafka-advertise", advertise]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("shardlog ready: "):
            raise SystemExit(f"broker did not start: {line!r}")
        words = dict(w.split("=", 1) for w in line.split()[2:] if "=" in w)
        self.listen, self.kafka = words["listen"], words["kafka"]
        self.binary = binary
        run([binary, "topic", "create", "t", "--partitions", str(partitions)], self.env())

    def env(self):
        return dict(os.environ, SHARDLOG_BOOTSTRAP=self.listen)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def run(args, env=None, stdin=None, stdout=subprocess.DEVNULL):
    p = subprocess.Popen(args, env=env, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode(errors="replace")
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({p.returncode}): {err[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def phase(broker, args, env=None, stdin_path=None):
    cpu0, t0 = broker_cpu_s(broker.proc.pid), time.monotonic()
    if stdin_path:
        with open(stdin_path, "rb") as f:
            client = run(args, env, stdin=f)
    else:
        client = run(args, env)
    wall = time.monotonic() - t0
    return {"wall_s": wall, "broker_cpu_s": broker_cpu_s(broker.proc.pid) - cpu0, "client_cpu_s": client}


KCAT_PRODUCE = ["-X", "linger.ms=5", "-X", "batch.size=1000000", "-X", "acks=1", "-z", "none"]
KCAT_CONSUME = ["-X", "max.partition.fetch.bytes=1048576"]


def kafka_side(broker, data, records, partitions):
    kcat = ["kcat", "-b", broker.kafka, "-t", "t", "-q"]
    target = ["-p", "0"] if partitions == 1 else []
    produce = phase(broker, kcat + ["-P"] + target + KCAT_PRODUCE + ["-l", data])
    consume = phase(broker, kcat + ["-C", "-o", "beginning", "-e", "-f", "%s\n"] + KCAT_CONSUME)
    return produce, consume


def native_side(broker, data, records, partitions):
    b, env = broker.binary, broker.env()
    target = ["--partition", "0"] if partitions == 1 else []
    produce = phase(broker, [b, "produce", "t"] + target, env, stdin_path=data)
    consume = phase(broker, [b, "consume", "t", "--from-beginning", "--max-messages", str(records)] + target, env)
    return produce, consume


def per_gb(p, gb):
    return {**p, "mb_per_s": gb * 1000 / p["wall_s"], "broker_cpu_s_per_gb": p["broker_cpu_s"] / gb,
            "client_cpu_s_per_gb": p["client_cpu_s"] / gb}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="the shardlog binary (release build)")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--sides", default="kafka,native",
                    help="kafka,native, or advertise modes: shared,per-shard (Kafka side in each)")
    ap.add_argument("--data-dir", default=None, help="parent of the brokers' data directories")
    ap.add_argument("--out", default=None, help="JSON report to write")
    a = ap.parse_args()

    fd, data = tempfile.mkstemp(prefix="kbench-records-", dir=a.data_dir)
    line = (b"x" * (a.record_bytes - 1)) + b"\n"
    with os.fdopen(fd, "wb") as f:
        for i in range(a.records):
            head = b"%012d" % i
            f.write(head + line[len(head):])
    gb = a.records * a.record_bytes / 1e9
    sides = a.sides.split(",")
    results = {s: [] for s in sides}
    try:
        for r in range(a.rounds):
            order = sides if r % 2 == 0 else list(reversed(sides))
            for side in order:
                advertise = side if side in ("shared", "per-shard") else None
                broker = Broker(a.bin, a.shards, a.partitions, advertise, a.data_dir)
                try:
                    fn = native_side if side == "native" else kafka_side
                    produce, consume = fn(broker, data, a.records, a.partitions)
                finally:
                    broker.stop()
                got = {"produce": per_gb(produce, gb), "consume": per_gb(consume, gb)}
                results[side].append(got)
                print(f"round {r} {side:9} produce {got['produce']['mb_per_s']:7.1f} MB/s "
                      f"broker {got['produce']['broker_cpu_s_per_gb']:.2f} s/GB | consume "
                      f"{got['consume']['mb_per_s']:7.1f} MB/s broker "
                      f"{got['consume']['broker_cpu_s_per_gb']:.2f} s/GB", file=sys.stderr, flush=True)
    finally:
        os.unlink(data)

    summary = {}
    for side, runs in results.items():
        summary[side] = {
            ph: {k: statistics.median(x[ph][k] for x in runs)
                 for k in ("mb_per_s", "broker_cpu_s_per_gb", "client_cpu_s_per_gb")}
            for ph in ("produce", "consume")}
    if len(sides) == 2:
        a_, b_ = sides
        summary["ratio"] = {ph: summary[a_][ph]["mb_per_s"] / summary[b_][ph]["mb_per_s"]
                            for ph in ("produce", "consume")}
        # Paired per round (the same round's two sides ran back to back).
        summary["ratio_per_round"] = {
            ph: [x[ph]["mb_per_s"] / y[ph]["mb_per_s"] for x, y in zip(results[a_], results[b_])]
            for ph in ("produce", "consume")}
    git = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"git_sha": git, "kernel": os.uname().release, "args": vars(a), "runs": results, "summary": summary,
           "kcat": subprocess.run(["kcat", "-V"], capture_output=True, text=True).stdout.split("\n")[0],
           "unix_time_s": int(time.time())}
    print(json.dumps(summary, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
