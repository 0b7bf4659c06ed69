"""Let inductor's C++ kernels run without the GIL, so the API thread's Python runs beside them.

Why: inductor calls each C++ loop it generates for CPU (norms, RoPE, attention over the paged
cache, the one-sequence LM head) through a small Python binding,
`torch._inductor.codecache.CppPythonBindingsCodeCache`, whose call (`call_entry_function`, torch
2.13) keeps the GIL for the whole loop: about 5 ms of SmolLM2's 12 ms one-sequence decode step.
ATen's own operators (the int4/int8 kernels, oneDNN) release it. While a loop holds it, the
thread that streams tokens to clients cannot run Python, so every served token paid for the API's
work on top of the step (in-process 12.4 ms a token against 14.4 ms served at c=1).

`release_gil_in_cpp_kernels` changes that call: the arguments are read from the Python tuple with
the GIL held, then the GIL is released around the C++ call and taken back by a destructor (so an
exception cannot leave it released). The kernels touch no Python object. The binding's source is
part of the key of inductor's kernel cache, so loops compiled before the change are not reused;
the lowered graphs in the FX graph cache are (the binding is added when a graph's module loads).
"""

from __future__ import annotations

import logging

from torch._inductor.codecache import CppPythonBindingsCodeCache

logger = logging.getLogger(__name__)

_TORCH_CALL = "kernel({}); Py_RETURN_NONE;"
# `{}` receives the argument parsers (str.format); literal braces are doubled
_GIL_FREE_CALL = (
    "{{ auto structserve_args = std::make_tuple({}); "
    "struct StructserveGil {{ PyThreadState* state; ~StructserveGil() {{ PyEval_RestoreThread(state); }} }} "
    "structserve_gil{{PyEval_SaveThread()}}; "
    "std::apply(kernel, structserve_args); }} Py_RETURN_NONE;"
)


def release_gil_in_cpp_kernels() -> bool:
    """Make inductor's C++ kernel bindings release the GIL while they run (process-wide, for
    kernels loaded from now on); idempotent. True when the binding is (now) GIL-free; False, with
    a warning, when this torch's binding is not the one this was written for (then nothing changes)."""
    current = CppPythonBindingsCodeCache.call_entry_function
    if current == _GIL_FREE_CALL:
        return True
    if current != _TORCH_CALL:
        logger.warning("inductor's C++ kernel binding is not torch 2.13's (%r); its kernels keep the GIL", current)
        return False
    CppPythonBindingsCodeCache.call_entry_function = _GIL_FREE_CALL
    return True
