"""Probe: clocks and power while a backward runs, ours beside cuDNN's, at the bwd suite's N=8192
shapes (B=4, H=16).  Why: at D=128 bwd_v5's kernel took 9.04 ms in one profiled call right after a
synchronize and 10.46 ms as do_bench's median of back-to-back calls (bench/NOTES.md), a gap as
large as the margin the issue asks for.  If the card lowers its SM clock under sustained tensor
work (power cap), a backward's speed in the benchmark is set by its energy per call as much as by
its cycles, and the two kernels may run at different clocks.

For each implementation and shape: (1) calls after 1 s of idle, each timed alone with events;
(2) back-to-back calls for --seconds, each timed with events, reported as the median of the
first 5 and of the rest; nvidia-smi samples the SM clock, power draw and the clock-event reasons
every 50 ms throughout, and each phase prints the samples' medians over its window.
--protocols instead times each, in three rounds, as such a loop and by bench._time(steady=True),
ours also with inputs that require grad (as the bench suite passes them).

    python scripts/power_probe.py [--headdim 128] [--dtype float16 bfloat16] [--seconds 3] [--causal]

What it found (479dedb, bench/results/sweeps/power_probe_479dedb.log): every sustained phase at
the 700-W limit, 1665-1770 MHz; ours and cuDNN's at about the same cycles a call, ours at a
15-30 MHz higher clock (bench/NOTES.md, "The backward at the power limit").
"""

import argparse
import csv
import datetime
import functools
import operator
import statistics
import subprocess
import time

import torch

from tileattn import api, bench
from tileattn.backward import attention_backward

FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "power_brake"}


def smi_start(path):
    """nvidia-smi sampling FIELDS every 50 ms into path: (the process, the open file)."""
    fields = FIELDS
    probe = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True)
    if probe.returncode != 0:  # older drivers name the reasons "throttle"
        fields = fields.replace("clocks_event_reasons", "clocks_throttle_reasons")
    f = open(path, "w")
    return subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "50"], stdout=f
    ), f


def smi_window(path, t0, t1):
    """Median SM clock, power and the OR of the event reasons over samples in [t0, t1] (host time)."""
    sel = []
    for r in csv.reader(open(path)):
        try:
            ts = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            sample = (float(r[1]), float(r[2]), float(r[3]), int(r[4].strip(), 16))
        except (ValueError, IndexError):  # (a line cut short when the sampler was stopped)
            continue
        if t0 <= ts <= t1:
            sel.append(sample)
    if not sel:
        return "no samples"
    clock, watts, temp, reasons = zip(*sel)
    bits = functools.reduce(operator.or_, reasons)
    why = ",".join(n for b, n in REASONS.items() if bits & b) or "-"
    return (
        f"{len(sel)} samples: SM {statistics.median(clock):.0f} MHz (min {min(clock):.0f}), "
        f"{statistics.median(watts):.0f} W, {max(temp):.0f} C, reasons {why}"
    )


def timed(fn):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    return a, b


def sustained(fn, seconds):
    """ms of each of back-to-back calls of fn over `seconds`, each timed with events."""
    t0, evs = time.time(), []
    while time.time() - t0 < seconds:
        evs.append(timed(fn))
        if len(evs) % 8 == 0:
            evs[-8][1].synchronize()  # keep the host within ~8 calls of the device
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in evs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdim", type=int, nargs="+", default=[128])
    ap.add_argument("--dtype", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--log", default="/tmp/smi.csv")
    ap.add_argument(
        "--protocols",
        action="store_true",
        help="instead: per round, each implementation timed as a back-to-back loop (no L2 flush) and "
        "by bench._time(steady=True) (do_bench, L2 flushed), ours also with inputs that require grad",
    )
    args = ap.parse_args()
    proc, f = smi_start(args.log)
    time.sleep(1.0)
    B, H, N = 4, 16, 8192
    try:
        for dtype in args.dtype:
            dt = getattr(torch, dtype)
            for D in args.headdim:
                q, k, v, dO = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(4))
                mode = "top_left" if args.causal else None
                with torch.no_grad():
                    out, lse = api._call(q, k, v, None, mode, "bhnd", None, None, "scale", True)
                fns = {
                    "bwd_v5": lambda: attention_backward(
                        q, k, v, out, lse, dO, D**-0.5, mode, "bhnd", version="bwd_v5"
                    ),
                    "cudnn": bench._peer_backward("sdpa_cudnn", q, k, v, dO, args.causal),
                }
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                fns["bwd_v5 (inputs require grad)"] = lambda: attention_backward(
                    qg, kg, vg, out, lse, dO, D**-0.5, mode, "bhnd", version="bwd_v5"
                )
                for fn in fns.values():  # warm-up: compile, handles, allocator
                    fn()
                torch.cuda.synchronize()
                if args.protocols:
                    for rnd in range(3):
                        for name, fn in fns.items():
                            loop = sustained(fn, 2.0)
                            suite = bench._time(fn, steady=True)
                            print(
                                f"{dtype} D={D}{' causal' if args.causal else ''} round {rnd} {name}: "
                                f"loop {statistics.median(loop[5:]):.3f} ms, bench._time steady {suite:.3f} ms"
                            )
                    continue
                del fns["bwd_v5 (inputs require grad)"]
                for rnd in range(2):
                    for name, fn in fns.items():
                        tag = f"{dtype} D={D}{' causal' if args.causal else ''} {name} round {rnd}"
                        idle = []
                        for _ in range(3):
                            time.sleep(1.0)
                            ev = timed(fn)
                            torch.cuda.synchronize()
                            idle.append(ev[0].elapsed_time(ev[1]))
                        t0 = time.time()
                        ms = sustained(fn, args.seconds)
                        t1 = time.time()
                        print(
                            f"{tag}: after idle {' '.join(f'{x:.3f}' for x in idle)} ms; sustained "
                            f"first 5 {statistics.median(ms[:5]):.3f}, rest {statistics.median(ms[5:]):.3f} ms "
                            f"({len(ms)} calls)"
                        )
                        window = smi_window(args.log, t0 + (t1 - t0) / 3, t1)
                        print(f"    smi over the sustained phase (last 2/3): {window}")
                        time.sleep(0.3)
    finally:
        proc.terminate()
        f.close()


if __name__ == "__main__":
    main()
