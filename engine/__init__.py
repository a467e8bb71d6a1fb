"""The optimized training engine and its MaxText-style model. Imports jax/flax/optax/orbax only."""
