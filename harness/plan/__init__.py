"""`parity plan`: XLA's own plan of every arm for a TPU topology, on a machine without one.

`target` loads libtpu and gives the topology's compile-only devices; each arm compiles its
step for them from shapes alone (`arms.abstract`); `hlo` counts what one call of each
compiled program moves and computes; `cell` turns that into a record's `plan` section.
A plan is the compiler's static buffer assignment and cost model for the target: an upper
bound on peak HBM, never a measurement.
"""
