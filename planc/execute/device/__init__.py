"""The device seam (`seam.Device`: `Gpu` over the CUDA driver, `Simulator`), the driver and C
library bindings (`driver`, `libc`), kernel launch from the shipped machine code (`launch`),
launch geometry (`geometry`) and host memory (`memory`: the live room, RSS). Below it: `kernels`."""
