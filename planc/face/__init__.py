"""What users touch: the command line (`cli`, `entry`), the Python API (`api`), the one target
resolver both use (`target`), `planc run`'s head start (`prestart`), the PyTorch hand-off (`torch`)
and the demo (`demo`).
"""
