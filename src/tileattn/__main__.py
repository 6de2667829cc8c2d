"""python -m tileattn {info, check, compile, bench, fuzz, report}: the rungs, their checks against
float64, ahead-of-time compilation, the benchmark (default: the whole ladder beside PyTorch), the
fuzz run, and the README tables regenerated from bench/results."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .versions import BWD_VERSIONS, KERNEL_ENTRIES, VERSIONS


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _rungs_here() -> list[str]:
    """The rungs that run on the current GPU's arch."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return [name for name, v in VERSIONS.items() if v.runs_on(major * 10 + minor)]


def cmd_info(args) -> int:
    import torch

    from . import _nvrtc

    try:
        print(f"tileattn: NVRTC {_nvrtc.nvrtc_full_version()}")
        print(f"CUDA headers: {_nvrtc.headers_version()}")
    except Exception as e:  # a diagnosis, not a traceback
        print(
            f"tileattn: NVRTC or the CUDA headers could not be loaded ({type(e).__name__}: {e}); "
            "install them with: pip install 'nvidia-cuda-nvrtc>=13' 'nvidia-cuda-runtime>=13'"
        )
    print(f"kernel cache: {_nvrtc.cache_dir()}")
    if _has_gpu():
        cc = torch.cuda.get_device_capability()
        print(f"GPU: {torch.cuda.get_device_name()} (sm_{cc[0]}{cc[1]}), torch {torch.__version__}")
    else:
        print(f"GPU: none found (torch {torch.__version__}); kernels still compile, they cannot run")
    print("rungs:")
    for v in VERSIONS.values():
        tiles = ", ".join(f"D={d}: Br={br} Bc={bc}" for d, (br, bc) in v.tiles.items())
        print(f"  {v.name:8s} {v.kind:5s} {'/'.join(v.dtypes):8s} {v.arch_range()}  {tiles}\n           {v.summary}")
        for arch, over in v.arch_tiles.items():
            print(f"           on sm_{arch}+: " + ", ".join(f"D={d}: Br={br} Bc={bc}" for d, (br, bc) in over.items()))
    print("outside the ladder (backward, decode, varlen, variants):")
    for e in KERNEL_ENTRIES.values():
        if e.summary:
            dims = ", ".join(map(str, e.head_dims))
            archs = f"sm_{e.min_arch}" + ("+" if e.max_arch is None else "")
            print(f"  {e.name:8s} {'/'.join(e.dtypes):16s} {archs}  D={dims}\n           {e.summary}")
    return 0


