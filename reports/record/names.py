"""Names of cells: as people say them, and as components of a file path.

A cell is an arm given one spec of work. `cell_name` is how tables and messages name it;
`path_safe` turns any name (an arm such as 'engine:maxtext', a run id, a cell) into one
component of a file path, so files written per cell or per run land where they are meant to.
"""

from __future__ import annotations

import re
import typing

if typing.TYPE_CHECKING:
    from reports.record.schema import Spec

__all__ = ["cell_name", "decoder_options", "path_safe"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def cell_name(arm: str | None, spec: Spec | None) -> str:
    """'engine tiny seq=32 batch=8 ga=4 [mesh=fsdp=8] [attention=splash/512x1024]
    [logits_chunk=256]': a cell as people name it (our decoder's options where not the
    default, so cells that differ only by them read apart)."""
    if spec is None:
        return f"{arm} (no spec)"
    options = decoder_options(spec)
    return (f"{arm} {spec.preset} seq={spec.seq} batch={spec.batch} ga={spec.ga}"
            f"{' mesh=' + spec.mesh if spec.mesh else ''}{' ' + options if options else ''}")


def decoder_options(spec: Spec) -> str:
    """'attention=splash/512x1024 logits_chunk=256': our decoder's options where not the
    default ('' where every one is)."""
    attention = "" if spec.attention == "xla" else f"attention={spec.attention}" + (
        f"/{spec.attention_block_q}x{spec.attention_block_kv}"
        if spec.attention_block_q and spec.attention_block_kv else "")
    chunk = f"logits_chunk={spec.logits_chunk}" if spec.logits_chunk else ""
    scan = "" if spec.scan_backward == "jax" else f"scan_backward={spec.scan_backward}"
    return " ".join(part for part in (attention, chunk, scan) if part)


def path_safe(name: str) -> str:
    """`name` as one path component: each character that is not a letter, digit, '.', '_'
    or '-' (e.g. the ':' of an 'engine:maxtext' arm, a '/' in a run id) becomes one '_'."""
    return _UNSAFE.sub("_", name)
