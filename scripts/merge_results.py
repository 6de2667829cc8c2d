"""Merge result files of one suite, run one after another in the same device call (the backward
suite split by sequence length to stay under a call's time limit), into one file and its chart:
    python3 scripts/merge_results.py OUT.json A.json B.json ...
Rows are concatenated; the environment (GPU, versions, commit) must agree; the commands are kept."""

import json
import sys
from pathlib import Path

from tileattn import bench

out, parts = Path(sys.argv[1]), [json.loads(Path(p).read_text()) for p in sys.argv[2:]]
same = ("suite", "gpu", "commit", "dirty", "torch", "nvrtc")
for p in parts[1:]:
    for key in same:
        assert p.get(key) == parts[0].get(key), f"{key}: {p.get(key)} != {parts[0].get(key)}"
merged = dict(parts[0], command=" && ".join(p["command"] for p in parts), rows=[r for p in parts for r in p["rows"]])
bench.save(merged, out)
print(bench.result_table(merged))