def cmd_check(args) -> int:
    if not _has_gpu():
        print("tileattn check: no CUDA GPU found; nothing to check (the CPU tests are `pytest`)")
        return 1
    import torch
    from tqdm import tqdm

    from .testing import check_cases, passed, run_case

    cases = check_cases(args.versions or _rungs_here())
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    failures = 0
    lines = []
    for case in tqdm(cases, desc="check", file=sys.stderr):
        try:
            res = run_case(case, gen)
            ok = passed(case, res)
            msg = f"rel_err {res['rel_err']:.1e}  lse_err {res['lse_err']:.1e}" + ("" if ok else f"  {res}")
        except Exception as e:  # a crash is a failure to report, not a reason to stop checking
            ok, msg = False, f"{type(e).__name__}: {e}"
        failures += not ok
        lines.append(f"{'PASS' if ok else 'FAIL'}  {case.label():60s} {msg}")
    print("\n".join(lines))
    print(f"{len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


def cmd_fuzz(args) -> int:
    """Hypothesis-drawn cases against float64: the kernels on a GPU, the NumPy loop nest without."""
    from tqdm import tqdm

    from . import fuzz

    device = "cuda" if _has_gpu() and not args.cpu else "cpu"
    if device == "cuda":
        versions = args.versions or _rungs_here()
    else:
        print("tileattn fuzz: no GPU (or --cpu): checking the NumPy loop nest of each rung instead", file=sys.stderr)
        versions = args.versions or list(VERSIONS)
    with tqdm(total=args.cases, desc=f"fuzz ({device})", file=sys.stderr) as bar:
        summary = fuzz.run(
            args.cases,
            args.seed,
            versions,
            device=device,
            progress=bar.update,
            time_limit_s=args.time_limit,
            max_len=args.max_len,
        )
    if args.out:
        fuzz.save(summary, args.out)
    for r in summary["failures"][:20]:
        print("FAIL", r)
    print(
        f"fuzz ({device}, seed {args.seed}): {summary['cases']} cases in {summary['seconds']} s over "
        f"{len(summary['cases_per_version'])} rungs"
    )
    print(f"{summary['cases'] - summary['failed']} passed, {summary['failed']} failed")
    return 1 if summary["failed"] or summary["cases"] < args.cases else 0


def _compile_one(job):
    from . import _nvrtc

    file, expr, arch = job
    cubin = _nvrtc.compile_kernel(file, expr, arch, announce=False)
    return expr, cubin.compile_seconds, cubin.resources


def _compile_for_tests(job_and_sass):
    """testing.compile_in_parallel's worker: one kernel into the disk cache and, when asked, its
    SASS back to the parent as (sha256 of the cubin, disassembly)."""
    from . import _nvrtc

    (file, expr, arch), want_sass = job_and_sass
    cubin = _nvrtc.compile_kernel(file, expr, arch, announce=False)
    return (_nvrtc.sass_key(cubin), _nvrtc.sass(cubin)) if want_sass else None


def cmd_compile(args) -> int:
    """Fill the disk cache with every instantiation of the chosen rungs, NVRTC runs in parallel."""
    from concurrent.futures import ProcessPoolExecutor

    from . import _nvrtc

    if args.arch:
        arch_for = lambda v: args.arch
        cc_num = int("".join(ch for ch in args.arch if ch.isdigit()))
    elif _has_gpu():
        import torch

        cc = torch.cuda.get_device_capability()
        arch_for = lambda v: _nvrtc.arch_string(cc, arch_specific=v.arch_specific)
        cc_num = cc[0] * 10 + cc[1]
    else:
        print("tileattn compile: no GPU found; pass --arch (e.g. sm_90a)")
        return 1
    jobs = [
        (v.file, v.name_expression(dt, D, causal, cc_num), arch_for(v))
        for v in VERSIONS.values()
        if (not args.versions or v.name in args.versions) and v.runs_on(cc_num)
        for dt in v.dtypes
        for D in v.head_dims
        for causal in (False, True)
    ]
    # and the kernels outside the ladder (backward, its D_i kernel, decode, the packed kernels): all
    # of them, or those named
    plain_arch = arch_for(VERSIONS["v2"]).rstrip("a")
    jobs += [
        (v.file, v.name_expression(*inst), arch_for(v) if v.arch_specific else plain_arch)
        for v in KERNEL_ENTRIES.values()
        if (not args.versions or v.name in args.versions) and v.runs_on(cc_num)
        for inst in v.instantiations()
    ]
    from tqdm import tqdm

    with (
        ProcessPoolExecutor(max_workers=args.jobs) as pool,
        tqdm(total=len(jobs), desc="compile", file=sys.stderr) as bar,
    ):
        for expr, seconds, res in pool.map(_compile_one, jobs):
            bar.write(f"{expr:60s} {seconds:6.1f} s  {res}", file=sys.stdout)
            bar.update()
    print(f"{len(jobs)} kernels in {_nvrtc.cache_dir()}")
    return 0


_SPECIAL_SUITES = ("story", "overhead", "hf", "bwd", "decode", "varlen", "variants", "fp8")
# Suites that name others: serving runs the three of issue 12 (each writes its own results file).
_SUITE_GROUPS = {"serving": ("decode", "varlen", "variants")}


def _narrow(cases, args) -> list:
    """Narrow a suite (lengths, head dims, dtype, causal) or resize its shapes (batch, heads)."""
    return [
        dataclasses.replace(c, B=args.batch or c.B, H=args.heads or c.H)
        for c in cases
        if (not args.seqlen or c.N in args.seqlen)
        and (not args.headdim or c.D in args.headdim)
        and (not args.dtype or c.dtype in args.dtype)
        and (args.causal is None or c.causal in args.causal)
    ]


def _narrowing_args(args) -> list[str]:
    given = []
    for flag in ("versions", "seqlen", "headdim", "dtype", "causal", "batch", "heads"):
        value = getattr(args, flag)
        if value not in (None, []):
            given += [f"--{flag}", *map(str, value if isinstance(value, list) else [value])]
    return given


def cmd_bench(args) -> int:
    if not _has_gpu():
        given = [
            f"--{k.replace('_', '-')}"
            for k, v in vars(args).items()
            if k not in ("cmd", "out_dir", "suite") and v not in (None, False, [])
        ]
        if args.suite != ["story"]:
            given.insert(0, "--suite")
        if given:
            print(f"tileattn bench: no GPU, so these arguments have no effect: {' '.join(given)}")
        return _cpu_fallback()
    from tqdm import tqdm

    from . import bench

    bench.STEADY = args.steady
    total_rc = 0
    bwd_cases = _narrow(bench.BWD_CASES, args)
    bwd_rungs = [v for v in args.versions or BWD_VERSIONS if v in BWD_VERSIONS]  # (the forward's are ignored)
    suites = [name for group in args.suite for name in _SUITE_GROUPS.get(group, (group,))]
    for suite_name in dict.fromkeys(suites):
        out = Path(args.out_dir) / f"{suite_name}.json"
        if suite_name in _SPECIAL_SUITES:
            with tqdm(
                total={
                    "story": bench.story_steps,
                    "bwd": lambda: bench.bwd_steps(bwd_cases, bwd_rungs),
                    "decode": bench.decode_steps,
                    "varlen": lambda: 2 * (2 + len(bench.VARLEN_PEERS)),
                    "variants": bench.variants_steps,
                    "fp8": lambda: 2 * 5 * len(bench.FP8_SHAPES),
                }.get(suite_name, lambda: None)(),
                desc=f"bench {suite_name}",
                file=sys.stderr,
            ) as bar:
                rows = {
                    "story": lambda: bench.story(progress=bar.update),
                    "overhead": bench.overhead,
                    "hf": bench.hf_prefill,
                    "bwd": lambda: bench.backward_suite(bwd_cases, bwd_rungs, progress=bar.update),
                    "decode": lambda: bench.decode_suite(progress=bar.update),
                    "varlen": lambda: bench.varlen_suite(progress=bar.update),
                    "variants": lambda: bench.variants_suite(progress=bar.update),
                    "fp8": lambda: bench.fp8_suite(progress=bar.update),
                }[suite_name]()
            if suite_name == "story":
                bench.add_ratios(rows)
            # Only bwd takes the narrowing arguments: record the command that reproduces each (and
            # --steady, which changes every other special suite's timings; bwd's are always steady).
            result = dict(
                **bench.environment(),
                suite=suite_name,
                command=f"python -m tileattn bench --suite {suite_name}"
                + (" " + " ".join(_narrowing_args(args)) if suite_name == "bwd" else "").rstrip()
                + (" --steady" if args.steady and suite_name != "bwd" else ""),
                rows=rows,
            )
            chart = bench.save(result, out)
            print(bench.result_table(result))
            print(f"\nwrote {out}" + (f" and {chart}" if chart else "") + "\n")
            continue
        suite = bench.SUITES[suite_name]
        versions = [v for v in (args.versions or suite.versions) if v in VERSIONS]
        cases = _narrow(suite.cases(), args)
        peers = [] if args.no_peers else list(suite.peers)
        total = sum(
            len([v for v in versions if VERSIONS[v].supports(c.dtype, c.D, bench._arch(), VERSIONS[v].precision)])
            + len(peers)
            for c in cases
        )
        with tqdm(total=total, desc=f"bench {suite_name}", file=sys.stderr) as bar:
            rows = bench.run(
                cases,
                versions,
                peers,
                progress=bar.update,
                flex_seqlens=suite.flex_seqlens,
                flex_head_dims=suite.flex_head_dims,
            )
        bench.add_ratios(rows)
        result = dict(
            **bench.environment(), suite=suite_name, command="python -m tileattn " + " ".join(sys.argv[1:]), rows=rows
        )
        bench.save(result, out)
        print(bench.markdown_table(result))
        print(f"\nwrote {out} and {out.with_suffix('.png')}\n")
    return total_rc


def _cpu_fallback() -> int:
    import numpy as np

    from .reference import attention_naive, attention_tiled

    print(
        "tileattn bench: no CUDA GPU found, so no kernel can run here.\n"
        "Running the NumPy reference of the v2 loop nest on a small shape instead (B=1, H=2, N=300, D=64)."
    )
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 300, 64)) for _ in range(3))
    for causal in (None, "top_left"):
        O, _ = attention_tiled(q, k, v, causal=causal, Br=128, Bc=32)
        ref, _ = attention_naive(q, k, v, causal=causal)
        err = np.linalg.norm(O - ref) / np.linalg.norm(ref)
        print(f"  tiled (Br=128, Bc=32, float32) vs naive (float64), causal={causal}: rel. error {err:.1e}")
    return 0


