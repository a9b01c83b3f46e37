"""The load: `execute` (`run`) builds the parts (`parts.Parts`: `allocation.Regions`, the warmer and
`KernelRuns` of `kernelruns`, the reader, `hostpath.HostPath`, the live room) in order and runs the
`loader.Pipeline`; `model` (the `LoadedModel`), `reload`, `verify`, `events`, `records` (the
report) and `report` (its text). Above `io`, `device` and `kernels`."""
