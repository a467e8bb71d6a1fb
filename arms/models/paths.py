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
