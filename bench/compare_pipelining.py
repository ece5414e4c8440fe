#!/usr/bin/env python3
"""gpipe on 2 MPI ranks against torch.distributed.pipelining on 2 gloo processes, one table.

Runs, alternating, for --rounds rounds: bench_mpi_pipeline_compare under `mpirun -n 2` (GPipe and
1F1B at M = 4, ZB-H1 at M = 8), bench/pytorch_pipeline_step.py (ScheduleGPipe and Schedule1F1B at
M = 4), then bench_mpi_pipeline_compare in one process (K = 1, and K = 2 with the same schedules):
the same GPT, cut, weights (one safetensors file that the PyTorch script writes first), batch and
AdamW step, one thread per rank (OMP_NUM_THREADS=MKL_NUM_THREADS=1; with --pin, the default, rank r
runs on core r: `mpirun --bind-to core` and sched_setaffinity). Each program reports a row's median
step over --steps timed steps; the table gives each row's median over the rounds (and the range).
Each program starts once no other process has used over 20 % of a core for 3 s, and a run during
which one did is repeated (--max-tries; --no-wait-quiet runs at once).

Targets (issue 32): gpipe's 2-rank step at most 0.8x PyTorch's for GPipe and 1F1B; at most 1.1x
gpipe's own K = 2 step in one process; the best 2-rank schedule at least 1.8x faster than gpipe's
one-process K = 1 step; every 2-rank step within 5 % of simulate()'s prediction from the measured
per-op times (plus the measured optimizer time). First losses must agree to 1e-5 (relative).

Usage: bench/compare_pipelining.py [--build build/release] [--rounds 3] [--steps 5]
         [--python PYTHON] [--no-pin] [--mpi-tcp] [--markdown FILE] [--no-wait-quiet]
         [--max-tries 4]
--python: a Python whose torch has torch.distributed.pipelining and runs Schedule1F1B on gloo
(torch 2.15 does; 2.5.1 hangs there); default python3 on PATH, else /usr/bin/python3.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "pytorch_pipeline_step.py")
SCHEDULES = [("GPipe", 4), ("1F1B", 4), ("ZB-H1", 8)]  # the 2-rank rows; PyTorch runs the first two
TORCH_SCHEDULES = "GPipe:4,1F1B:4"


def pipelining_python(explicit):
    """A Python that imports torch.distributed.pipelining, or exit saying why there is none."""
    candidates = [explicit] if explicit else [shutil.which("python3"), "/usr/bin/python3"]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import torch.distributed.pipelining"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return candidate
    sys.exit("compare_pipelining: no Python here imports torch.distributed.pipelining (tried "
             f"{', '.join(filter(None, candidates))}); pip install torch (2.15 was used) "
             "or pass --python")


def mpi_env(tcp=False):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if tcp:  # Open MPI between the ranks over TCP on loopback, as gloo is, not shared memory
        env.update(OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo")
    if os.geteuid() == 0:  # containers: Open MPI refuses root without these
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


class Quiet:
    """Other processes' CPU use, to time only when nothing else runs: the machine may be shared
    (compiles, other benchmarks). A process is another's unless it descends from this one; one
    that uses over 20 % of a core while a program runs disturbs that run, which is repeated."""

    def __init__(self, max_tries):
        self.max_tries, self.repeated = max_tries, []
        self.tick = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def sample():
        """{pid: (cpu ticks, parent pid, name)} of every process."""
        out = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            out[int(pid)] = (int(fields[11]) + int(fields[12]), int(fields[1]), name)
        return out

    def others(self, before, after, seconds):
        """'name:percent' of the processes that are not ours and used over 20 % of a core."""
        def ours(pid):
            while pid > 1:
                if pid == os.getpid():
                    return True
                pid = after.get(pid, (0, 0))[1]
            return False
        return [f"{after[p][2]}:{100 * (after[p][0] - before[p][0]) / self.tick / seconds:.0f}%"
                for p in after if p in before and not ours(p)
                and after[p][0] - before[p][0] > 0.2 * self.tick * seconds]

    def run(self, what, work):
        """work() once nothing else runs, again (up to max_tries) while another process disturbs it."""
        import threading
        for attempt in range(1, self.max_tries + 1):
            while True:  # wait for 3 quiet seconds
                before = self.sample()
                time.sleep(3)
                if not self.others(before, self.sample(), 3):
                    break
            seen, stop = [], threading.Event()

            def watch():
                previous = self.sample()
                while not stop.wait(2):
                    current = self.sample()
                    seen.extend(self.others(previous, current, 2))
                    previous = current
            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                result = work()
            finally:
                stop.set()
                watcher.join()
            if not seen or attempt == self.max_tries:
                if seen:
                    self.repeated.append(f"{what}: still disturbed after {attempt} tries ({' '.join(seen[:4])})")
                return result
            self.repeated.append(f"{what}: repeated, disturbed by {' '.join(sorted(set(seen))[:4])}")
            print(f"compare_pipelining: {self.repeated[-1]}", file=sys.stderr)


def run_gpipe(program, ranks, weights, steps, pin, work, tcp=False):
    """{row name: counters} of one run of bench_mpi_pipeline_compare."""
    out = os.path.join(work, f"gpipe_{ranks}.json")
    args = [program, f"--weights={weights}", f"--steps={steps}", f"--benchmark_out={out}",
            "--benchmark_out_format=json"]
    if ranks == 2:
        bind = ["--bind-to", "core", "--map-by", "core"] if pin else ["--bind-to", "none"]
        args = ["mpirun", "-n", "2", *bind] + args
    done = subprocess.run(args, env=mpi_env(tcp), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"compare_pipelining: {' '.join(args)} exited with {done.returncode}:\n"
                 f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    with open(out) as f:
        rows = json.load(f)["benchmarks"]
    return {row["name"].split("/iterations")[0]: row for row in rows}


def run_torch(python, weights, steps, pin):
    args = [python, SCRIPT, "--weights", weights, "--steps", str(steps),
            "--schedules", TORCH_SCHEDULES] + (["--pin"] if pin else [])
    done = subprocess.run(args, capture_output=True, text=True, env=mpi_env())
    if done.returncode != 0:
        sys.exit(f"compare_pipelining: {' '.join(args)} exited with {done.returncode}:\n"
                 f"{done.stderr[-4000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["name"]: row for row in rows}


def summary(values):
    """'median (min-max)' of a list of ms."""
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row and program run")
    parser.add_argument("--python", help="a Python with torch.distributed.pipelining")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="leave both programs' ranks unbound (default: rank r on core r)")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--no-wait-quiet", dest="wait_quiet", action="store_false",
                        help="run at once, whatever else runs (default: wait until no other "
                        "process uses over 20 %% of a core, and repeat a disturbed run)")
    parser.add_argument("--max-tries", type=int, default=4, help="runs of a disturbed program")
    parser.add_argument("--mpi-tcp", action="store_true",
                        help="gpipe's ranks talk over TCP on loopback as gloo does (Open MPI's "
                        "tcp transport; default: its shared memory)")
    args = parser.parse_args()
    program = os.path.join(args.build, "bench", "bench_mpi_pipeline_compare")
    if not os.access(program, os.X_OK):
        sys.exit(f"compare_pipelining: {program} is missing; build the target "
                 "bench_mpi_pipeline_compare (needs MPI) first")
    if shutil.which("mpirun") is None:
        sys.exit("compare_pipelining: mpirun is not on PATH")
    python = pipelining_python(args.python)
    quiet = Quiet(args.max_tries if args.wait_quiet else 1)
    if not args.wait_quiet:
        quiet.run = lambda what, work: work()

    two, torch, one = [], [], []  # per round: {row name: counters}
    with tempfile.TemporaryDirectory(prefix="gpipe_compare_") as work:
        weights = os.path.join(work, "gpt.safetensors")
        subprocess.run([python, SCRIPT, "--write-weights", weights], check=True, env=mpi_env())
        for r in range(args.rounds):
            two.append(quiet.run(f"round {r + 1}, gpipe 2 ranks",
                                 lambda: run_gpipe(program, 2, weights, args.steps, args.pin, work,
                                                   args.mpi_tcp)))
            torch.append(quiet.run(f"round {r + 1}, torch",
                                   lambda: run_torch(python, weights, args.steps, args.pin)))
            one.append(quiet.run(f"round {r + 1}, gpipe 1 process",
                                 lambda: run_gpipe(program, 1, weights, args.steps, args.pin, work)))
            print(f"compare_pipelining: round {r + 1}/{args.rounds} done", file=sys.stderr)

    def values(runs, name, key="step_ms"):
        return [run[name][key] for run in runs]

    lines = []
    emit = lines.append
    torch_version = next(iter(torch[0].values()))["torch"]
    emit(f"{args.rounds} rounds x {args.steps} timed steps; ms: median over rounds of each run's "
         f"median step (min-max over rounds); torch {torch_version}; ranks "
         f"{'pinned to a core each' if args.pin else 'unbound'}; gpipe's ranks over "
         f"{'TCP (loopback)' if args.mpi_tcp else 'shared memory'}, torch's over gloo (TCP, loopback)")
    emit("")
    emit("| schedule | gpipe 2 ranks | torch 2 procs | gpipe / torch | gpipe 1 process, K = 2 "
         "| 2 ranks / 1 process | predicted (sim + optimizer) | 2 ranks / predicted | "
         "first loss gpipe / torch |")
    emit("|---|---|---|---|---|---|---|---|---|")
    ratios, vs_one, vs_pred, loss_diff = {}, {}, {}, 0.0
    for kind, m in SCHEDULES:
        g_name, o_name = f"BM_TwoRanks<{kind}>/M:{m}", f"BM_OneProcess<K:2,{kind}>/M:{m}"
        t_name = f"torch/{kind}/M:{m}"
        g, o = statistics.median(values(two, g_name)), statistics.median(values(one, o_name))
        pred = statistics.median(values(two, g_name, "predicted_ms"))
        vs_one[kind], vs_pred[kind] = g / o, statistics.median(values(two, g_name, "vs_predicted"))
        g_loss = two[0][g_name]["first_loss"]
        if t_name in torch[0]:
            t = statistics.median(values(torch, t_name))
            t_loss = torch[0][t_name]["first_loss"]
            ratios[kind] = g / t
            loss_diff = max(loss_diff, abs(g_loss - t_loss) / abs(t_loss))
            t_cells = [summary(values(torch, t_name)), f"{g / t:.2f}", f"{g_loss:.7f} / {t_loss:.7f}"]
        else:
            t_cells = ["-", "-", f"{g_loss:.7f} / -"]
        emit(f"| {kind}, M = {m} | {summary(values(two, g_name))} | {t_cells[0]} | {t_cells[1]} | "
             f"{summary(values(one, o_name))} | {g / o:.2f} | {pred:.0f} | {vs_pred[kind]:.3f} | "
             f"{t_cells[2]} |")
    k1 = statistics.median(values(one, "BM_OneProcess<K:1>/M:1"))
    emit(f"| one process, K = 1, M = 1 | - | - | - | K = 1: {summary(values(one, 'BM_OneProcess<K:1>/M:1'))} "
         f"| - | - | - | {one[0]['BM_OneProcess<K:1>/M:1']['first_loss']:.7f} |")
    emit("")
    best_kind = min(SCHEDULES, key=lambda s: statistics.median(values(two, f"BM_TwoRanks<{s[0]}>/M:{s[1]}")))
    best = statistics.median(values(two, f"BM_TwoRanks<{best_kind[0]}>/M:{best_kind[1]}"))

    def verdict(ok):
        return "met" if ok else "NOT met"

    emit("| target | measured | |")
    emit("|---|---|---|")
    for kind in ratios:
        emit(f"| gpipe <= 0.8x torch, {kind} | {ratios[kind]:.2f}x | {verdict(ratios[kind] <= 0.8)} |")
    for kind, _ in SCHEDULES:
        emit(f"| 2 ranks <= 1.1x one process K = 2, {kind} | {vs_one[kind]:.2f}x | "
             f"{verdict(vs_one[kind] <= 1.1)} |")
    emit(f"| best 2-rank schedule ({best_kind[0]}, M = {best_kind[1]}) >= 1.8x one process K = 1 "
         f"| {k1 / best:.2f}x | {verdict(k1 / best >= 1.8)} |")
    for kind, _ in SCHEDULES:
        emit(f"| 2 ranks within 5 % of predicted, {kind} | {vs_pred[kind]:.3f} | "
             f"{verdict(abs(vs_pred[kind] - 1) <= 0.05)} |")
    loss_ok = loss_diff <= 1e-5
    emit(f"| first losses agree (1e-5 relative) | {loss_diff:.1e} | {verdict(loss_ok)} |")
    if quiet.repeated:
        emit("")
        emit("Runs repeated because another process used a core: " + "; ".join(quiet.repeated))
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    # the per-op costs behind the predictions, for the trace's story
    for kind, m in SCHEDULES:
        row = two[-1][f"BM_TwoRanks<{kind}>/M:{m}"]
        costs = ", ".join(f"{key}={row[key]:.1f}" for key in
                          ("f0_ms", "b0_ms", "w0_ms", "f1_ms", "b1_ms", "w1_ms", "optimizer_ms",
                           "sim_ms", "compute_ms", "bubble", "sim_bubble") if key in row)
        print(f"last round, 2 ranks, {kind} M = {m}: {costs}", file=sys.stderr)
    return 0 if loss_ok else 1


if __name__ == "__main__":
    sys.exit(main())
