"""ruff's lint rules (pyproject.toml) and its formatting hold for the whole tree."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args):
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    return subprocess.run([exe, *args, "src", "tests", "scripts"], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check():
    r = _ruff("check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format():
    r = _ruff("format", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
