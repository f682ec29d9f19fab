#!/usr/bin/env bash
# Instructions per message of bench/hotpath.py under callgrind (noise-free on a shared machine):
# (instructions at 30,000 messages - instructions at 10,000) / 20,000, for autoack, --ack and
# --persistent.  Usage: bench/callgrind_hotpath.sh [PYTHON]   (default .venv-test/bin/python)
# Run it in each checkout to compare (before/after) on the same machine; prints one line per mode.
# PYTHONHASHSEED is fixed (0 unless set), since string hashing moves the count by about 1 % between
# runs of the same code.  To measure another checkout with this venv: PYTHONPATH=/that/checkout.
set -eu
export PYTHONHASHSEED=${PYTHONHASHSEED:-0}
cd "$(dirname "$0")/.."
PY=${1:-$PWD/.venv-test/bin/python}
count() {  # args -> total instructions (Ir) of one run
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$PY" bench/hotpath.py "$@" 2>&1 >/dev/null \
    | grep -Eo 'Collected : [0-9]+' | grep -Eo '[0-9]+'
}
for mode in "" "--ack" "--persistent"; do
  a=$(count --messages 10000 $mode); b=$(count --messages 30000 $mode)
  echo "hotpath ${mode:-autoack}: $(( (b - a) / 20000 )) instructions/message"
done
