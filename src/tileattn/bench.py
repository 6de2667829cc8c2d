"""The one benchmark harness: every rung and every peer timed by the same code in the same run.

Timing: ``triton.testing.do_bench`` (CUDA events, L2 flushed before each run, warm-up, median);
the backward suite first brings the card to its power limit's steady clock (``_time``'s steady).
FLOPs = 4*B*H*Nq*Nk*D, halved for causal.  Each rung is validated against float64 before it is
timed (rel_err = ||O - O_ref|| / ||O_ref|| over the first two heads of batch 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

from . import _nvrtc, api, fp8
from .versions import VERSIONS

# The ceilings the "% of ceiling" column divides by: the H100/H200 SXM datasheet's non-tensor FP32
# rate for FP32 inputs, and the bf16 matrix product measured on an H200 for fp16/bf16 inputs.
CEILING_TFLOPS = {"float32": 67.0, "bfloat16": 686.0, "float16": 686.0}
PEERS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "flex_attention")
_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class Case:
    B: int
    H: int
    N: int
    D: int
    dtype: str
    causal: bool

    @property
    def flops(self) -> float:
        return 4 * self.B * self.H * self.N * self.N * self.D / (2 if self.causal else 1)


@dataclasses.dataclass(frozen=True)
class Suite:
    """A named benchmark: which rungs and peers, on which shapes, into which results file."""

    versions: tuple[str, ...]
    shapes: tuple[tuple[int, int, int, int], ...]  # (B, H, N, D)
    dtypes: tuple[str, ...]
    peers: tuple[str, ...]
    causal: tuple[bool, ...] = (False, True)
    # FlexAttention compiles per shape: limit it to these (N, D) (empty: all)
    flex_seqlens: tuple[int, ...] = ()
    flex_head_dims: tuple[int, ...] = ()

    def cases(self) -> list[Case]:
        return [Case(B, H, N, D, dt, c) for dt in self.dtypes for (B, H, N, D) in self.shapes for c in self.causal]


SUITES = {
    # The seed's table: its ladder at B=4, H=8, N=8192, D=64, FP32.
    "ladder_fp32": Suite(
        ("v1", "v1_br48", "v1.1", "v2"),
        ((4, 8, 8192, 64),),
        ("float32",),
        ("sdpa_efficient", "sdpa_math", "flex_attention"),
    ),
    # The fast FP32 rungs across head dims and lengths (B*N = 32768 tokens).
    "fp32": Suite(
        ("v2", "v2.1", "v2.2", "v2.2_tf32", "v2.3", "v2.4", "v2.5", "v2.3_tf32"),
        ((4, 8, 8192, 64), (4, 8, 8192, 32), (4, 8, 8192, 128), (32, 8, 1024, 64), (1, 8, 32768, 64)),
        ("float32",),
        ("sdpa_efficient", "sdpa_math", "flex_attention"),
    ),
    # Tensor-core fp16/bf16: H=16, B*N = 32768.
    "mma": Suite(
        ("v3", "v3.1", "v3.2", "v3.3", "v3.4", "v3.6", "v3.6_wide", "v3.7"),
        tuple((32768 // N, 16, N, D) for D in (64, 128, 256) for N in (1024, 4096, 8192, 32768)),
        ("bfloat16", "float16"),
        ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex_attention"),
        flex_seqlens=(8192,),
        flex_head_dims=(64, 128),
    ),
}


def _peer_fn(name: str, q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if name == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        # Every shape compiles its own kernel; a fresh dynamo state per shape keeps a long run (several
        # suites in one process) under dynamo's recompile limit, past which it silently falls back
        # to the unfused implementation.
        torch._dynamo.reset()
        flex = torch.compile(flex_attention, dynamic=False)
        block_mask = None
        if causal:
            block_mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, q.shape[2], k.shape[2])
        if k.shape[1] != q.shape[1]:  # GQA (passed only then, as below)
            return lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True)
        return lambda: flex(q, k, v, block_mask=block_mask)
    backend = {
        "sdpa_flash": SDPBackend.FLASH_ATTENTION,
        "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
        "sdpa_math": SDPBackend.MATH,
    }[name]

    gqa = k.shape[1] != q.shape[1]  # (passed only then: a backend taking no GQA still runs MHA)

    def fn():
        with sdpa_kernel([backend]):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=True) if gqa else sdpa(q, k, v, is_causal=causal)

    return fn


def _peer_backward(name: str, q, k, v, dO, causal: bool):
    """A peer's backward alone, as the bwd suite times it (the probes' cuDNN and FA2): autograd
    through the peer's forward, run once here on detached copies of q, k, v; returns the call."""
    qkv = [t.detach().requires_grad_() for t in (q, k, v)]
    o = _peer_fn(name, *qkv, causal)()
    return lambda: torch.autograd.grad(o, qkv, dO, retain_graph=True)


_REF_HEADS = (slice(0, 1), slice(0, 2))  # the (batch, head) slices errors are measured on: heads (0, 0), (0, 1)


