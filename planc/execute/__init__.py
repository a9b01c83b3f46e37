"""execute: Plan -> `LoadedModel` on the GPU (Numba CUDA), with the measured report.

The executor is four rooms, each importing only those below it:

* `pipeline/` the load's parts and their order: `execute` (`pipeline/run.py`) checks, admits,
  builds the parts (`parts.Parts`) and runs the `loader.Pipeline`; the loaded model, reload,
  `--verify`, the events and the report;
* `io/` the bytes from the files: the reader, the pinned ring, the digest reader and its
  read-and-hash loop;
* `device/` the device seam (`seam.Device`: `Gpu` over the driver, `Simulator`), kernel launch
  from shipped machine code, launch geometry, host memory;
* `kernels/` what a kernel does: the format classes, the dispatchers that name each launch on the
  device they are given, the kernels' source, their host references and the shipped PTX.

This package is the only one that imports numba (under the simulator, or for a launch that no
shipped code serves).
"""

from .pipeline.run import execute

__all__ = ["execute"]
