#!/usr/bin/env bash
# A CPU flame graph of the operator through the benchmark's 100-target batches (the overhead scenario of
# `make bench`: 1000 Deployments, batches of 100, each transition judged against the bare client's gap).
# Needs a cluster (`make cluster`), perf, and inferno (`cargo install inferno`). Writes
# bench/results/transition-flamegraph.svg. perf samples only what runs on a CPU: the waits inside a
# transition (the watch, the status write, the first patch) are the benchmark's rows, not this graph.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=bench/results/transition-flamegraph.svg
work=target/profile
mkdir -p "$work"
command -v perf >/dev/null || { echo "perf is required (Debian: linux-perf)" >&2; exit 1; }
command -v inferno-flamegraph >/dev/null || { echo "inferno is required: cargo install inferno" >&2; exit 1; }

cargo build --locked --release --bins --test bench
cargo test --locked --release --test bench -- --full --only overhead >"$work/bench.log" 2>&1 &
bench=$!
# The benchmark starts its operator once the fleet is up; profile it from then until it exits.
pid=""
for _ in $(seq 1 600); do
  pid=$(pgrep -f "release/fleetroll operator" | head -n1 || true)
  [ -n "$pid" ] && break
  kill -0 "$bench" 2>/dev/null || { cat "$work/bench.log" >&2; exit 1; }
  sleep 1
done
[ -n "$pid" ] || { echo "the benchmark's operator did not start" >&2; exit 1; }
# DWARF unwinding from .eh_frame: the release build keeps its symbols and needs no frame pointers.
perf record -q -F 499 --call-graph dwarf,16384 -p "$pid" -o "$work/perf.data" 2>"$work/perf.log" || true
wait "$bench"
grep -E '^\| (batch transition, [0-9]+ transitions of 100|bare client|one status write|where a transition)' \
  "$work/bench.log" || true
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf >"$work/stacks.folded"
inferno-flamegraph --title "fleetroll operator: 1000 Deployments in batches of 100, twice (on-CPU)" \
  --width 1600 <"$work/stacks.folded" >"$out"
echo "wrote $out ($(wc -l <"$work/stacks.folded") stacks)"
