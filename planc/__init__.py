"""planc: a declarative load-plan compiler for model checkpoints.

checkpoint manifest + placement spec -> admitted load plan -> explained -> executed (Numba CUDA).
"""

__version__ = "0.1.0"
PLAN_FORMAT = 2  # the plan file format (planc.plan.FORMAT)