def cmd_report(args) -> int:
    """Regenerate the result tables of README.md and docs/*.md from the committed JSON under
    bench/results/.  Each table sits between <!-- results:NAME --> and <!-- /results:NAME -->
    markers; <!-- results:NAME N=8192 --> keeps only that sequence length (the full table is in the
    JSON), <!-- results:NAME N=8192 bfloat16 --> also only that dtype; <!-- results:NAME ratios -->
    is one line per shape with every rung's ratio to every peer.
    The story, overhead and hf suites have tables of their own."""
    import os
    import re

    from . import bench

    readme, results = Path(args.readme), Path(args.results)
    if not readme.exists() or not results.is_dir():
        print(
            f"tileattn report: needs a checkout of tileattn (no {readme} or {results}/ here); run it from "
            "the repository's root or pass --readme and --results"
        )
        return 1
    docs = [readme, *sorted((readme.parent / "docs").glob("*.md"))]
    data = {path: json.loads(path.read_text()) for path in sorted(results.glob("*.json"))}
    for doc in docs:
        text = original = doc.read_text()
        rel = os.path.relpath(results, doc.parent)
        for path, result in data.items():
            name = re.escape(path.stem)
            pattern = re.compile(
                rf"<!-- results:{name}( N=(\d+)(?: (\w+))?| ratios)? -->.*?<!-- /results:{name} -->", re.S
            )

            def block(m, path=path, result=result):
                if m.group(1) == " ratios":
                    table = bench.ratio_table(result)
                elif m.group(2):  # one length, and one dtype if given
                    keep = lambda r: r["Nq"] == int(m.group(2)) and m.group(3) in (None, r["dtype"])
                    table = bench.result_table(dict(result, rows=[r for r in result["rows"] if keep(r)]))
                else:
                    table = bench.result_table(result)
                chart = (
                    f", chart: [{path.stem}.png]({rel}/{path.stem}.png)"
                    if (path.parent / f"{path.stem}.png").exists()
                    else ""
                )
                return (
                    f"<!-- results:{path.stem}{m.group(1) or ''} -->\n{table}\n\n"
                    f"{result['gpu']}, commit {result['commit']}, torch {result['torch']}, {result['date'][:10]}; "
                    f"`{result['command']}`; all rows: [{path.name}]({rel}/{path.name}){chart}\n"
                    f"<!-- /results:{path.stem} -->"
                )

            text, n = pattern.subn(block, text)
            if n:
                print(f"{doc}: {path.name}, {n} table(s)")
        if text == original:
            print(f"{doc}: unchanged")
        else:
            doc.write_text(text)
            print(f"{doc}: updated")
    return 0


