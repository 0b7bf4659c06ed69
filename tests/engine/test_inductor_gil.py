"""engine/inductor_gil.py: inductor's C++ kernels run without the GIL once the binding is changed,
so another Python thread makes progress during them; the results are the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.server_process import ROOT

pytestmark = pytest.mark.slow

PROBE = """
import json, sys, threading, time
import torch
from engine.inductor_gil import release_gil_in_cpp_kernels
released = release_gil_in_cpp_kernels() if sys.argv[1] == "release" else False
torch.set_num_threads(1)
x = torch.randn(6000, 6000)
f = torch.compile(lambda x: ((x.sin() * x.cos() + x.tanh()).exp()).sum(-1), dynamic=False)
out = f(x)                              # compiles: one C++ loop of a few hundred ms
counts = [0]
running = threading.Event()
done = threading.Event()
def spin():
    running.set()
    while not done.is_set():
        counts[0] += 1
thread = threading.Thread(target=spin)
thread.start()
running.wait()
time.sleep(0.05)
before = counts[0]
for _ in range(2):
    f(x)
during = counts[0] - before
done.set()
thread.join()
expected = ((x.sin() * x.cos() + x.tanh()).exp()).sum(-1)
print(json.dumps({"released": released, "spins": during,
                  "close": bool(torch.allclose(out, expected, rtol=1e-4))}))
"""


def probe(mode: str, cache_dir: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_compiled_cpu_kernel_lets_other_threads_run(tmp_path) -> None:
    """Two calls of one compiled C++ loop (a few hundred ms each) while a thread spins in Python:
    with torch's binding the spinner runs only around the calls (the loop holds the GIL, and
    Python hands it over every 5 ms switch interval at most); with the binding changed it runs
    all along (on a second core, or when the OS switches), at least 5 times more."""
    kept = probe("keep", str(tmp_path / "kept"))
    released = probe("release", str(tmp_path / "released"))
    assert released["released"] and not kept["released"]
    assert kept["close"] and released["close"]
    assert released["spins"] > 5 * max(kept["spins"], 1), (kept, released)
