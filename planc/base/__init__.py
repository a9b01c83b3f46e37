"""What every stage shares: errors and their codes, units, dtypes, FP4 formats, device names,
settings, the gc pause and the one writer of output files (`outputs`).
"""
