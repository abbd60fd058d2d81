"""Triton JIT compilations while a block runs. A kernel compiles the first time it meets
new constexprs or a new specialisation of its integer arguments (1, multiples of 16):
tenths of a second on the host, inside whatever step met it. Benches report the ones that
happen inside timed runs (`bench sweep`), where they are one-off costs of a new shape.

    with triton_compiles() as names:   # names: kernel names, in compile order
        ...

Without Triton (or a Triton without `knobs`) the list stays empty and `available` is False.
"""

from __future__ import annotations

import contextlib


class CompileLog(list):
    available = False


@contextlib.contextmanager
def triton_compiles():
    log = CompileLog()
    try:
        import triton.knobs as knobs
        runtime = knobs.runtime
        prev = runtime.jit_post_compile_hook
    except (ImportError, AttributeError):
        yield log
        return

    def hook(**kw):
        fn = kw.get("fn")
        log.append(getattr(fn, "name", "?"))
        return prev(**kw) if prev is not None else None

    log.available = True
    runtime.jit_post_compile_hook = hook
    try:
        yield log
    finally:
        runtime.jit_post_compile_hook = prev
