"""`gc_paused`: the cyclic collector off while a stage builds millions of small acyclic objects.

Compiling, encoding and decoding a plan allocate millions of tuples and make no reference cycles:
the collector would walk them over and over and free nothing (40% of the time at 90k tensors).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            # Hand what survives (the plan) to the oldest generation as it is: re-enabled with a
            # million young objects, the collector would first walk them all once more (~0.15 s).
            gc.freeze()
            gc.unfreeze()
            gc.enable()
