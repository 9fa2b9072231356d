"""The README's demo runs end to end on the bundled sample and leaks no plaintext."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_and_leaks_nothing(tmp_path):
    env = {**os.environ, "ENGRAM_PASSPHRASE": "demo-passphrase"}
    out = subprocess.run([sys.executable, str(ROOT / "tools/examples/demo.py"), str(tmp_path / "demo.engram")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "verify: ok" in out.stdout and "plaintext found in the raw file: none" in out.stdout
    again = subprocess.run([sys.executable, str(ROOT / "tools/examples/demo.py"), str(tmp_path / "demo.engram")],
                           env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "added" not in again.stdout  # reopening does not duplicate
