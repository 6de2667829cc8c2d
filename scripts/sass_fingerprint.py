"""SASS fingerprints of every instantiation (the forward ladder's first dtype; the backward and
decode kernels' every dtype), to show that a refactor leaves the kernels alone.

    python scripts/sass_fingerprint.py OUT.json [--arch sm_90a] [--jobs 2] [--files v3_3 v3_6 ...]
    python scripts/sass_fingerprint.py --diff BEFORE.json AFTER.json

Each kernel's SASS is normalised (addresses, encodings and the constant-bank offsets of kernel
parameters masked, so a parameter block that moves is not a difference) and kept as a hash, an
opcode histogram and ptxas's register/spill report.  --diff lists the kernels whose instruction
streams differ and how their opcode counts moved.
"""

import argparse
import collections
import hashlib
import json
import re
import sys
from concurrent.futures import ProcessPoolExecutor


def _one(job):
    from tileattn import _nvrtc

    file, expr, arch = job
    cubin = _nvrtc.compile_kernel(file, expr, arch, announce=False)
    lines = []
    for line in _nvrtc.sass(cubin).splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;", line)
        if not m:
            continue
        ins = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][P]", m.group(1))
        lines.append(ins)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0] for ins in lines)
    text = "\n".join(lines)
    return expr + "@" + arch, dict(
        hash=hashlib.sha256(text.encode()).hexdigest()[:16], n=len(lines), ops=dict(ops), res=cubin.resources
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--diff", nargs=2)
    ap.add_argument("--files", nargs="+", help="only kernels whose source file's name contains one of these")
    a = ap.parse_args()
    if a.diff:
        before, after = (json.load(open(p)) for p in a.diff)
        same = 0
        for key in sorted(before.keys() | after.keys()):
            b, c = before.get(key), after.get(key)
            if b is None or c is None:
                print(f"{'added' if b is None else 'removed'}: {key}")
            elif b["hash"] == c["hash"]:
                same += 1
            else:
                delta = {op: c["ops"].get(op, 0) - b["ops"].get(op, 0) for op in b["ops"].keys() | c["ops"].keys()}
                delta = {op: d for op, d in sorted(delta.items()) if d}
                print(f"differs: {key}  n {b['n']}->{c['n']}  res {b['res']} -> {c['res']}  {delta}")
        print(f"{same} of {len(before)} identical")
        return
    from tileattn import versions
    from tileattn.versions import VERSIONS, arch_number

    cc = arch_number(a.arch)
    plain = a.arch.rstrip("a")  # rungs without wgmma/setmaxnreg build for sm_XY, as on the GPU
    jobs = [
        (v.file, v.name_expression(v.dtypes[0], D, causal, cc), a.arch if v.arch_specific else plain)
        for v in VERSIONS.values()
        if v.runs_on(cc)
        for D in v.head_dims
        for causal in (False, True)
    ]
    # The kernels outside the forward ladder (backward, decode), each of their dtypes.
    jobs += [
        (e.file, e.name_expression(*inst), a.arch if e.arch_specific else plain)
        for e in versions.KERNEL_ENTRIES.values()
        if e.runs_on(cc)
        for inst in e.instantiations()
    ]
    if a.files:
        jobs = [job for job in jobs if any(f in job[0] for f in a.files)]
    with ProcessPoolExecutor(a.jobs) as pool:
        result = dict(pool.map(_one, jobs))
    json.dump(result, open(a.out, "w"), indent=0, sort_keys=True)
    print(f"{len(result)} kernels -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
