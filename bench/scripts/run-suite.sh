#!/usr/bin/env bash
# Runs the standard benchmark suite (bench/workloads/*.toml) against brokers
# that shardlog-bench spawns, after measuring the machine's limits in the
# same session, and regenerates the table in perf-reports/README.md.
#
#   bench/scripts/run-suite.sh            full suite, 3 repetitions (about an hour)
#   bench/scripts/run-suite.sh --quick    short variant, 1 repetition (under 5 minutes)
#   bench/scripts/run-suite.sh --quick -- --shards 2 --broker-cpus 0-1
#
# Arguments after `--` go to every `shardlog-bench run`. Set OUT=DIR to write
# somewhere else than perf-reports/, WORKLOADS="a.toml b.toml" to run a subset.
# A workload that fails is reported and the suite goes on; the exit status is
# non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

quick=()
reps=3
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=(--quick); reps=1; shift ;;
        --repetitions|-n) reps="$2"; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
extra=("$@")
out="${OUT:-perf-reports}"

echo "== building (release): shardlog, shardlog-bench"
cargo build --release -p shardlog -p shardlog-bench
bench=target/release/shardlog-bench

echo "== machine limits (fio, iperf3, memcpy)"
"$bench" limits "${quick[@]}" --dir target --out "$out"

failed=()
start=$(date +%s)
for w in ${WORKLOADS:-bench/workloads/*.toml}; do
    echo "== $(basename "$w" .toml)"
    if ! "$bench" run "$w" --spawn-broker -n "$reps" "${quick[@]}" --out "$out" --no-readme "${extra[@]}"; then
        echo "!! $(basename "$w" .toml) failed" >&2
        failed+=("$(basename "$w" .toml)")
    fi
done
"$bench" readme --out "$out"
echo "== suite finished in $(( $(date +%s) - start )) s; table in $out/README.md"
if [ ${#failed[@]} -gt 0 ]; then
    echo "!! failed workloads: ${failed[*]}" >&2
    exit 1
fi
