"""planc: a declarative load-plan compiler for model checkpoints.

checkpoint manifest + placement spec -> admitted load plan -> explained -> executed (Numba CUDA).
"""

__version__ = "0.1.0"
PLAN_FORMAT = 8  # the plan file format (planc.plan.codec.FORMAT)


__all__ = ["load", "load_into", "warm_up", "release_ring", "LoadResult", "LoadedModel", "PLAN_FORMAT", "__version__"]


def __getattr__(name: str):
    # Imported at their first use: the `planc` command imports this package first, and a Ctrl-C in
    # its first milliseconds must reach the command's own handler, not interrupt a long import here.
    if name in ("load", "load_into", "warm_up", "release_ring", "LoadResult"):
        from .face import api

        return getattr(api, name)
    if name == "LoadedModel":  # the executor's package, imported only when asked for
        from .execute.pipeline.model import LoadedModel

        return LoadedModel
    raise AttributeError(f"module 'planc' has no attribute {name!r}")
