"""Reading and writing a nested dict of parameters by a path of keys (the weight converters'
one primitive: our decoder's path -> the other model's path)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def get_path(tree: dict, path: Sequence[Any]) -> Any:
    """tree[path[0]][path[1]]..."""
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict, path: Sequence[Any], value: Any) -> None:
    """tree[path[0]]...[path[-1]] = value, creating the dicts on the way."""
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def array_module(value):
    """numpy for a host array, else jax.numpy: a layout conversion (stacking layers,
    moving an axis) of host arrays stays on the host, and never allocates device memory."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return np
    import jax.numpy as jnp

    return jnp
