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
import json, threading, time
import torch
from engine.inductor_gil import release_gil_in_cpp_kernels
torch.set_num_threads(1)
x = torch.randn(6000, 6000)

def spins_during(f):
    counts, running, done = [0], threading.Event(), threading.Event()
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
    return during

def compiled(offset):
    # a kernel of its own per offset: one C++ loop of a few hundred ms, bound when it compiles
    f = torch.compile(lambda x: ((x.sin() * x.cos() + x.tanh() + offset).exp()).sum(-1), dynamic=False)
    out = f(x)
    expected = ((x.sin() * x.cos() + x.tanh() + offset).exp()).sum(-1)
    return f, bool(torch.allclose(out, expected, rtol=1e-4))

kept, kept_close = compiled(0.0)                 # torch's own binding
released = release_gil_in_cpp_kernels()
freed, freed_close = compiled(0.5)               # compiled after the binding changed
print(json.dumps({"released": released, "kept": {"spins": spins_during(kept), "close": kept_close},
                  "freed": {"spins": spins_during(freed), "close": freed_close}}))
"""


def probe(cache_dir: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_compiled_cpu_kernel_lets_other_threads_run(tmp_path) -> None:
    """Two calls of a compiled C++ loop (a few hundred ms each) while a thread spins in Python, in
    one fresh process (a cache folder of its own, so both kernels are bound there): with torch's
    binding the spinner runs only around the calls (the loop holds the GIL, and Python hands it
    over every 5 ms switch interval at most); for a kernel compiled after the binding changed it
    runs all along (on a second core, or when the OS switches), at least 5 times more."""
    got = probe(str(tmp_path / "inductor"))
    assert got["released"]
    assert got["kept"]["close"] and got["freed"]["close"]
    assert got["freed"]["spins"] > 5 * max(got["kept"]["spins"], 1), got