def _suites():
    from .bench import SUITES  # bench imports torch lazily enough; names only

    return SUITES


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tileattn", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="GPU, arch, NVRTC, cache dir, rungs")
    c = sub.add_parser("check", help="every rung on awkward shapes vs float64")
    c.add_argument("--versions", nargs="*", choices=list(VERSIONS))
    c.add_argument("--seed", type=int, default=0)
    k = sub.add_parser("compile", help="compile every rung into the disk cache (parallel)")
    k.add_argument("--versions", nargs="*", choices=[*VERSIONS, *KERNEL_ENTRIES], help="rungs or other kernels (all)")
    k.add_argument("--arch", help="e.g. sm_90a; default: this GPU's")
    k.add_argument("--jobs", type=int, default=None)
    b = sub.add_parser("bench", help="rungs beside PyTorch's attention backends, one suite at a time")
    b.add_argument(
        "--suite",
        nargs="+",
        default=["story"],
        choices=[*_SPECIAL_SUITES, *_SUITE_GROUPS, *_suites()],
        help="story (default): the ladder v1 -> fastest rung, FP32 and bf16, beside PyTorch, ~2 min; "
        "ladder_fp32: the seed's table; fp32: fast FP32 rungs; mma: fp16/bf16 tensor cores; "
        "overhead: host time per call; hf: end-to-end prefill in transformers; bwd: the backward pass "
        "beside cuDNN, FA2, efficient and FlexAttention, with peak memory; decode: split-KV decoding over "
        "contiguous and paged KV caches beside SDPA flash and cuDNN; varlen: packed documents beside "
        "varlen_attn and FlexAttention; variants: window, softcap, ALiBi beside plain causal and "
        "FlexAttention; fp8: v3.5 (e4m3) beside bf16 tileattn, cuDNN and SDPA flash; serving: decode, varlen "
        "and variants",
    )
    b.add_argument(
        "--versions",
        nargs="*",
        choices=[*VERSIONS, *BWD_VERSIONS],
        help="override the suite's rungs (bwd: backward rungs)",
    )
    b.add_argument("--seqlen", type=int, nargs="*", help="keep only these lengths of the suite")
    b.add_argument("--headdim", type=int, nargs="*", help="keep only these head dims of the suite")
    b.add_argument("--dtype", nargs="*", choices=["float32", "float16", "bfloat16"], help="keep only these dtypes")
    b.add_argument(
        "--causal", nargs="*", type=lambda x: x.lower() in ("1", "true", "yes"), help="keep only these: true / false"
    )
    b.add_argument("--batch", type=int, help="override the suite's batch size")
    b.add_argument("--heads", type=int, help="override the suite's number of heads")
    b.add_argument("--no-peers", action="store_true")
    b.add_argument(
        "--steady",
        action="store_true",
        help="time every row at the card's power-limited steady clock (0.5-s soak, 1-s window; "
        "~1.5 s a row): the bwd suite always does",
    )
    b.add_argument("--out-dir", default="bench/results")
    f = sub.add_parser("fuzz", help="hypothesis-drawn cases vs float64 (GPU; NumPy loop nest without one)")
    f.add_argument("--cases", type=int, default=1000)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--versions", nargs="*", choices=list(VERSIONS))
    f.add_argument("--max-len", type=int, default=None, help="cap Nq and Nk")
    f.add_argument("--time-limit", type=float, default=None, help="stop drawing after this many seconds")
    f.add_argument("--cpu", action="store_true", help="check the NumPy loop nest even where a GPU exists")
    f.add_argument("--out", help="write the summary JSON here")
    r = sub.add_parser("report", help="regenerate README tables from bench/results/*.json")
    r.add_argument("--readme", default="README.md")
    r.add_argument("--results", default="bench/results")
    args = p.parse_args(argv)
    return {
        "info": cmd_info,
        "check": cmd_check,
        "compile": cmd_compile,
        "bench": cmd_bench,
        "fuzz": cmd_fuzz,
        "report": cmd_report,
    }[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
