"""What runs inside a cell's process: the worker, its phases, the exact reference, the
paired and gated timing of several arms, the zygote that forks workers, and the plan of a
cell for a TPU target. The parent reaches it only through harness.contract."""
