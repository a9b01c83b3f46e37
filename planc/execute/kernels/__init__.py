"""What a kernel does: the format classes (`formats`), the dispatchers that check sizes and name
each launch on the device they are given (`dispatch`, `gguf_dispatch`, `fp4_dispatch`), the
kernels' numba source (`kernels`, `scatter`, `gguf_kernels`, `fp4_kernels`), their host references
(`refconv`, `fp4ref`, `gguf_dequant`) and the shipped PTX (`signatures`, `ptxindex`, `ptxbuild`,
`ptx/`). Imports nothing else of the executor: a device is handed in."""