def rel_err(out: torch.Tensor, q, k, v, causal: bool) -> float:
    """||O - O_ref|| / ||O_ref|| against float64 on heads (0, 0) and (0, 1): (B, H, N, D) layout."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    sl = _REF_HEADS
    ref = sdpa(*(t[sl].double() for t in (q, k, v)), is_causal=causal)
    return ((out[sl].double() - ref).norm() / ref.norm()).item()


_SOAK_S, _STEADY_REP_MS = 0.5, 1000  # _time(steady=True)
_BWD_ROUNDS = 2  # interleaved rounds of the backward suite's timings
STEADY = False  # `bench --steady`: every suite's timings steady (the backward suite's always are)


def _time(fn, steady: bool | None = None) -> float:
    """Median ms of fn over do_bench's runs.  steady (default: STEADY): first keep the card busy with fn for
    _SOAK_S, then time over _STEADY_REP_MS.  Why: under sustained tensor-core work an H200 sits at
    its 700-W power limit, and its clock controller takes ~0.5 s to get there from a pause (the
    clock dips to ~1400-1500 MHz on the way) and then swings by ~150 MHz about once a second
    (scripts/power_probe.py, bench/NOTES.md).  A 100-ms window lands anywhere on that curve: a
    10-ms backward moved by +-2% from one run to the next.  After the soak, a 1-s window spans a
    whole swing, and each implementation is timed at the clock its own power draw allows."""
    from triton.testing import do_bench

    if not (STEADY if steady is None else steady):
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    end = time.perf_counter() + _SOAK_S
    while time.perf_counter() < end:
        for _ in range(8):  # (a batch of calls between checks: the host stays a few calls ahead)
            fn()
        torch.cuda.synchronize()
    return do_bench(fn, warmup=0, rep=_STEADY_REP_MS, return_mode="median")


def _timed_row(base: dict, build, rate: str, per_ms: float, error=None) -> dict:
    """One row of a special suite: build() gives the call (a peer may compile there), run once
    (error(out): its rel_err, when given), then timed; rate = per_ms / ms (TFLOP/s: flops / 1e9,
    TB/s: bytes / 1e9).  A call that raises (e.g. a backend rejecting the shape) gives a row with
    its error instead, and the suite keeps going."""
    try:
        fn = build()
        out = fn()
        err = error(out) if error else None
        ms = _time(fn)
        return dict(**base, ms=ms, **{rate: per_ms / ms}, rel_err=err)
    except Exception as e:
        return dict(**base, ms=None, **{rate: None}, error=f"{type(e).__name__}: {e}"[:200])


def run(
    cases: list[Case], versions: list[str], peers: list[str], progress=None, flex_seqlens=(), flex_head_dims=()
) -> list[dict]:
    rows = []
    for case in cases:
        dt = _DTYPE[case.dtype]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(case.B, case.H, case.N, case.D, device="cuda", dtype=dt, generator=gen) for _ in range(3)
        )
        base = dict(B=case.B, H=case.H, Nq=case.N, Nk=case.N, D=case.D, dtype=case.dtype, causal=case.causal)
        for name in versions:
            entry = VERSIONS[name]
            if not entry.supports(case.dtype, case.D, _arch(), entry.precision):
                continue
            t0 = time.perf_counter()
            precision = "tf32" if entry.precision == "tf32" else None
            fn = lambda q=q, k=k, v=v: api.scaled_dot_product_attention(
                q,
                k,
                v,
                is_causal=case.causal,
                version=name,
                precision=precision,
            )
            out = fn()
            torch.cuda.synchronize()
            first_call_s = time.perf_counter() - t0
            err = rel_err(out, q, k, v, case.causal)
            ms = _time(fn)
            rows.append(
                dict(
                    impl=name,
                    kind=entry.kind,
                    **base,
                    ms=ms,
                    tflops=case.flops / ms / 1e9,
                    rel_err=err,
                    compile_s=_compile_seconds(name, case),
                )
            )
            rows[-1]["first_call_s"] = first_call_s
            if progress:
                progress()
        for name in peers:
            if name == "flex_attention" and (
                (flex_seqlens and case.N not in flex_seqlens) or (flex_head_dims and case.D not in flex_head_dims)
            ):
                if progress:
                    progress()
                continue
            try:
                fn = _peer_fn(name, q, k, v, case.causal)
                fn()
                torch.cuda.synchronize()
                ms = _time(fn)
                rows.append(dict(impl=name, **base, ms=ms, tflops=case.flops / ms / 1e9))
            except Exception as e:  # e.g. flash/cuDNN reject fp32: record why, keep going
                rows.append(dict(impl=name, **base, ms=None, tflops=None, error=f"{type(e).__name__}: {e}"[:200]))
            if progress:
                progress()
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def _arch() -> int:
    cc = torch.cuda.get_device_capability()
    return cc[0] * 10 + cc[1]


def _compile_seconds(name: str, case: Case) -> float | None:
    entry = VERSIONS[name]
    cc = torch.cuda.get_device_capability()
    cubin = _nvrtc.compile_kernel(
        entry.file,
        entry.name_expression(case.dtype, case.D, case.causal, cc[0] * 10 + cc[1]),
        _nvrtc.arch_string(cc, arch_specific=entry.arch_specific),
    )
    return cubin.compile_seconds


def environment() -> dict:
    # The device machine's copy of the tree may carry a stale .git: the caller's TILEATTN_COMMIT
    # (the commit it shipped) wins.
    if os.environ.get("TILEATTN_COMMIT"):
        commit, dirty = os.environ["TILEATTN_COMMIT"], False
    else:
        commit, dirty = _git_state()
    import triton

    return dict(
        gpu=torch.cuda.get_device_name(),
        commit=commit,
        dirty=dirty,
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        nvrtc=_nvrtc.nvrtc_version(),
        defines=list(_nvrtc.EXPERIMENT_DEFINES),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def _git_state() -> tuple[str | None, bool]:
    """The commit of tileattn's own checkout; an installed copy (no checkout of ours around it, or
    one of another project) records its version instead."""
    root = Path(__file__).resolve().parents[2]  # src/tileattn/bench.py -> the checkout's root
    pyproject = root / "pyproject.toml"
    if not (pyproject.exists() and 'name = "tileattn"' in pyproject.read_text()):
        from . import __version__

        return f"tileattn {__version__} (installed)", False
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root
            ).stdout.strip()
            or None
        )
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=root
            ).stdout.strip()
        )
    except OSError:
        commit, dirty = None, False
    return commit, dirty


def add_ratios(rows: list[dict]) -> None:
    """speedup_vs_prev: each rung over the rung before it in the list that computes at the same precision
    (same shape: v2.3 over v2.2, v2.3_tf32 over v2.2_tf32); vs_<peer>: time ratio."""
    by_shape: dict[tuple, list[dict]] = {}
    for r in rows:
        by_shape.setdefault((r["B"], r["H"], r["Nq"], r["D"], r["dtype"], r["causal"]), []).append(r)
    for group in by_shape.values():
        rungs = [r for r in group if "kind" in r and r["ms"]]
        last: dict[str | None, dict] = {}
        for cur in rungs:
            precision = VERSIONS[cur["impl"]].precision if cur["impl"] in VERSIONS else None
            cur.pop("speedup_vs_prev", None)
            if precision in last:
                cur["speedup_vs_prev"] = last[precision]["ms"] / cur["ms"]
            last[precision] = cur
        peers = [r for r in group if "kind" not in r and r["ms"]]
        for r in rungs:
            for p in peers:
                r[f"vs_{p['impl']}"] = p["ms"] / r["ms"]


_NO_CHART = ("overhead", "hf")  # suites whose table says it all


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig, path: Path, dpi: int = 110, **layout) -> None:
    fig.tight_layout(**layout)
    fig.savefig(path, dpi=dpi)
    _pyplot().close(fig)


def _grouped_bars(ax, groups: list, impls: list[str], value, labels: bool = False) -> None:
    """One bar per implementation in each group, value(group, impl) high (0 where it has none);
    the x ticks at the groups' centres.  labels: each bar's value written on it (none where the
    implementation was not measured, which is not a 0)."""
    width = 0.8 / len(impls)
    for i, name in enumerate(impls):
        heights = [value(g, name) for g in groups]
        bars = ax.bar([x + i * width for x in range(len(groups))], heights, width, label=name)
        if labels:
            ax.bar_label(bars, labels=[f"{h:.0f}" if h else "" for h in heights], fontsize=7)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))])


def save(result: dict, out: Path) -> Path | None:
    """The results file, and beside it (.png) the chart the suite has: one panel per shape for
    the ladder suites and story, TFLOP/s against N for bwd, TB/s per case for decode, none for the rest.  Returns the
    chart's path, or None."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    if result.get("suite") in _NO_CHART:
        return None
    chart = out.with_suffix(".png")
    charts = {"bwd": bwd_chart, "decode": decode_chart, "varlen": varlen_chart, "variants": variants_chart,
              "fp8": fp8_chart}  # fmt: skip
    charts.get(result.get("suite"), _chart)(result, chart)
    return chart


