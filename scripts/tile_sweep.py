"""Time one rung at other (Br, Bc) tiles than the registered ones, beside one peer (sdpa_flash), to choose
tiles by measurement.  Usage (on a GPU):
    python scripts/tile_sweep.py v3.1 64:128x64,128x128 128:128x32,128x64 [--dtype bfloat16] [--seqlen 8192] [--steady]
Prints one line per (tile, shape) and writes JSON to $OUT/tile_sweep.json when OUT is set."""

import argparse
import dataclasses
import json
import os

import tileattn.versions as versions
from tileattn import bench
from tileattn._nvrtc import CSRC


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("version")
    ap.add_argument("specs", nargs="+", help="D:BrxBc,BrxBc,...")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--peer", default="sdpa_flash", help="the peer to time beside and divide by")
    ap.add_argument("--steady", action="store_true", help="time at the steady clock (bench --steady)")
    args = ap.parse_args()
    bench.STEADY = args.steady
    base = versions.VERSIONS[args.version]
    rows = []
    for spec in args.specs:
        D, tiles = spec.split(":")
        D = int(D)
        names = []
        for t in tiles.split(","):
            t, *macros = t.split("+")  # e.g. 128x64+TILEATTN_RESCALE_SKIP: compile with that macro defined
            Br, Bc = map(int, t.split("x"))
            name = f"{args.version}@{Br}x{Bc}" + "".join("+" + m for m in macros)
            file = base.file
            if macros:
                file = f"_sweep_{'_'.join(macros)}.cu"
                (CSRC / file).write_text("".join(f"#define {m}\n" for m in macros) + f'#include "{base.file}"\n')
            versions.VERSIONS[name] = dataclasses.replace(base, name=name, file=file, tiles={D: (Br, Bc)})
            names.append(name)
        B = 32768 // args.seqlen
        cases = [bench.Case(B, args.heads, args.seqlen, D, args.dtype, c) for c in (False, True)]
        rows += bench.run(cases, names, [args.peer])
    flash = {(r["D"], r["causal"]): r["tflops"] for r in rows if r["impl"] == args.peer}
    for r in rows:
        ratio = r["tflops"] / flash[(r["D"], r["causal"])]
        print(
            f"{r['impl']:>16} D={r['D']:<4} causal={r['causal']!s:<5} {r['ms']:8.3f} ms {r['tflops']:6.1f} TFLOP/s "
            f"{ratio:5.3f}x {args.peer}  err={r.get('rel_err', float('nan')):.1e}"
        )
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "tile_sweep.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
