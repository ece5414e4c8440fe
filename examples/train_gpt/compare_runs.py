#!/usr/bin/env python3
"""Two train_gpt runs' loss curves in one picture, and how far apart they are.

Usage: compare_runs.py A/log.csv B/log.csv out.svg [--labels "fp32,bf16"] [--window 20]

Reads the log.csv of each run (step, loss, lr, norm, ms, validation), draws each run's training
loss (a moving average over --window steps) and its validation losses on one SVG, and prints the
largest relative difference between the two runs, of the averaged training loss (from step
--window on) and of the validation losses, with the step where it is. Exits 1 when a difference
exceeds --bound (default 0.02) or the runs do not cover the same steps. Standard library only.
"""

import argparse
import math
import sys


def read(path):
    rows = []
    with open(path) as f:
        next(f)  # header
        for line in f:
            step, loss, _, _, _, validation = line.strip().split(",")
            rows.append((int(step), float(loss), float(validation)))
    return rows


def averaged(losses, window):
    out, total = [], 0.0
    for i, loss in enumerate(losses):
        total += loss
        if i >= window:
            total -= losses[i - window]
        out.append(total / min(i + 1, window))
    return out


def svg(curves, points, labels, window, path):
    width, height, left, bottom = 720, 420, 60, 40
    steps = max(len(c) for c in curves)
    values = [v for c in curves for v in c] + [v for p in points for _, v in p]
    low, high = min(values), max(values)
    x = lambda s: left + (width - left - 20) * s / max(steps - 1, 1)  # noqa: E731
    y = lambda v: 20 + (height - bottom - 20) * (high - v) / (high - low or 1)  # noqa: E731
    colors = ["#1f77b4", "#d62728"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - 20}" y2="{height - bottom}" '
             'stroke="black"/>',
             f'<line x1="{left}" y1="20" x2="{left}" y2="{height - bottom}" stroke="black"/>']
    for k in range(5):
        v = low + (high - low) * k / 4
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for k in range(5):
        s = (steps - 1) * k // 4
        parts.append(f'<text x="{x(s):.1f}" y="{height - bottom + 16}" '
                     f'text-anchor="middle">{s}</text>')
    parts.append(f'<text x="{(left + width) / 2}" y="{height - 6}" text-anchor="middle">step'
                 '</text>')
    for i, (curve, pts, label) in enumerate(zip(curves, points, labels)):
        line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in enumerate(curve))
        style = 'stroke-width="4" stroke-opacity="0.5"' if i == 0 else \
            'stroke-width="1.5" stroke-dasharray="6 3"'
        parts.append(f'<polyline fill="none" stroke="{colors[i]}" {style} points="{line}"/>')
        for s, v in pts:
            parts.append(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="{5 - 2 * i}" '
                         f'fill="{colors[i]}"/>')
        parts.append(f'<text x="{left + 280}" y="{40 + 18 * i}" fill="{colors[i]}">{label}: '
                     f'training loss (mean of {window} steps), validation (dots)</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("svg")
    parser.add_argument("--labels", default="fp32,bf16")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--bound", type=float, default=0.02)
    args = parser.parse_args()
    runs = [read(args.a), read(args.b)]
    if [r[0] for r in runs[0]] != [r[0] for r in runs[1]]:
        print("the two logs do not cover the same steps")
        return 1
    curves = [averaged([r[1] for r in run], args.window) for run in runs]
    points = [[(r[0], r[2]) for r in run if not math.isnan(r[2])] for run in runs]
    worst_train = max(((abs(a - b) / b, s) for s, (a, b) in enumerate(zip(*curves))
                       if s >= args.window), default=(0.0, 0))
    worst_validation = max(((abs(a[1] - b[1]) / b[1], a[0]) for a, b in zip(*points)),
                           default=(0.0, 0))
    svg(curves, points, args.labels.split(","), args.window, args.svg)
    print(f"largest relative difference: averaged training loss {worst_train[0]:.4f} "
          f"(step {worst_train[1]}), validation loss {worst_validation[0]:.4f} "
          f"(step {worst_validation[1]}); bound {args.bound}")
    print(f"final validation: {points[0][-1][1]:.4f} and {points[1][-1][1]:.4f}"
          if points[0] and points[1] else "no validation rows")
    return 0 if max(worst_train[0], worst_validation[0]) <= args.bound else 1


if __name__ == "__main__":
    sys.exit(main())
