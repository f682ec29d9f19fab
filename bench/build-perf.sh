#!/bin/sh
# Build bench/amqp-perf (a PerfTest-style AMQP 0-9-1 load generator on
# rabbitmq-c) from bench/amqp-perf.c.  Idempotent: installs librabbitmq-dev
# (and gcc) with apt-get only when missing, and rebuilds only when the
# binary is missing or older than the source.
#
#   sh bench/build-perf.sh          # -> bench/amqp-perf
#   FORCE=1 sh bench/build-perf.sh  # rebuild anyway
set -eu

here=$(cd "$(dirname "$0")" && pwd)
src="$here/amqp-perf.c"
out="$here/amqp-perf"

have_header() {
    echo '#include <amqp.h>' | ${CC:-cc} -E -x c - >/dev/null 2>&1
}

if ! command -v "${CC:-cc}" >/dev/null 2>&1; then
    need="gcc libc6-dev"
else
    need=""
fi
if [ -n "$need" ] || ! have_header; then
    need="$need librabbitmq-dev"
    echo "build-perf: installing$(printf ' %s' $need) with apt-get" >&2
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    if ! $sudo apt-get install -y --no-install-recommends $need >/dev/null; then
        $sudo apt-get update -qq
        $sudo apt-get install -y --no-install-recommends $need >/dev/null
    fi
    have_header || { echo "build-perf: <amqp.h> still not found" >&2; exit 1; }
fi

if [ -z "${FORCE:-}" ] && [ -x "$out" ] && [ "$out" -nt "$src" ] && [ "$out" -nt "$0" ]; then
    echo "build-perf: $out is up to date" >&2
    exit 0
fi

${CC:-cc} -O2 -Wall -o "$out.tmp" "$src" -lrabbitmq -lpthread
mv -f "$out.tmp" "$out"
echo "build-perf: built $out" >&2
