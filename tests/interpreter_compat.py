"""Can Triton's interpreter (TRITON_INTERPRET=1, the CPU test path) run our kernels here?

Triton 3.6's interpreter turns a kernel's runtime int argument used as a loop bound into
a Python int with int() of a 1-element NumPy array, which NumPy 2.4 refuses ("only
0-dimensional arrays can be converted to Python scalars"): every kernel with such a loop
fails. Triton 3.6.0 + numpy 2.4.6 fails the interpreter tests; triton 3.6.0 + numpy
2.3.5 and triton 3.7.0 / 3.9.0 + numpy 2.4.6 pass. torch 2.11 pins triton 3.6, so a GPU
machine may have that pair.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from packaging.version import Version


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def interpreter_problem(triton: str | None = None, numpy: str | None = None) -> str | None:
    """Why the Triton interpreter cannot run this suite's kernels with these versions
    (default: the installed ones), or None when it can."""
    triton = triton or _installed("triton")
    numpy = numpy or _installed("numpy")
    if triton is None or numpy is None:
        return None
    if Version(triton).release[:2] < (3, 7) and Version(numpy).release[:2] >= (2, 4):
        return (f"Triton {triton}'s interpreter cannot run kernels with runtime loop bounds "
                f"under NumPy {numpy} (int() of a 1-element array); install numpy<2.4 or "
                "triton>=3.7 to run the kernel tests on CPU")
    return None
