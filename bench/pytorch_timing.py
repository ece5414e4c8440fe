"""What the PyTorch sides of the step benchmarks (bench/pytorch_*_step.py) share: the BLAS the
process runs on, and a step's median time."""

import os
import statistics
import time


def loaded_blas():
    """The BLAS libraries mapped into this process (resolved paths), or "unknown"."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "blas" in line.lower() and "/" in line}
    except OSError:
        return "unknown"
    return ", ".join(sorted({os.path.realpath(p) for p in paths})) or "unknown"


def median_step_ms(step, min_time):
    """One untimed step (it faults in the activations' pages), then steps for at least min_time
    seconds (at least one): their median time in ms, and every step's time in ms."""
    step()
    times = []
    start = time.perf_counter()
    while not times or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), times
