"""
Run ``twistd ottermq ...`` with a measurement window (issue 20).

    PYTHONPATH=. python bench/profile_broker.py OUT_PREFIX -n --pidfile= ottermq --amqp ...

SIGRTMIN+1 opens the window, SIGRTMIN+2 closes it (twistd takes SIGUSR1 to
rotate its log file) and writes ``OUT_PREFIX.gc.json``:
garbage collection time and pauses inside the window (CPython: timed with
``gc.callbacks``; PyPy: ``gc.hooks`` and ``gc.get_stats().total_gc_time``), the
number of threads alive, and the switch interval.  With ``OTTER_PROF_VMPROF=1``
(PyPy) the window is also profiled with vmprof into ``OUT_PREFIX.vmprof``.
The signal handlers run on the reactor thread between events, as every Python
signal handler does; the window's edges are as exact as the reactor's turns.

``OTTER_PROF_SWITCHINTERVAL=S`` sets ``sys.setswitchinterval(S)`` first (an experiment).
bench/profile_persistent.sh starts the broker this way.
"""

import gc
import json
import os
import signal
import sys
import threading
import time

PYPY = hasattr(sys, "pypy_version_info")

out = sys.argv.pop(1)
state = {"open": False, "t0": 0.0, "pauses": [], "gc_ms0": 0.0, "start": None, "vmprof": None}


def _cpythonCallback(phase, info):
    if not state["open"]:
        return
    if phase == "start":
        state["start"] = time.perf_counter()
    elif state["start"] is not None:
        state["pauses"].append((time.perf_counter() - state["start"], info.get("generation", -1)))
        state["start"] = None


def _pypyMinor(stats):
    if state["open"]:
        state["pauses"].append((stats.duration_max, -1, stats.count, stats.duration))


def _pypyStep(stats):
    if state["open"]:
        state["pauses"].append((stats.duration_max, -2, stats.count, stats.duration))


def _pypyCollect(stats):
    if state["open"]:
        state["pauses"].append((0, -3, stats.count, 0))


def _pypyCompiled(*args):
    if state["open"]:
        state["jit"] = state.get("jit", 0) + 1


if PYPY:
    import pypyjit

    pypyjit.set_compile_hook(_pypyCompiled, operations=False)
    gc.hooks.on_gc_minor = _pypyMinor
    gc.hooks.on_gc_collect_step = _pypyStep
    gc.hooks.on_gc_collect = _pypyCollect
else:
    gc.callbacks.append(_cpythonCallback)


def _open(signum, frame):
    state["pauses"] = []
    state["jit"] = 0
    state["t0"] = time.perf_counter()
    state["cpu0"] = time.process_time()
    if PYPY:
        state["gc_ms0"] = gc.get_stats().total_gc_time
    if os.environ.get("OTTER_PROF_VMPROF"):
        import vmprof

        f = open(out + ".vmprof", "w+b")
        vmprof.enable(f.fileno(), period=0.001)
        state["vmprof"] = f
    state["open"] = True


def _close(signum, frame):
    state["open"] = False
    wall = time.perf_counter() - state["t0"]
    cpu = time.process_time() - state["cpu0"]
    if state["vmprof"] is not None:
        import vmprof

        vmprof.disable()
        state["vmprof"].close()
        state["vmprof"] = None
    report = {"wall_s": wall, "process_cpu_s": cpu, "threads": [t.name for t in threading.enumerate()],
              "switchinterval": sys.getswitchinterval(), "interpreter": sys.version}
    if PYPY:
        # gc.hooks durations are in seconds (their sum matches total_gc_time, in ms)
        report["gc_ms"] = gc.get_stats().total_gc_time - state["gc_ms0"]
        minors = [p for p in state["pauses"] if p[1] == -1]
        steps = [p for p in state["pauses"] if p[1] == -2]
        report["minor_count"] = sum(p[2] for p in minors)
        report["minor_ms"] = 1000 * sum(p[3] for p in minors)
        report["minor_max_ms"] = 1000 * max((p[0] for p in minors), default=0)
        report["major_step_count"] = sum(p[2] for p in steps)
        report["major_step_ms"] = 1000 * sum(p[3] for p in steps)
        report["major_step_max_ms"] = 1000 * max((p[0] for p in steps), default=0)
        report["major_steps_over_1ms"] = sum(1 for p in steps if p[0] > 0.001)
        report["jit_compiles"] = state["jit"]
        report["major_done"] = sum(p[2] for p in state["pauses"] if p[1] == -3)
    else:
        pauses = state["pauses"]
        report["gc_ms"] = 1000 * sum(p[0] for p in pauses)
        for gen in (0, 1, 2):
            ps = sorted(p[0] for p in pauses if p[1] == gen)
            report[f"gen{gen}"] = {"count": len(ps), "ms": 1000 * sum(ps),
                                   "max_ms": 1000 * ps[-1] if ps else 0,
                                   "over_1ms": sum(1 for p in ps if p > 0.001)}
        # what the broker's timed full collection (OtterService.gcFullInterval) costs now:
        # after the window, so it disturbs nothing measured
        report["tracked_objects"] = len(gc.get_objects())
        t = time.perf_counter()
        gc.collect()
        report["full_collect_ms"] = 1000 * (time.perf_counter() - t)
        report["frozen_objects"] = gc.get_freeze_count()
    with open(out + ".gc.json", "w") as f:
        json.dump(report, f, indent=1)


if os.environ.get("OTTER_PROF_SWITCHINTERVAL"):
    # an experiment: the GIL switch interval (s) for the whole run
    sys.setswitchinterval(float(os.environ["OTTER_PROF_SWITCHINTERVAL"]))

signal.signal(signal.SIGRTMIN + 1, _open)
signal.signal(signal.SIGRTMIN + 2, _close)

from twisted.scripts.twistd import run  # noqa: E402

sys.argv[0] = "twistd"
run()
