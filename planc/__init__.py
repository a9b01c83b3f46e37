"""planc: a declarative load-plan compiler for model checkpoints.

checkpoint manifest + placement spec -> admitted load plan -> explained -> executed (Numba CUDA).
"""

__version__ = "0.1.0"
PLAN_FORMAT = 3  # the plan file format (planc.plan.FORMAT)

from .api import LoadResult, load, load_into  # noqa: E402  (after the constants the stages import)

__all__ = ["load", "load_into", "LoadResult", "LoadedModel", "PLAN_FORMAT", "__version__"]


def __getattr__(name: str):
    if name == "LoadedModel":  # the executor's package, imported only when asked for
        from .execute.model import LoadedModel

        return LoadedModel
    raise AttributeError(f"module 'planc' has no attribute {name!r}")