def _chart(result: dict, path: Path) -> None:
    plt = _pyplot()

    rows = [r for r in result["rows"] if r.get("tflops")]
    shapes = sorted({(r["B"], r["H"], r["Nq"], r["D"], r["dtype"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(
        len(shapes),
        1,
        figsize=(
            9,
            1.2
            + 0.45
            * max(
                len([r for r in rows if (r["B"], r["H"], r["Nq"], r["D"], r["dtype"], r["causal"]) == s])
                for s in shapes
            )
            * len(shapes),
        ),
        squeeze=False,
    )
    for ax, s in zip(axes[:, 0], shapes):
        group = [r for r in rows if (r["B"], r["H"], r["Nq"], r["D"], r["dtype"], r["causal"]) == s]
        names = [r["impl"] for r in group]
        vals = [r["tflops"] for r in group]
        colors = ["tab:blue" if "kind" in r else "tab:gray" for r in group]
        ax.barh(names, vals, color=colors)
        ax.invert_yaxis()
        for y, val in enumerate(vals):
            ax.text(val, y, f" {val:.1f}", va="center", fontsize=8)
        ax.set_title(f"B={s[0]} H={s[1]} N={s[2]} D={s[3]} {s[4]} {'causal' if s[5] else 'non-causal'}", fontsize=9)
        log = max(vals) / min(vals) > 20  # the seed's ladder spans two orders of magnitude
        if log:
            ax.set_xscale("log")
        ax.set_xlabel(f"TFLOP/s{', log scale' if log else ''} (blue: tileattn, grey: peers)")
    fig.suptitle(f"tileattn forward on {result['gpu']} ({result['commit']})", fontsize=10)
    _save_figure(fig, path, rect=(0, 0, 1, 0.98))


def markdown_table(result: dict) -> str:
    """The README's table, generated from a results JSON."""
    lines = [
        "| impl | B | H | N | D | dtype | causal | ms | TFLOP/s | % of ceiling "
        "| speed-up vs previous rung (same precision) | rel. err | cold compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r.get("ms") is None:
            continue
        lines.append(
            "| {impl} | {B} | {H} | {Nq} | {D} | {dtype} | {c} | {ms:.2f} | {tflops:.3g} | {peak:.2g}% | {su} "
            "| {err} | {cs} |".format(
                **r,
                c="yes" if r["causal"] else "no",
                peak=100 * r["tflops"] / CEILING_TFLOPS[r["dtype"]],
                su=f"{r['speedup_vs_prev']:.2f}x" if "speedup_vs_prev" in r else "",
                err=f"{r['rel_err']:.1e}" if "rel_err" in r else "",
                cs=f"{r['compile_s']:.1f}" if r.get("compile_s") else "",
            )
        )
    return "\n".join(lines)


def ratio_table(result: dict, peers=("sdpa_flash", "sdpa_cudnn")) -> str:
    """One line per shape: TFLOP/s of every rung and of the given peers (timed in the same run), and
    every rung's ratio to the first peer; then, on Hopper, the rung the default dispatch picks there
    (versions.select) and its ratio to the other peers."""
    from .versions import select, short_causal

    rungs = [i for i in dict.fromkeys(r["impl"] for r in result["rows"]) if i in VERSIONS]
    peers = [p for p in peers if any(r["impl"] == p and r.get("tflops") for r in result["rows"])]
    shapes = list(dict.fromkeys((r["dtype"], r["D"], r["Nq"], r["B"], r["causal"]) for r in result["rows"]))
    tflops = {(r["impl"], r["dtype"], r["D"], r["Nq"], r["B"], r["causal"]): r.get("tflops") for r in result["rows"]}
    hopper = any(name in result.get("gpu", "") for name in ("H100", "H200", "H800", "H20"))

    def default(shape):
        """The rung the dispatch takes at this shape, if the run measured it."""
        dtype, D, N, _, causal = shape
        v = select(dtype, D, 90, short_causal=short_causal(causal, N)) if hopper else None
        return v.name if v is not None and v.name in rungs else None

    head = ["dtype", "D", "N", "B", "causal"] + [f"{i} TFLOP/s" for i in rungs + peers]
    head += [f"{i} / {peers[0]}" for i in rungs] + (
        ["default"] + [f"default / {p}" for p in peers[1:]] if hopper else []
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratio = lambda i, p, shape: (
        f"{t / ref:.2f}x" if i and (t := tflops.get((i, *shape))) and (ref := tflops.get((p, *shape))) else ""
    )
    for shape in shapes:
        cells = [shape[0], shape[1], shape[2], shape[3], "yes" if shape[4] else "no"]
        cells += [f"{t:.0f}" if (t := tflops.get((i, *shape))) else "" for i in rungs + peers]
        cells += [ratio(i, peers[0], shape) for i in rungs]
        if hopper:
            cells += [default(shape) or ""] + [ratio(default(shape), p, shape) for p in peers[1:]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


# ---- host overhead and end-to-end suites ---------------------------------------------------------

OVERHEAD_SHAPES = ((1, 1, 16, 64, "bfloat16", False), (1, 32, 512, 128, "float16", True))


def overhead(calls: int = 3000, repeats: int = 5) -> list[dict]:
    """Host time per call: a loop of `calls` calls at a tiny shape, where the GPU finishes each
    kernel long before the host issues the next, timed by the host clock (the median of
    `repeats` loops, one synchronisation at the end of each, taken round robin over the
    implementations).  tileattn beside SDPA's flash and cuDNN backends and torch's in-place add
    (the floor of one PyTorch op), in the same process."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for B, H, N, D, dtype, causal in OVERHEAD_SHAPES:
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=_DTYPE[dtype]) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        fns = {
            "tileattn.flash_attn_func": lambda: api.flash_attn_func(q, k, v, causal=causal),
            "tileattn.scaled_dot_product_attention": lambda: api.scaled_dot_product_attention(
                qt, kt, vt, is_causal=causal
            ),
            "torch.add_": lambda: q.add_(0),
        }
        if D in fp8.V3_5_FP8.tiles:  # FP8 (v3.5): a prepared call, with its descale table and V^T's copy
            (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize_e4m3(t) for t in (q, k, v))
            fns["tileattn.flash_attn_func (e4m3)"] = lambda: api.flash_attn_func(
                q8, k8, v8, causal=causal, descale_q=dq, descale_k=dk, descale_v=dv
            )
        backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
        for name in backends:
            fns[name] = lambda: sdpa(qt, kt, vt, is_causal=causal)

        def timed(name, fn, n):
            """Host µs per call over n calls (one synchronisation at the end), the backend chosen
            once outside the loop (as a model would run)."""
            with sdpa_kernel([backends[name]]) if name in backends else contextlib.nullcontext():
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                torch.cuda.synchronize()
                return (time.perf_counter() - t0) / n * 1e6

        with torch.no_grad():
            # Round robin: every implementation's loop once per repeat, so a clock that ramps up
            # during the run (or any drift) reaches all of them alike, not whichever runs first.
            times: dict[str, list[float]] = {name: [] for name in fns}
            errors: dict[str, str] = {}
            for rep in range(repeats + 1):  # the first round is warm-up
                for name, fn in fns.items():
                    if name in errors:
                        continue
                    try:
                        us = timed(name, fn, calls if rep else 50)
                    except Exception as e:
                        errors[name] = f"{type(e).__name__}: {e}"[:200]
                        continue
                    if rep:
                        times[name].append(us)
            for name, fn in fns.items():
                shape = dict(impl=name, B=B, H=H, N=N, D=D, dtype=dtype, causal=causal)
                if name in errors:
                    rows.append(dict(shape, us_per_call=None, error=errors[name]))
                    continue
                with sdpa_kernel([backends[name]]) if name in backends else contextlib.nullcontext():
                    gpu_us = _time(fn) * 1e3  # device events: shows whether the loop is bound by the host
                us = sorted(times[name])[len(times[name]) // 2]
                rows.append(dict(shape, us_per_call=us, gpu_us=gpu_us, calls=calls))
    return rows


def overhead_table(result: dict) -> str:
    lines = ["| call | shape (B, H, N, D, dtype, causal) | host µs per call | GPU µs per call |", "|---|---|---|---|"]
    for r in result["rows"]:
        shape = f"{r['B']}, {r['H']}, {r['N']}, {r['D']}, {r['dtype']}, {'causal' if r['causal'] else 'full'}"
        us = f"{r['us_per_call']:.1f}" if r.get("us_per_call") else r.get("error", "")
        gpu = f"{r['gpu_us']:.1f}" if r.get("gpu_us") else ""
        lines.append(f"| {r['impl']} | {shape} | {us} | {gpu} |")
    return "\n".join(lines)


HF_SHAPES = ((2, 8192), (8, 2048), (1, 16384))


def _no_attention(module, query, key, value, attention_mask, **kwargs):
    """An attention function that computes nothing: an uninitialised (B, Nq, H, D) output.  The
    model's time with it is everything but attention, which bounds what a faster attention can
    buy end to end."""
    B, H, Nq, D = query.shape
    return query.new_empty(B, Nq, H, D), None


def hf_prefill(shapes=HF_SHAPES, layers: int = 16) -> list[dict]:
    """End-to-end prefill of a randomly initialised Llama-style model (hidden 2048, 16 layers,
    GQA 32:8, head dim 64, bf16; no downloaded weights) in Hugging Face transformers, with
    attn_implementation "sdpa" and "tileattn" (tileattn.integrations.transformers), timed by
    device events (median), beside the same model's logits checked for agreement.  A third run
    with no attention at all (_no_attention) gives attention's share of each: attn_ms, the model's
    time less that run's, and attn_needed_for_1_05x, the speed over sdpa's attention that the
    whole model at 1.05x sdpa's would need."""
    from transformers import AttentionInterface

    from .integrations import transformers as hf

    hf.register()
    AttentionInterface.register("no_attention", _no_attention)
    # hidden 2048 and the MLP's 2048 * 11 / 4 = 5632: the size of a 1B-parameter Llama.
    model = hf.random_llama(hidden=2048, layers=layers, heads=32, kv_heads=8, head_dim=64, vocab=32000)
    config = model.config
    rows = []
    for B, N in shapes:
        ids = torch.randint(0, config.vocab_size, (B, N), device="cuda")
        logits, ms = {}, {}
        for impl in ("sdpa", "tileattn", "no_attention"):
            model.set_attn_implementation(impl)
            with torch.no_grad():
                fn = lambda ids=ids: model(input_ids=ids, logits_to_keep=1).logits
                logits[impl] = fn().float()
                ms[impl] = _time(fn)
            if impl != "no_attention":
                rows.append(dict(impl=impl, B=B, N=N, ms=ms[impl], tokens_per_s=B * N / ms[impl] * 1e3))
        for r in rows[-2:]:
            r["attn_ms"] = r["ms"] - ms["no_attention"]
        sdpa, ours = rows[-2:]
        ours["max_abs_logit_diff_vs_sdpa"] = (logits["tileattn"] - logits["sdpa"]).abs().max().item()
        ours["vs_sdpa"] = sdpa["ms"] / ours["ms"]
        ours["attn_vs_sdpa"] = sdpa["attn_ms"] / ours["attn_ms"] if ours["attn_ms"] > 0 else None
        # 1.05x end to end: the model in sdpa's time / 1.05, of which ms["no_attention"] is not
        # attention (None: not even attention in no time would do)
        needed = sdpa["ms"] / 1.05 - ms["no_attention"]
        ours["attn_needed_for_1_05x"] = sdpa["attn_ms"] / needed if needed > 0 else None
        del ids
        torch.cuda.empty_cache()
    return rows


def hf_table(result: dict) -> str:
    lines = [
        "| B | N | sdpa ms | tileattn ms | tileattn / sdpa (speed) | attention ms, sdpa / tileattn | "
        "attention speed-up | needed for 1.05x | max abs logit diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = result["rows"]
    for a, b in zip(rows[::2], rows[1::2]):
        ratio = lambda key: "-" if b.get(key) is None else f"{b[key]:.2f}x"
        attn = (
            f"{a['attn_ms']:.2f} / {b['attn_ms']:.2f} | {ratio('attn_vs_sdpa')} | {ratio('attn_needed_for_1_05x')}"
            if "attn_ms" in b
            else "- | - | -"  # runs from before the attention-free run was added
        )
        lines.append(
            f"| {a['B']} | {a['N']} | {a['ms']:.2f} | {b['ms']:.2f} | {b['vs_sdpa']:.3f}x | {attn} | "
            f"{b['max_abs_logit_diff_vs_sdpa']:.3f} |"
        )
    return "\n".join(lines)


# ---- backward ----------------------------------------------------------------------------------

# bf16 and fp16 at H=16, B*N = 32768 tokens, D = 64, 128, 256; FP32 beside SDPA's FP32 backends.
BWD_CASES = [
    Case(32768 // N, 16, N, D, dtype, causal)
    for dtype in ("bfloat16", "float16")
    for D in (64, 128, 256)
    for N in (1024, 4096, 8192, 32768)
    for causal in (False, True)
] + [Case(32768 // N, 8, N, D, "float32", causal) for D in (64, 128) for N in (1024, 8192) for causal in (False, True)]
BWD_PEERS = {
    "float32": ("sdpa_efficient", "sdpa_math"),
    "bfloat16": ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex_attention"),
    "float16": ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex_attention"),
}
BWD_FLEX_SEQLENS = (8192,)  # FlexAttention compiles forward and backward per shape: only at this N


def _grad_err(grads, q, k, v, dO, causal: bool) -> float:
    """Largest relative error of dq, dk, dv against float64 autograd, on heads (0, 0) and (0, 1)."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    sl = _REF_HEADS
    ref_in = [t[sl].detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(sdpa(*ref_in, is_causal=causal), ref_in, dO[sl].double())
    return max(((g[sl].double() - r).norm() / r.norm()).item() for g, r in zip(grads, ref))


def backward_suite(cases=BWD_CASES, rungs=None, progress=None) -> list[dict]:
    """Backward only (FLOPs = 2.5x the forward's) and forward + backward, tileattn's backward rungs
    (each also with deterministic=True, as "<rung>_deterministic") beside PyTorch's backends in one
    run, with each implementation's peak memory over one forward + backward (beyond the inputs).
    (B, H, N, D) layout, upstream gradient drawn at random.  Each of our rows carries
    ``vs_<peer>``: the peer's backward time over ours (above 1: we are faster).  rungs: the
    backward rungs to run (default: all)."""
    from . import backward
    from .versions import BWD_VERSIONS

    rows = []
    for case in cases:
        dt = _DTYPE[case.dtype]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, dO = (
            torch.randn(case.B, case.H, case.N, case.D, device="cuda", dtype=dt, generator=gen) for _ in range(4)
        )
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        base = dict(B=case.B, H=case.H, Nq=case.N, Nk=case.N, D=case.D, dtype=case.dtype, causal=case.causal)
        flops = 2.5 * case.flops
        mode = "top_left" if case.causal else None
        impls = {}
        for name, entry in BWD_VERSIONS.items():
            if case.dtype in entry.dtypes and case.D in entry.tiles and (rungs is None or name in rungs):

                def fwd(name=name):
                    with torch.no_grad():
                        return api._call(q, k, v, None, mode, "bhnd", None, None, "scale", True)

                prec = "tf32" if entry.precision == "tf32" else None  # the TF32 rung runs only when asked
                for det in (False, True) if entry.deterministic else (False,):
                    bwd = lambda o, name=name, det=det, prec=prec: backward.attention_backward(
                        q, k, v, *o, dO, case.D**-0.5, mode, "bhnd", version=name, deterministic=det, precision=prec
                    )
                    impls[name + "_deterministic" * det] = (fwd, bwd)
        for name in BWD_PEERS[case.dtype]:
            if name == "flex_attention" and case.N not in BWD_FLEX_SEQLENS:
                continue
            fwd = _peer_fn(name, q, k, v, case.causal)
            impls[name] = (fwd, lambda o: torch.autograd.grad(o, (q, k, v), dO, retain_graph=True))
        # Each implementation checked, its memory and forward + backward time measured; then the
        # backward alone timed in _BWD_ROUNDS interleaved rounds (the median of each's rounds), so a
        # drift of the card's power-limited clock over the minutes of a case falls on all alike.
        outs, case_rows = {}, []
        for name, (fwd, bwd) in impls.items():
            try:
                out = fwd()
                grads = bwd(out)
                ours = name.removesuffix("_deterministic") in BWD_VERSIONS
                err = _grad_err(grads, q, k, v, dO, case.causal) if ours else None
                out = grads = None  # (freed before the memory measurement)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                bwd(fwd())
                torch.cuda.synchronize()
                peak_gb = (torch.cuda.max_memory_allocated() - before) / 1e9
                ms_both = _time(lambda: bwd(fwd()), steady=True)
                outs[name] = fwd()
                case_rows.append(
                    dict(impl=name, **base, ms=None, ms_rounds=[], fwd_bwd_ms=ms_both, peak_gb=peak_gb)
                    | ({"kind": "bwd", "rel_err": err} if ours else {})
                )
            except Exception as e:  # e.g. flash/cuDNN reject fp32 or D=256: record why, keep going
                case_rows.append(dict(impl=name, **base, ms=None, tflops=None, error=f"{type(e).__name__}: {e}"[:200]))
        for _ in range(_BWD_ROUNDS):
            for r in case_rows:
                if r["impl"] not in outs:
                    continue
                bwd, out = impls[r["impl"]][1], outs[r["impl"]]
                try:
                    r["ms_rounds"].append(_time(lambda: bwd(out), steady=True))  # noqa: B023 (called here)
                except Exception as e:  # (as above: the row records why, the suite keeps going)
                    r.update(ms_rounds=[], tflops=None, error=f"{type(e).__name__}: {e}"[:200])
                    del outs[r["impl"]]
        for r in case_rows:
            if r.get("ms_rounds"):
                r["ms"] = statistics.median(r["ms_rounds"])
                r["tflops"] = flops / r["ms"] / 1e9
            if progress:
                progress()
        outs.clear()
        rows += case_rows
        for r in case_rows:
            for p in case_rows:
                if "kind" in r and "kind" not in p and r.get("ms") and p.get("ms"):
                    r[f"vs_{p['impl']}"] = p["ms"] / r["ms"]
        impls.clear()
        q = k = v = dO = None
        torch.cuda.empty_cache()
    return rows


def bwd_steps(cases=BWD_CASES, rungs=None) -> int:
    from .versions import BWD_VERSIONS

    ours = lambda c: sum(
        (1 + e.deterministic) * (c.dtype in e.dtypes and c.D in e.tiles)
        for n, e in BWD_VERSIONS.items()
        if rungs is None or n in rungs
    )
    peers = lambda c: len([p for p in BWD_PEERS[c.dtype] if p != "flex_attention" or c.N in BWD_FLEX_SEQLENS])
    return sum(ours(c) + peers(c) for c in cases)


def bwd_chart(result: dict, path: Path) -> None:
    """Backward TFLOP/s against N, one panel per (dtype, D, causal): our rungs solid, peers dashed."""
    plt = _pyplot()

    rows = [r for r in result["rows"] if r.get("tflops")]
    panels = sorted({(r["dtype"], r["D"], r["causal"]) for r in rows})
    cols = 4
    fig, axes = plt.subplots(-(-len(panels) // cols), cols, figsize=(16, 3.2 * -(-len(panels) // cols)), squeeze=False)
    for ax, (dtype, D, causal) in zip(axes.flat, panels):
        group = [r for r in rows if (r["dtype"], r["D"], r["causal"]) == (dtype, D, causal)]
        for impl in dict.fromkeys(r["impl"] for r in group):
            pts = sorted((r["Nq"], r["tflops"]) for r in group if r["impl"] == impl)
            ours = any("kind" in r for r in group if r["impl"] == impl)
            ax.plot(*zip(*pts), "o-" if ours else "s--", label=impl, linewidth=2 if ours else 1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} D={D} {'causal' if causal else 'full'}", fontsize=9)
        ax.set_xlabel("N")
        ax.set_ylabel("bwd TFLOP/s")
        ax.legend(fontsize=6)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"backward, {result.get('gpu', '')}, commit {result.get('commit', '')}", fontsize=10)
    _save_figure(fig, path, dpi=90)


def bwd_summary(rows: list[dict]) -> str:
    """Per rung and shape at N=8192 (and FP32 at every N): speed against cuDNN, SDPA flash and SDPA
    efficient of the same run, and the deterministic mode's cost."""
    lines = []
    for r in rows:
        if "kind" not in r or not r.get("ms") or r["impl"].endswith("_deterministic"):
            continue
        if r["dtype"] != "float32" and r["Nq"] != 8192:
            continue
        ratios = ", ".join(f"{r[k]:.2f}x {k[3:]}" for k in r if k.startswith("vs_"))
        det = next(
            (d for d in rows if d["impl"] == r["impl"] + "_deterministic" and d.get("ms") and _same_shape(d, r)), None
        )
        cost = f"; deterministic {det['ms'] / r['ms']:.2f}x the time" if det else ""
        lines.append(
            f"{r['impl']} {r['dtype']} D={r['D']} N={r['Nq']} {'causal' if r['causal'] else 'full'}: "
            f"{r['ms']:.2f} ms, {r['tflops']:.0f} TFLOP/s; {ratios}{cost}"
        )
    return "\n".join(lines)


def _same_shape(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("B", "H", "Nq", "Nk", "D", "dtype", "causal"))


def bwd_table(result: dict) -> str:
    lines = [
        "| impl | B | H | N | D | dtype | causal | bwd ms | bwd TFLOP/s | fwd+bwd ms | peak GB | rel. err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        causal = "yes" if r["causal"] else "no"
        head = f"| {r['impl']} | {r['B']} | {r['H']} | {r['Nq']} | {r['D']} | {r['dtype']} | {causal}"
        if r.get("ms") is None:
            lines.append(f"{head} | {r.get('error', '')} | | | | |")
            continue
        err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else ""
        lines.append(
            f"{head} | {r['ms']:.2f} | {r['tflops']:.0f} | {r['fwd_bwd_ms']:.2f} | {r['peak_gb']:.2f} | {err} |"
        )
    return "\n".join(lines)


# ---- decode (issue 12, being built) ----------------------------------------------------------

# One query token per sequence over Nk cached keys, bf16, D=128 (issue 12's shapes): GQA 32:8 and
# MHA, contiguous and paged (page sizes 16 and 256); cases whose K and V would pass 24 GB skipped.
DECODE_CASES = [
    (B, H, H_kv, Nk, page_size)
    for Nk in (1024, 16384, 131072)
    for B in (1, 16, 64)
    for H, H_kv in ((32, 8), (32, 32))
    for page_size in (None, 16, 256)
    if B * Nk * H_kv * 128 * 2 * 2 <= 24e9
]
DECODE_PEERS = ("sdpa_flash", "sdpa_cudnn", "flex_attention")  # on the contiguous cache
_FLEX_DECODE_NK = (16384,)  # FlexAttention compiles per shape (seconds each): timed at these Nk only


def _decode_impls(page_size=None, D: int = 128) -> list[str]:
    """The decode kernels this GPU runs that take this page size (serving._takes_pages)."""
    from .serving import _takes_pages
    from .versions import DEC_VERSIONS

    fits = lambda e: e.page_rule != "copy_engine" or _takes_pages(e, D, page_size or 0, True)
    return [e.name for e in DEC_VERSIONS if e.min_arch <= _arch() and fits(e)]


def paged_cache(k, v, page_size: int, generator):
    """The keys and values of a contiguous (B, Nk, H_kv, D) cache in pages of page_size rows
    (Nk a multiple of it), pages in shuffled order: (k pages, v pages, block table (B, pages))."""
    B, Nk, H_kv, D = k.shape
    pages = Nk // page_size
    perm = torch.randperm(B * pages, device=k.device, generator=generator)
    kc, vc = (torch.empty(B * pages, page_size, H_kv, D, device=k.device, dtype=k.dtype) for _ in range(2))
    kc[perm], vc[perm] = (t.reshape(B * pages, page_size, H_kv, D) for t in (k, v))
    return kc, vc, perm.view(B, pages).to(torch.int32)


def decode_suite(cases=DECODE_CASES, progress=None) -> list[dict]:
    """serving.flash_attn_with_kvcache, each decode kernel this GPU runs, beside SDPA flash and
    cuDNN and FlexAttention (contiguous cache, GQA through enable_gqa) in the same run, as
    effective bandwidth: the bytes of K and V read (B * Nk * H_kv * D * 2 tensors * 2 bytes) over
    the median time.  vs_<peer>: the peer's time over ours in the same case; vs_contiguous (paged
    rows): the contiguous cache's time over the paged one's, same kernel.  rel_err: O against
    float64 on the first sequence."""
    from .serving import flash_attn_with_kvcache
    from .testing import reference

    D, dt = 128, torch.bfloat16
    rows = []
    for B, H, H_kv, Nk, page_size in cases:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, 1, H, D, device="cuda", dtype=dt, generator=gen)
        k, v = (torch.randn(B, Nk, H_kv, D, device="cuda", dtype=dt, generator=gen) for _ in range(2))
        seqlens = torch.full((B,), Nk, dtype=torch.int32, device="cuda")
        base = dict(B=B, H=H, H_kv=H_kv, Nk=Nk, D=D, dtype="bfloat16", page_size=page_size)
        gbytes = B * Nk * H_kv * D * 2 * 2 / 1e9
        kc, vc, table = (k, v, None) if page_size is None else paged_cache(k, v, page_size, gen)
        impls = {
            name: functools.partial(flash_attn_with_kvcache, q, kc, vc, None, None, seqlens, table, version=name)
            for name in _decode_impls(page_size, D)
        }
        if page_size is None:
            for name in DECODE_PEERS:
                if name != "flex_attention" or Nk in _FLEX_DECODE_NK:
                    impls[name] = _peer_fn(name, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), False)

        def error(out):  # against float64 on sequence 0 ((B, H, N, D) views)
            ref, _ = reference(*(t[:1].transpose(1, 2) for t in (q, k, v)), D**-0.5, None)
            return ((out[:1].transpose(1, 2).double() - ref).norm() / ref.norm()).item()

        for name, fn in impls.items():
            checked = error if name.startswith("dec_") else None
            rows.append(_timed_row(dict(impl=name, **base), lambda: fn, "tb_per_s", gbytes, checked))
            if progress:
                progress()
        q = k = v = kc = vc = None
        torch.cuda.empty_cache()
    _decode_ratios(rows)
    return rows


def _decode_ratios(rows: list[dict]) -> None:
    """vs_<peer> on our rows (the peer's contiguous time over ours) and vs_contiguous on paged ones."""
    timed = [r for r in rows if r.get("ms")]
    for r in timed:
        if not r["impl"].startswith("dec_"):
            continue
        same = [p for p in timed if all(p[key] == r[key] for key in ("B", "H", "H_kv", "Nk", "D"))]
        for p in same:
            if p["impl"] in DECODE_PEERS:
                r[f"vs_{p['impl']}"] = p["ms"] / r["ms"]
            elif p["impl"] == r["impl"] and p["page_size"] is None and r["page_size"] is not None:
                r["vs_contiguous"] = p["ms"] / r["ms"]


def decode_steps(cases=DECODE_CASES) -> int:
    return sum(
        len(_decode_impls(page_size)) + (2 + (Nk in _FLEX_DECODE_NK) if page_size is None else 0)
        for _, _, _, Nk, page_size in cases
    )


def _result_rows(columns: list[str], rows: list[dict], leading, rate: tuple[str, str], ratios: list[str]) -> str:
    """A markdown table of a special suite's rows: the leading cells (leading(r), a list), ms, the
    rate (key, format), each ratio key as N.NNx and rel. err; a failed row shows its error."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        head = "| " + " | ".join(str(c) for c in leading(r))
        if r.get("ms") is None:
            lines.append(f"{head} | {r.get('error', '')} |" + " |" * (len(columns) - len(leading(r)) - 1))
            continue
        cells = [f"{r['ms']:.3f}", format(r[rate[0]], rate[1])]
        cells += [f"{r[k]:.2f}x" if r.get(k) else "" for k in ratios]
        cells.append(f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else "")
        lines.append(f"{head} | {' | '.join(cells)} |")
    return "\n".join(lines)


def decode_table(result: dict) -> str:
    return _result_rows(
        ["impl", "B", "H / H_kv", "Nk", "page size", "ms", "TB/s of K, V", "vs cuDNN", "vs FA2", "vs Flex",
         "paged vs contiguous", "rel. err"],
        result["rows"],
        lambda r: [r["impl"], r["B"], f"{r['H']} / {r['H_kv']}", r["Nk"], r["page_size"] or "contiguous"],
        ("tb_per_s", ".2f"),
        ["vs_sdpa_cudnn", "vs_sdpa_flash", "vs_flex_attention", "vs_contiguous"],
    )  # fmt: skip


def decode_chart(result: dict, path: Path) -> None:
    """TB/s of K and V read per case (contiguous caches), tileattn's kernels beside the peers."""
    plt = _pyplot()

    rows = [r for r in result["rows"] if r.get("tb_per_s") and r["page_size"] is None]
    cases = sorted({(r["Nk"], r["B"], r["H_kv"]) for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    tbps = {((r["Nk"], r["B"], r["H_kv"]), r["impl"]): r["tb_per_s"] for r in rows}
    _grouped_bars(ax, cases, impls, lambda c, name: tbps.get((c, name), 0))
    ax.set_xticklabels([f"Nk={nk}\nB={b} {32 // hk}:1" for nk, b, hk in cases], fontsize=7)
    ax.axhline(4.3, color="black", lw=0.6, ls="--")
    ax.text(0, 4.35, "device copy ~4.3 TB/s", fontsize=7)
    ax.set_ylabel("TB/s of K, V read")
    ax.legend(fontsize=8, ncol=len(impls))
    ax.set_title(f"decode, bf16 D=128, one query token, contiguous cache, {result['gpu']} ({result['commit']})",
                 fontsize=9)  # fmt: skip
    _save_figure(fig, path)


# ---- packed documents (issue 12, variable-length batches) ------------------------------------

# 16 documents of 256..8192 tokens (log-uniform, fixed seed) packed into one tensor, bf16, H=16,
# causal within each document; D = 64 and 128.
VARLEN_DOCS = 16
VARLEN_PEERS = ("varlen_attn", "flex_document_mask")


def _document_lengths(n=VARLEN_DOCS, lo=256, hi=8192, seed=0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(lo * (hi / lo) ** u) for u in torch.rand(n, generator=gen).tolist()]


def _varlen_peer(name: str, q, k, v, cu, max_len: int, lens: list[int]):
    import inspect

    if name == "varlen_attn":
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters  # is_causal in 2.9; a window from 2.10 on
        kw = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        return lambda: varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.repeat_interleave(torch.arange(len(lens), device=q.device), torch.tensor(lens, device=q.device))
    total = q.shape[0]
    mask = create_block_mask(lambda b, h, i, j: (doc[i] == doc[j]) & (j <= i), None, None, total, total)
    torch._dynamo.reset()
    flex = torch.compile(flex_attention, dynamic=False)
    qt, kt, vt = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, H, total, D)
    return lambda: flex(qt, kt, vt, block_mask=mask)


def varlen_peers(q, k, v, cu, lens: list[int]) -> tuple[dict, dict]:
    """The peers of VARLEN_PEERS built for these packed documents: ({name: call}, {name: why not}
    for a peer this torch lacks)."""
    calls, errors = {}, {}
    for name in VARLEN_PEERS:
        try:
            calls[name] = _varlen_peer(name, q, k, v, cu, max(lens), lens)
        except Exception as e:  # a peer missing from this torch: record why
            errors[name] = f"{type(e).__name__}: {e}"[:200]
    return calls, errors


def varlen_suite(progress=None) -> list[dict]:
    """flash_attn_varlen_func over packed documents beside torch.nn.attention.varlen.varlen_attn
    (FA2's varlen kernel) and FlexAttention with a document mask, in the same run.  TFLOP/s counts
    each document's own causal work: sum of 2 H D L^2 (4 H L^2 D halved).  rel_err: O against
    float64 on the first two documents."""
    from .reference import attention_varlen
    from .serving import flash_attn_varlen_func
    from .testing import cu_seqlens

    lens, H, dt = _document_lengths(), 16, torch.bfloat16
    cu = cu_seqlens(lens)
    rows = []
    for D in (64, 128):
        gen = torch.Generator(device="cuda").manual_seed(D)
        q, k, v = (torch.randn(sum(lens), H, D, device="cuda", dtype=dt, generator=gen) for _ in range(3))
        flops = sum(2 * H * D * n * n for n in lens)
        # tileattn: v3.3 on Hopper; tileattn (v3.1): the mma.sync path other GPUs run.
        impls = {
            "tileattn": lambda: flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True),
            "tileattn (v3.1)": lambda: flash_attn_varlen_func(
                q, k, v, cu, cu, max(lens), max(lens), causal=True, version="v3.1"
            ),
        }
        peers, errors = varlen_peers(q, k, v, cu, lens)
        impls.update(peers)
        rows += [dict(impl=name, docs=len(lens), H=H, D=D, ms=None, error=why) for name, why in errors.items()]

        def error(out):  # against float64 on the first two documents
            two = cu[2].item()
            as_np = lambda t: t[:two].double().cpu().numpy()
            ref, _ = attention_varlen(as_np(q), as_np(k), as_np(v), cu[:3].tolist(), cu[:3].tolist(), causal=True)
            ref = torch.from_numpy(ref)
            return ((out[:two].double().cpu() - ref).norm() / ref.norm()).item()

        for name, fn in impls.items():
            base = dict(impl=name, docs=len(lens), tokens=sum(lens), H=H, D=D, dtype="bfloat16", causal=True)
            checked = error if name.startswith("tileattn") else None
            rows.append(_timed_row(base, lambda: fn, "tflops", flops / 1e9, checked))
            if progress:
                progress()
    for r in rows:
        if r["impl"].startswith("tileattn") and r.get("ms"):
            for p in rows:
                if p["impl"] in VARLEN_PEERS and p["D"] == r["D"] and p.get("ms"):
                    r[f"vs_{p['impl']}"] = p["ms"] / r["ms"]
    return rows


def varlen_table(result: dict) -> str:
    table = _result_rows(
        ["impl", "documents (tokens)", "H", "D", "ms", "TFLOP/s", "vs varlen_attn", "vs Flex document mask",
         "rel. err"],
        result["rows"],
        lambda r: [r["impl"], f"{r['docs']} ({r.get('tokens', '')})", r["H"], r["D"]],
        ("tflops", ".0f"),
        ["vs_varlen_attn", "vs_flex_document_mask"],
    )  # fmt: skip
    return table + f"\n\nDocument lengths: {', '.join(map(str, _document_lengths()))} (causal within each)."


def varlen_chart(result: dict, path: Path) -> None:
    """TFLOP/s of the packed-documents case per head dim, tileattn beside the peers."""
    plt = _pyplot()

    rows = [r for r in result["rows"] if r.get("tflops")]
    dims = sorted({r["D"] for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    tflops = {(r["D"], r["impl"]): r["tflops"] for r in rows}
    _grouped_bars(ax, dims, impls, lambda d, name: tflops.get((d, name), 0), labels=True)
    ax.set_xticklabels([f"D={d}" for d in dims])
    ax.set_ylabel("TFLOP/s (each document's causal work)")
    ax.legend(fontsize=8)
    ax.set_title(f"{VARLEN_DOCS} packed documents, bf16 H=16, {result['gpu']} ({result['commit']})", fontsize=9)
    _save_figure(fig, path)


# ---- score variants (issue 12: sliding window, softcap, ALiBi) --------------------------------

# bf16, B=2, H=16, N=8192, causal (bottom-right); each variant beside plain causal of the same
# kernel family and FlexAttention's score_mod / mask_mod of the same variant.  TFLOP/s count each
# row's visible (query, key) pairs: 4 D x pairs per head, so a window's skipped blocks are not
# counted as work ("the same work").
VARIANT_SHAPE = dict(B=2, H=16, N=8192)
VARIANT_SPECS = {
    "causal": dict(),
    "softcap 50": dict(softcap=50.0),
    "ALiBi": dict(alibi=True),
    "window 4096": dict(window=(4096, 0)),
    "all three": dict(softcap=50.0, alibi=True, window=(4096, 0)),
}
VARIANT_FLEX_D = (128,)  # FlexAttention compiles per variant and shape: one head dim


def _visible_pairs(N: int, left: int) -> int:
    """Causal (query, key) pairs of an N x N head, within ``left`` keys back when left >= 0."""
    if left < 0:
        return N * (N + 1) // 2
    return sum(min(i + 1, left + 1) for i in range(N))


def _flex_variant(q, k, v, spec: dict, slopes):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    left = spec.get("window", (-1, 0))[0]
    softcap, alibi = spec.get("softcap", 0.0), spec.get("alibi", False)

    def score_mod(score, b, h, i, j):
        if softcap:
            score = softcap * torch.tanh(score / softcap)
        if alibi:
            score = score - slopes[h] * (i - j).abs()
        return score

    mask = (lambda b, h, i, j: (j <= i) & (i - j <= left)) if left >= 0 else (lambda b, h, i, j: j <= i)
    block_mask = create_block_mask(mask, None, None, q.shape[2], k.shape[2])
    torch._dynamo.reset()
    flex = torch.compile(flex_attention, dynamic=False)
    mod = score_mod if softcap or alibi else None
    return lambda: flex(q, k, v, score_mod=mod, block_mask=block_mask)


def variants_suite(progress=None) -> list[dict]:
    """flash_attn_func with each score variant beside its own plain causal call and FlexAttention
    with the same variant, plus cuDNN's plain causal; rel_err: O against float64 on two heads."""
    from .api import flash_attn_func
    from .reference import attention_serving

    B, H, N = VARIANT_SHAPE["B"], VARIANT_SHAPE["H"], VARIANT_SHAPE["N"]
    rows = []
    for D in (64, 128):
        gen = torch.Generator(device="cuda").manual_seed(D)
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], device="cuda")  # BLOOM's slopes
        for variant, spec in VARIANT_SPECS.items():
            kw = dict(softcap=spec.get("softcap", 0.0), window_size=spec.get("window", (-1, -1)),
                      alibi_slopes=slopes if spec.get("alibi") else None)  # fmt: skip
            pairs = _visible_pairs(N, spec.get("window", (-1, 0))[0])
            flops = 4 * B * H * D * pairs
            # name -> a builder of the timed call (FlexAttention compiles in its builder), each built
            # and run within this iteration
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, N, D) views
            builders = {"tileattn": lambda: lambda: flash_attn_func(q, k, v, causal=True, **kw)}
            if D in VARIANT_FLEX_D:
                builders["flex_attention"] = lambda: _flex_variant(qt, kt, vt, spec, slopes)
                if not spec:
                    builders["sdpa_cudnn"] = lambda: _peer_fn("sdpa_cudnn", qt, kt, vt, True)

            def error(out):  # the last 1024 queries (the window is active there)
                heads = lambda t, n: t[:1, -n:, :2].transpose(1, 2).double().cpu().numpy()
                alibi = slopes[:2].cpu().numpy() if spec.get("alibi") else None
                # (bottom-right: query i of the last 1024 sits at key position N - 1024 + i)
                ref, _ = attention_serving(
                    heads(q, 1024), heads(k, N), heads(v, N), D**-0.5, causal=True, window=kw["window_size"],
                    softcap=kw["softcap"], alibi_slopes=alibi,
                )  # fmt: skip
                ref, got = torch.from_numpy(ref), out[:1, -1024:, :2].transpose(1, 2).double().cpu()
                return ((got - ref).norm() / ref.norm()).item()

            for name, build in builders.items():
                base = dict(impl=name, variant=variant, B=B, H=H, N=N, D=D, dtype="bfloat16", causal=True)
                rows.append(_timed_row(base, build, "tflops", flops / 1e9, error if name == "tileattn" else None))
                if progress:
                    progress()
    for r in rows:
        if r["impl"] != "tileattn" or not r.get("ms"):
            continue
        for p in rows:
            if p["D"] != r["D"] or not p.get("tflops"):
                continue
            if p["impl"] == "tileattn" and p["variant"] == "causal":
                r["vs_causal"] = r["tflops"] / p["tflops"]  # same work rate: TFLOP/s over TFLOP/s
            if p["impl"] == "flex_attention" and p["variant"] == r["variant"]:
                r["vs_flex_attention"] = p["ms"] / r["ms"]
            if p["impl"] == "sdpa_cudnn":
                r["vs_sdpa_cudnn"] = r["tflops"] / p["tflops"]
    return rows


def variants_steps() -> int:
    return 2 * len(VARIANT_SPECS) + len(VARIANT_FLEX_D) * (len(VARIANT_SPECS) + 1)


def variants_table(result: dict) -> str:
    table = _result_rows(
        ["impl", "variant", "D", "ms", "TFLOP/s (visible pairs)", "vs plain causal (TFLOP/s)", "vs Flex (same variant)",
         "vs cuDNN causal (TFLOP/s)", "rel. err"],
        result["rows"],
        lambda r: [r["impl"], r["variant"], r["D"]],
        ("tflops", ".0f"),
        ["vs_causal", "vs_flex_attention", "vs_sdpa_cudnn"],
    )  # fmt: skip
    shape = VARIANT_SHAPE
    return table + (
        f"\n\nbf16, B={shape['B']}, H={shape['H']}, N={shape['N']}, causal (bottom-right); softcap 50, ALiBi with "
        "BLOOM's slopes 2^(-8(h+1)/H), window 4096 keys back."
    )


def variants_chart(result: dict, path: Path) -> None:
    """TFLOP/s (visible pairs) of each variant per head dim, tileattn beside FlexAttention."""
    plt = _pyplot()

    rows = [r for r in result["rows"] if r.get("tflops") and r["impl"] in ("tileattn", "flex_attention")]
    groups = list(dict.fromkeys((r["D"], r["variant"]) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    tflops = {(r["D"], r["variant"], r["impl"]): r["tflops"] for r in rows}
    fig, ax = plt.subplots(figsize=(10, 3.8))
    _grouped_bars(ax, groups, impls, lambda g, name: tflops.get((*g, name), 0), labels=True)
    ax.set_xticklabels([f"D={d}\n{v}" for d, v in groups], fontsize=7)
    ax.set_ylabel("TFLOP/s (visible pairs)")
    ax.legend(fontsize=8)
    ax.set_title(f"Score variants, bf16 causal N=8192, {result['gpu']} ({result['commit']})", fontsize=9)
    _save_figure(fig, path)


# ---- FP8 (issue 13): v3.5 beside tileattn's bf16 default and cuDNN on the same values --------------

FP8_SHAPES = tuple((32768 // N, 16, N, D) for D in (64, 128, 256) for N in (1024, 8192))  # (B, H, N, D)


def fp8_suite(shapes=FP8_SHAPES, progress=None) -> list[dict]:
    """bf16 inputs x, quantized per (batch, head) by fp8.quantize_e4m3: flash_attn_func on the e4m3
    tensors (tileattn_fp8: the whole call, V^T's copy included; tileattn_fp8_kernel: the kernel
    alone, given V^T), beside tileattn (bf16 default), cuDNN and SDPA flash on x.  rel_err: O
    against float64 attention of x (input quantization included); rel_err_dequant (FP8 rows):
    against float64 of the values the e4m3 inputs stand for (the kernel's own error)."""
    from . import fp8
    from .api import flash_attn_func

    rows = []
    for B, H, N, D in shapes:
        for causal in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(N + D)
            x = [torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)]
            (q8, dq), (k8, dk), (v8, dv) = quantized = [fp8.quantize_e4m3(t) for t in x]
            vt = fp8.v_transposed(v8.transpose(1, 2))
            xt = [t.transpose(1, 2) for t in x]  # (B, H, N, D) views
            dequant = [(t8.float() * d.view(B, 1, H, 1)).transpose(1, 2) for t8, d in quantized]
            mode = "bottom_right" if causal else None
            builders = {
                "tileattn_fp8": lambda: (
                    lambda: flash_attn_func(q8, k8, v8, causal=causal, descale_q=dq, descale_k=dk, descale_v=dv)
                ),
                "tileattn_fp8_kernel": lambda: (
                    lambda: fp8.attention(q8, k8, v8, D**-0.5, mode, "bnhd", (dq, dk, dv), False, vt=vt)[0]
                ),
                "tileattn_bf16": lambda: lambda: flash_attn_func(*x, causal=causal),
                "sdpa_cudnn": lambda: _peer_fn("sdpa_cudnn", *xt, causal),
                "sdpa_flash": lambda: _peer_fn("sdpa_flash", *xt, causal),
            }
            flops = Case(B, H, N, D, "bfloat16", causal).flops
            for name, build in builders.items():
                dtype = "float8_e4m3fn" if "fp8" in name else "bfloat16"
                base = dict(impl=name, B=B, H=H, Nq=N, Nk=N, D=D, dtype=dtype, causal=causal)
                layout = (lambda o: o.transpose(1, 2)) if name.startswith("tileattn") else (lambda o: o)
                row = _timed_row(base, build, "tflops", flops / 1e9, lambda o: rel_err(layout(o), *xt, causal))
                if "fp8" in name and row.get("ms"):
                    row["rel_err_dequant"] = rel_err(layout(build()()), *dequant, causal)
                rows.append(row)
                if progress:
                    progress()
    same_case = lambda a, b: all(a[k] == b[k] for k in ("B", "H", "Nq", "D", "causal"))
    for r in rows:
        for p in rows:
            if r.get("tflops") and p.get("tflops") and same_case(r, p) and r["impl"] != p["impl"]:
                if p["impl"] in ("tileattn_bf16", "sdpa_cudnn", "sdpa_flash"):
                    r[f"vs_{p['impl']}"] = r["tflops"] / p["tflops"]
    return rows


def fp8_table(result: dict) -> str:
    return _result_rows(
        ["impl", "D", "N", "causal", "ms", "TFLOP/s", "vs tileattn bf16", "vs cuDNN (bf16)", "vs SDPA flash (bf16)",
         "rel. err"],
        result["rows"],
        lambda r: [r["impl"], r["D"], r["Nq"], "yes" if r["causal"] else "no"],
        ("tflops", ".0f"),
        ["vs_tileattn_bf16", "vs_sdpa_cudnn", "vs_sdpa_flash"],
    ) + (
        "\n\nH=16, B*N = 32768; bf16 inputs quantized to e4m3 per (batch, head) for the FP8 rows (rel. err against "
        "float64 of the bf16 inputs, input quantization included; rel_err_dequant in the JSON: against the values "
        "the e4m3 inputs stand for).  tileattn_fp8 includes V^T's copy; tileattn_fp8_kernel is the kernel alone."
    )  # fmt: skip


def fp8_chart(result: dict, path: Path) -> None:
    """TFLOP/s per case, the FP8 call beside the bf16 ones."""
    plt = _pyplot()

    rows = [r for r in result["rows"] if r.get("tflops")]
    groups = list(dict.fromkeys((r["D"], r["Nq"], r["causal"]) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    tflops = {(r["D"], r["Nq"], r["causal"], r["impl"]): r["tflops"] for r in rows}
    fig, ax = plt.subplots(figsize=(11, 3.8))
    _grouped_bars(ax, groups, impls, lambda g, name: tflops.get((*g, name), 0))
    ax.set_xticklabels([f"D={d} N={n}\n{'causal' if c else 'full'}" for d, n, c in groups], fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7)
    ax.set_title(f"FP8 e4m3 (v3.5) beside bf16, H=16, {result['gpu']} ({result['commit']})", fontsize=9)
    _save_figure(fig, path)


# ---- the main job: the whole ladder in about two minutes ----------------------------------------

# (rungs, peers, case): the K/V-outer v1 rungs take seconds per call at N=8192, so they run at
# N=1024 (labelled by the N column); the rest at N=8192.
STORY = (
    (("v1", "v1_br48", "v1.1"), ("sdpa_efficient", "sdpa_math"), Case(4, 8, 1024, 64, "float32", False)),
    (("v2", "v2.1", "v2.2", "v2.3", "v2.4", "v2.5"), ("sdpa_efficient",), Case(4, 8, 8192, 64, "float32", False)),
    (
        ("v3", "v3.1", "v3.2", "v3.3", "v3.6"),
        ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"),
        Case(4, 16, 8192, 128, "bfloat16", False),
    ),
)


def story(progress=None) -> list[dict]:
    rows = []
    for versions, peers, case in STORY:
        rows += run([case], [v for v in versions if VERSIONS[v].runs_on(_arch())], list(peers), progress=progress)
    return rows


def story_steps() -> int:
    return sum(len([v for v in versions if VERSIONS[v].runs_on(_arch())]) + len(peers) for versions, peers, _ in STORY)


def story_summary(rows: list[dict]) -> str:
    """Three lines: per dtype the fastest rung against the fastest peer at N=8192, then the ladder."""
    lines = []
    for dtype in ("float32", "bfloat16"):
        group = [r for r in rows if r["dtype"] == dtype and r["Nq"] == 8192 and r.get("tflops")]
        rungs = [r for r in group if "kind" in r]
        peers = [r for r in group if "kind" not in r]
        if rungs and peers:
            best, peer = max(rungs, key=lambda r: r["tflops"]), max(peers, key=lambda r: r["tflops"])
            lines.append(
                f"{dtype}: {best['impl']} {best['tflops']:.0f} TFLOP/s, {best['tflops'] / peer['tflops']:.2f}x "
                f"the fastest PyTorch backend ({peer['impl']}, {peer['tflops']:.0f} TFLOP/s), "
                f"D={best['D']}, N={best['Nq']}"
            )
    rungs = [r for r in rows if "kind" in r and r.get("tflops")]
    if rungs:
        first = next(r for r in rungs if r["impl"] == rungs[0]["impl"])
        best = max(rungs, key=lambda r: r["tflops"])
        lines.append(
            f"ladder: {first['impl']} {first['tflops']:.2f} TFLOP/s (FP32, N={first['Nq']}) -> {best['impl']} "
            f"{best['tflops']:.0f} TFLOP/s ({best['dtype']}): {best['tflops'] / first['tflops']:.0f}x"
        )
    return "\n".join(lines)


def result_table(result: dict) -> str:
    """The markdown table of a results file, whichever suite made it (story adds its summary)."""
    suite = result.get("suite")
    if suite == "overhead":
        return overhead_table(result)
    if suite == "hf":
        return hf_table(result)
    if suite == "decode":
        return decode_table(result)
    if suite == "varlen":
        return varlen_table(result)
    if suite == "variants":
        return variants_table(result)
    if suite == "fp8":
        return fp8_table(result)
    if suite == "bwd":
        return bwd_table(result) + "\n\n" + "\n".join(f"- {line}" for line in bwd_summary(result["rows"]).splitlines())
    table = markdown_table(result)
    if suite == "story":
        table += "\n\n" + "\n".join(f"- {line}" for line in story_summary(result["rows"]).splitlines())
    return table
