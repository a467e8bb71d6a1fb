"""What maxtext 0.2.5 needs of the oldest supported stack (Python 3.11, jax 0.10.2), given.

maxtext 0.2.5 declares Python >= 3.12 and jax >= 0.11.2, yet the code the MaxText arms run
(its Qwen3, its config system and its training engine) uses neither: two things it imports
on the way do. Each shim below names the upstream line it works around, applies only where
that line would fail, and changes nothing MaxText's model or engine compute:

- `from jax.experimental.xla_metadata import must_fuse_call`
  (maxtext/kernels/attention/jax_flash_attention.py:21), imported whenever MaxText's
  attention module is, and called only by `attention=jax_flash` (the arms run
  `dot_product`). jax 0.10.2 has no `must_fuse_call`: `missing_must_fuse_call` gives the
  module a stand-in that refuses to be called, so a config that would need it fails with
  that reason instead of computing something else.
- `type Implementation = Literal[...]` (maxtext/kernels/mhc/api.py:21) and
  `type KernelContext = tuple[...]` (maxtext/kernels/mhc/common.py:58): PEP 695 alias
  statements, a SyntaxError before Python 3.12, in modules imported whenever MaxText's
  decoder is. On Python 3.11 `Pep695Aliases` loads exactly those two modules from their
  installed source with each statement read as the plain assignment `Name = ...`: the same
  name, bound to the value the alias stands for (an annotation; nothing calls it).

`install()` applies what this interpreter and JAX need; `arms.models.maxtext_qwen3` calls it
before importing MaxText.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys

PEP695_LINES = {
    "maxtext.kernels.mhc.api": "type Implementation = ",
    "maxtext.kernels.mhc.common": "type KernelContext = ",
}
"""Module -> the start of its one PEP 695 alias statement (maxtext 0.2.5: api.py:21,
common.py:58)."""

MUST_FUSE_CALL = "must_fuse_call"
"""The jax.experimental.xla_metadata function maxtext 0.2.5's jax_flash attention imports."""


def missing_must_fuse_call() -> bool:
    """Whether this JAX lacks `jax.experimental.xla_metadata.must_fuse_call` (jax < 0.11)."""
    from jax.experimental import xla_metadata

    return not hasattr(xla_metadata, MUST_FUSE_CALL)


def _refuse_must_fuse_call(*args, **kwargs):
    import jax

    raise NotImplementedError(
        f"maxtext's attention=jax_flash needs jax.experimental.xla_metadata.must_fuse_call, "
        f"which jax {jax.__version__} lacks (jax >= 0.11.2 has it); the MaxText arms run "
        "attention=dot_product")


class _AliasLoader(importlib.machinery.SourceFileLoader):
    """Loads one module from its source with its PEP 695 alias statement read as an
    assignment (`type Name = value` -> `Name = value`)."""

    def __init__(self, fullname: str, path: str, statement: str):
        super().__init__(fullname, path)
        self.statement = statement

    def source_to_code(self, data, path, *, _optimize=-1):
        source = importlib.util.decode_source(data)
        pattern = re.compile(rf"^{re.escape(self.statement)}", re.MULTILINE)
        rewritten, count = pattern.subn(self.statement.removeprefix("type "), source)
        if count != 1:
            raise ImportError(f"{path}: expected one line starting {self.statement!r} (maxtext "
                              f"0.2.5), found {count}; the shim in {__name__} is for that "
                              "version")
        return compile(rewritten, path, "exec", dont_inherit=True, optimize=_optimize)

    def get_code(self, fullname):
        # Never the bytecode cache: a .pyc Python 3.11 wrote from the unmodified source
        # cannot exist (it does not compile), and one written from the rewritten source must
        # not be read by another interpreter as the original.
        return self.source_to_code(self.get_data(self.get_filename(fullname)),
                                   self.get_filename(fullname))


class Pep695Aliases(importlib.abc.MetaPathFinder):
    """Finds the modules of PEP695_LINES and loads them through `_AliasLoader`."""

    def find_spec(self, fullname, path=None, target=None):
        statement = PEP695_LINES.get(fullname)
        if statement is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=_AliasLoader(fullname, spec.origin, statement),
            submodule_search_locations=spec.submodule_search_locations)


def needs_pep695_aliases() -> bool:
    """Whether this Python cannot compile a PEP 695 alias statement (before 3.12)."""
    return sys.version_info < (3, 12)


def install() -> None:
    """Applies the shims this interpreter and JAX need (idempotent)."""
    if needs_pep695_aliases() and not any(isinstance(f, Pep695Aliases) for f in sys.meta_path):
        sys.meta_path.insert(0, Pep695Aliases())
    if missing_must_fuse_call():
        from jax.experimental import xla_metadata

        setattr(xla_metadata, MUST_FUSE_CALL, _refuse_must_fuse_call)
