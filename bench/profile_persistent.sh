#!/bin/sh
# Profile a whole otter_tx broker under one amqp-perf scenario (issue 20).
#
#   sh bench/profile_persistent.sh PYTHON SCENARIO [SECONDS] [WARMUP]
#
# PYTHON: the interpreter of a venv with otter_tx's dependencies (CPython with
# py-spy installed in the same venv, or PyPy with vmprof).  SCENARIO: confirm100
# (1 KiB persistent, confirms 100, prefetch 100, ack each), confirm192 (12 B
# persistent, confirms 192, prefetch 200, multi-ack every 200) or autoack (16 B,
# in memory).  The broker runs this checkout (repo root first on PYTHONPATH)
# with a fresh --data-dir; amqp-perf runs WARMUP s (default 5, the JIT's warm-up
# on PyPy) before the SECONDS s window (default 15) that is profiled:
#   CPython: py-spy record --native --idle --threads --format raw (needs ptrace: root)
#   PyPy:    vmprof inside the process (bench/profile_broker.py, OTTER_PROF_VMPROF=1)
# Both: GC time and pauses in the window (bench/profile_broker.py).
# RATE=N: publish at N msg/s (amqp-perf --rate); PROFILER=none: only the GC
# figures (no sampling), e.g. for the latency tails at fixed rates.
# Outputs go to $OUT (default /tmp/prof/<interpreter>-<scenario>.*) and the
# summary by category to stdout (bench/profile_summary.py).
set -eu
PY=$1
SCEN=$2
SECS=${3:-15}
WARM=${4:-5}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PERF=$REPO/bench/amqp-perf
[ -x "$PERF" ] || sh "$REPO/bench/build-perf.sh"
case $SCEN in
  confirm100) ARGS="-x 1 -y 1 -s 1024 --persistent --confirm 100 --prefetch 100 --durable";;
  confirm192) ARGS="-x 1 -y 1 -s 12 --persistent --confirm 192 --prefetch 200 --multi-ack-every 200 --durable";;
  autoack) ARGS="-x 1 -y 1 -s 16 --autoack --auto-delete";;
  *) echo "unknown scenario $SCEN" >&2; exit 2;;
esac
IMPL=$("$PY" -c 'import sys; print(sys.implementation.name)')
mkdir -p /tmp/prof
OUT=${OUT:-/tmp/prof/$IMPL-$SCEN}
DATA=$(mktemp -d /tmp/prof/data.XXXXXX)
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
rm -f "$OUT".*
if [ "$IMPL" = pypy ]; then
  export PYPY_GC_NURSERY=${PYPY_GC_NURSERY:-4MB}
  [ "${PROFILER:-}" = none ] || export OTTER_PROF_VMPROF=1
fi
[ -z "${RATE:-}" ] || ARGS="$ARGS --rate $RATE"
PYTHONPATH=$REPO "$PY" "$REPO/bench/profile_broker.py" "$OUT" -n --pidfile= \
  ottermq --amqp "tcp:$PORT:interface=127.0.0.1" --management tcp:0 --prometheus none --stream none --data-dir "$DATA/data" > "$DATA/twistd.log" 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null || true' EXIT
i=0
until "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1',$PORT),1)" 2>/dev/null; do
  i=$((i+1)); [ $i -lt 300 ] || { tail "$DATA/twistd.log"; exit 1; }; sleep 0.1
done
# shellcheck disable=SC2086
"$PERF" --host 127.0.0.1 --port "$PORT" --time $((WARM + SECS + 2)) --cleanup --id "$SCEN" \
  --queue "prof-$SCEN" $ARGS > "$OUT.perf.txt" 2>&1 &
LOAD=$!
sleep "$WARM"
kill -s RTMIN+1 $BROKER
if [ "$IMPL" = cpython ] && [ "${PROFILER:-}" != none ]; then
  "$(dirname "$PY")/py-spy" record --native --idle --threads --format raw -r 200 -d "$SECS" \
    -p $BROKER -o "$OUT.collapsed" > "$OUT.pyspy.log" 2>&1
else
  sleep "$SECS"
fi
kill -s RTMIN+2 $BROKER
wait $LOAD || true
kill $BROKER; wait $BROKER || true
trap - EXIT
rm -rf "$DATA"
grep SUMMARY "$OUT.perf.txt" || tail -3 "$OUT.perf.txt"
"$PY" "$REPO/bench/profile_summary.py" "$OUT"
