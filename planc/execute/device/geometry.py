"""Launch geometry: the grid and block each kernel launch gets, per kind of device.

Input: a launch's sizes (elements, rows and columns, scatter segments). Output: (grid, block), each
an int or a tuple. A device holds one of these as `device.grid` (`seam.Gpu`: `GpuGrid` sized to
its multiprocessors; `seam.Simulator`: `SimGrid`), so the dispatchers never ask which device
they run on. Every kernel is a grid-stride loop, so any grid covers any size: the GPU's grids are
sized to the work, capped at `BLOCKS_PER_SM` blocks per multiprocessor; under the simulator every
thread is a Python thread, so launches use one or two small blocks and the loops cover the rest.
"""

from __future__ import annotations

THREADS_1D = 256  # threads per block on a GPU
BLOCK_2D = (32, 8)  # dequantization and transpose blocks on a GPU (x along the contiguous axis)
BLOCKS_PER_SM = 32  # grid cap: this many blocks per multiprocessor
DEFAULT_SMS = 132  # H100 / H200, when the device cannot be asked
TILE = 32  # the transpose kernel's tile edge
SCATTER_THREADS = 256
# Blocks one scatter launch aims for (132 multiprocessors on an H100 / H200, four blocks each).
SCATTER_BLOCKS = 528

SIM_THREADS_1D = 32
SIM_BLOCKS_1D = 2
SIM_BLOCK_DEQUANT = (8, 4)
SIM_GRID_DEQUANT = (2, 1)
SIM_BLOCK_TRANSPOSE = (32, 4)
SIM_GRID_TRANSPOSE = (2, 2)
SIM_SCATTER_THREADS = 32


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class GpuGrid:
    """A GPU's full grids, capped at `BLOCKS_PER_SM` blocks per multiprocessor (`sms`)."""

    def __init__(self, sms: int = DEFAULT_SMS):
        self.max_blocks = max(1, int(sms)) * BLOCKS_PER_SM

    def map(self, n: int) -> tuple[int, int]:
        """(blocks, threads) for a 1-D grid-stride launch over n > 0 elements."""
        return min(cdiv(n, THREADS_1D), self.max_blocks), THREADS_1D

    def grid_2d(self, rows: int, cols: int, per_block: tuple[int, int]) -> tuple[int, int]:
        """(grid x, grid y) covering [rows, cols] with per_block (columns, rows) a block, capped."""
        cap = self.max_blocks
        gx = min(cdiv(cols, per_block[0]), cap)
        gy = min(cdiv(rows, per_block[1]), max(1, cap // gx), 65535)
        return gx, gy

    def dequant(self, rows: int, cols: int):
        """(grid, block) of an FP8 block dequantization of [rows, cols]: four rows a thread."""
        return self.grid_2d(rows, cols, (BLOCK_2D[0], BLOCK_2D[1] * 4)), BLOCK_2D

    def transpose(self, rows: int, cols: int):
        """(grid, block) of a tiled [rows, cols] transpose."""
        return self.grid_2d(rows, cols, (TILE, TILE)), BLOCK_2D

    def tiles(self, rows: int, cols: int, tile_rows: int, tile_cols: int):
        """(grid, block) of a launch over [rows, cols] in tiles of [tile_rows, tile_cols] (the FP4
        transposes: 32 x 64), a block of `BLOCK_2D` threads a tile."""
        return self.grid_2d(rows, cols, (tile_cols, tile_rows)), BLOCK_2D

    def scatter(self, nseg: int, longest: int):
        """((segments, blocks per segment), threads) of one scatter launch: the blocks follow the
        bytes, not the segments. A request of four 4 MiB pieces on four blocks moved a few GB/s
        while the stream's copies waited behind it; split over `SCATTER_BLOCKS` blocks it keeps
        every multiprocessor busy."""
        gx = min(nseg, 65535)
        per = max(1, min(cdiv(SCATTER_BLOCKS, gx), cdiv(longest, SCATTER_THREADS), 65535))
        return (gx, per), SCATTER_THREADS

    def zero(self, n: int) -> tuple[int, int]:
        """(blocks, threads) zero-filling n bytes."""
        return min(1024, cdiv(n, SCATTER_THREADS)), SCATTER_THREADS


class SimGrid:
    """The simulator's small grids: each simulated thread is a Python thread."""

    def map(self, n: int) -> tuple[int, int]:
        return min(SIM_BLOCKS_1D, cdiv(n, SIM_THREADS_1D)), SIM_THREADS_1D

    def dequant(self, rows: int, cols: int):
        return SIM_GRID_DEQUANT, SIM_BLOCK_DEQUANT

    def transpose(self, rows: int, cols: int):
        grid = (min(SIM_GRID_TRANSPOSE[0], cdiv(cols, TILE)), min(SIM_GRID_TRANSPOSE[1], cdiv(rows, TILE)))
        return grid, SIM_BLOCK_TRANSPOSE

    def tiles(self, rows: int, cols: int, tile_rows: int, tile_cols: int):
        grid = (min(SIM_GRID_TRANSPOSE[0], cdiv(cols, tile_cols)), min(SIM_GRID_TRANSPOSE[1], cdiv(rows, tile_rows)))
        return grid, SIM_BLOCK_TRANSPOSE

    def scatter(self, nseg: int, longest: int):
        return (min(2, nseg), min(2, max(1, cdiv(longest, SIM_SCATTER_THREADS)))), SIM_SCATTER_THREADS

    def zero(self, n: int) -> tuple[int, int]:
        return 2, SIM_SCATTER_THREADS
