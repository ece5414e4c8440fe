# Writes docs/architecture.svg, the picture of docs/architecture.md: gpipe's seams and the path of
# one step from Trainer::forward_backward to the kernels and back. Boxes are placed by hand.
# Usage: python3 docs/architecture.py  (from the repository root)
boxes = []  # (id, x, y, w, h, title, lines, fill)
def box(id, x, y, w, h, title, lines, fill="#eef3f8", stroke="#4e79a7"):
    boxes.append((id, x, y, w, h, title, lines, fill, stroke))
seam_fill, seam_stroke = "#fdf1e2", "#f1a340"
box("user", 300, 20, 360, 58, "your program",
    ["Trainer<Pipeline<Stage<Layers...>...>, Loss, Backend, ScheduleKind>",
     "trainer.forward_backward(x, y); trainer.step(optimizer)"], "#ffffff", "#555555")
box("trainer", 300, 108, 360, 58, "Trainer  runtime/trainer.hpp",
    ["the typed facade; checks every seam's concept:",
     "layer_for, loss_for, schedule_kind, optimizer_for"])
box("store", 40, 200, 230, 58, "ParameterStore",
    ["runtime/parameter_store.hpp", "storage, init, names, ties, files"])
box("runner", 365, 200, 230, 58, "StepRunner",
    ["runtime/step_runner.hpp", "schedule, input checks, replicas, timing"])
box("optstate", 690, 200, 230, 58, "OptimizerState",
    ["runtime/optimizer_state.hpp", "per-stage state; optimizer.update(k, ...)"])
box("schedule", 40, 300, 230, 72, "schedule seam  schedule/kind.hpp",
    ["ScheduleKind::make(K, M) -> Schedule", "(schedule/op.hpp), proved runnable by",
     "schedule/validator.hpp"], seam_fill, seam_stroke)
box("executor", 365, 300, 230, 72, "Executor  runtime/executor.hpp",
    ["one issue order for all devices,", "micro-batch slots, stashes, loss,",
     "remat (runtime/remat.hpp)"])
box("programs", 690, 300, 230, 72, "the model as data",
    ["runtime/stage_program.hpp: per stage", "sizes, init, forward, B, W as function",
     "pointers; loss_program for the Loss"])
box("backend", 200, 410, 260, 72, "backend seam  backend/concepts.hpp",
    ["submit(device, label, work(Kernels&)),", "record / wait (events), allocate,",
     "synchronize; host/, cuda/, mpi/"], seam_fill, seam_stroke)
box("transport", 500, 410, 260, 72, "transport seam  transport/",
    ["Transport<Backend>: send, receive, sums,", "finish/abort, collectives; one process:",
     "copy after an event; mpi.hpp: MPI, NCCL"], seam_fill, seam_stroke)
box("layer", 200, 520, 260, 72, "layers  model/",
    ["Layer::forward, backward_input (B),", "backward_weight (W), called by a",
     "stream's work with its Kernels&"])
box("ctx", 30, 630, 340, 72, "kernel context seam  model/kernel_context.hpp",
    ["primitives only: gemm, bias, vector ops,", "transfers, loss and optimizer ops",
     "(host::Kernels<T>, cuda::Kernels)"], seam_fill, seam_stroke)
box("lk", 400, 630, 320, 72, "LayerKernels<Op, Ctx>",
    ["a layer's own kernels, beside each backend:", "backend/host/layers/, backend/cuda/layers/",
     "(ReLU, GELU, LayerNorm, attention, ...)"], seam_fill, seam_stroke)
box("devices", 560, 520, 200, 72, "devices",
    ["host: a worker thread each", "CUDA: a stream each", "MPI: a rank each"], "#ffffff", "#555555")

B = {b[0]: b for b in boxes}
def anchor(id, side):
    _, x, y, w, h, *_ = B[id]
    return {"top": (x + w / 2, y), "bottom": (x + w / 2, y + h), "left": (x, y + h / 2),
            "right": (x + w, y + h / 2)}[side]
arrows = [  # (from, side, to, side, step number or "", dashed)
    ("user", "bottom", "trainer", "top", "1", False),
    ("trainer", "bottom", "runner", "top", "2", False),
    ("trainer", "bottom", "store", "top", "", True),
    ("trainer", "bottom", "optstate", "top", "", True),
    ("schedule", "top", "runner", "left", "", False),
    ("runner", "bottom", "executor", "top", "3", False),
    ("programs", "left", "executor", "right", "", False),
    ("executor", "bottom", "backend", "top", "4", False),
    ("executor", "bottom", "transport", "top", "5", False),
    ("backend", "bottom", "layer", "top", "6", False),
    ("layer", "bottom", "ctx", "top", "7", False),
    ("layer", "bottom", "lk", "top", "", False),
    ("ctx", "right", "lk", "left", "", True),
    ("backend", "right", "devices", "left", "", True),
]
out = []
W, H = 960, 815
out.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="Helvetica, Arial, sans-serif">')
out.append('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'fill="#444444"/></marker></defs>')
out.append(f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>')
def esc(t): return t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
for f, fs, t, ts, n, dashed in arrows:
    x1, y1 = anchor(f, fs); x2, y2 = anchor(t, ts)
    dash = ' stroke-dasharray="5,4"' if dashed else ""
    out.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="#444444" '
               f'stroke-width="1.4"{dash} marker-end="url(#arrow)"/>')
    if n:
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2
        out.append(f'<circle cx="{mx:.0f}" cy="{my:.0f}" r="10" fill="#e15759"/>')
        out.append(f'<text x="{mx:.0f}" y="{my + 4:.0f}" font-size="12" font-weight="bold" '
                   f'text-anchor="middle" fill="#ffffff">{n}</text>')
for id, x, y, w, h, title, lines, fill, stroke in boxes:
    out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{fill}" '
               f'stroke="{stroke}" stroke-width="1.5"/>')
    out.append(f'<text x="{x + 10}" y="{y + 18}" font-size="13" font-weight="bold" '
               f'fill="#222222">{esc(title)}</text>')
    for i, line in enumerate(lines):
        out.append(f'<text x="{x + 10}" y="{y + 35 + 15 * i}" font-size="11.5" '
                   f'fill="#333333">{esc(line)}</text>')
legend = [
    "One step, Trainer::forward_backward: (1) the typed call (2) the step runner checks inputs and splits the",
    "batch (3) the executor walks the schedule (4) it submits each op to its device's stream (5) sends and recvs",
    "go through the backend's transport (6) a stream runs the stage's forward / B / W (7) which compute through",
    "the kernel context's primitives and the layers' own LayerKernels; the transport's finish_step (one process:",
    "synchronize; several: the ranks agree whether one failed), then the loss comes back.",
    "Orange boxes are seams, each a concept or a specialization point.",
]
for i, line in enumerate(legend):
    out.append(f'<text x="40" y="{730 + 15 * i}" font-size="12" fill="#333333">{esc(line)}</text>')
out.append("</svg>")
open("docs/architecture.svg", "w").write("\n".join(out) + "\n")
