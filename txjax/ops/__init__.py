"""The operations wing: what a run costs and leaves behind (flops, memory, logs, storage, locks, signals, origin)."""
