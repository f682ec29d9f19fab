#!/bin/bash
# cpu-per-message.sh SECONDS RATES PORT [PORT...]
#
# Broker CPU time per received message (user+sys of the process listening on
# each PORT, from /proc/PID/stat) for 1 producer and 1 autoack consumer of 16 B
# messages at each publish rate in RATES (comma list; 0 = unthrottled), driven
# by bench/amqp-perf.  Brokers are run interleaved (port by port within each
# rate), so a noisy machine penalises all alike; run it twice or more.
#
#   sh bench/build-perf.sh
#   bash bench/cpu-per-message.sh 4 1000,10000,20000,0 5720 5721
set -u
SECS=$1 RATES=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
TICK=$(getconf CLK_TCK)
for rate in ${RATES//,/ }; do
  for port in "$@"; do
    pid=$(ss -ltnp "sport = :$port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    [ -n "$pid" ] || { echo "nothing listens on $port" >&2; exit 1; }
    t0=$(awk '{print $14+$15}' "/proc/$pid/stat")
    out=$("$HERE/amqp-perf" --port "$port" -z "$SECS" -r "$rate" -a --quiet -u "cpm-$port-$RANDOM" --auto-delete 2>&1 | grep SUMMARY)
    t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
    recv=$(echo "$out" | grep -Eo ' received=[0-9]+' | grep -Eo '[0-9]+')
    awk -v p="$port" -v r="$rate" -v c="$((t1 - t0))" -v t="$TICK" -v n="${recv:-0}" \
      'BEGIN { printf "port %s rate %6s  received %8d  cpu %6.2f s  %6.1f us/msg\n", p, r, n, c / t, (n ? c / t * 1e6 / n : 0) }'
  done
done
