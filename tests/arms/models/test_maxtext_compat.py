"""arms.models.maxtext_compat: each shim lets the one upstream line it names import on the
oldest supported stack (Python 3.11, jax 0.10.2: `make test-py311`), and changes nothing
else. On the lock's stack (Python 3.12, jax 0.11.2) no shim applies and the same modules
import as shipped."""

import sys
import typing

import pytest

from arms.models import maxtext_compat
from arms.models.maxtext_qwen3 import require_maxtext

pytestmark = pytest.mark.maxtext  # imports the real MaxText


def test_the_pep695_alias_modules_import_here_with_their_names_bound():
    """maxtext/kernels/mhc/api.py:21 and common.py:58 are `type X = ...` statements: a
    SyntaxError before Python 3.12 without the shim (this fails on the 3.11 job when it is
    removed). With it, each name is bound to the value the alias stands for."""
    require_maxtext()
    from maxtext.kernels.mhc import api, common

    implementation, context = api.Implementation, common.KernelContext
    if maxtext_compat.needs_pep695_aliases():
        assert implementation == typing.Literal["mosaic", "mosaic_tpu", "xla"]
        assert typing.get_origin(context) is tuple and len(typing.get_args(context)) == 3
        assert isinstance(sys.modules["maxtext.kernels.mhc.api"].__loader__,
                          maxtext_compat._AliasLoader)
    else:  # Python 3.12+: the statements as shipped, a TypeAliasType each
        assert implementation.__value__ == typing.Literal["mosaic", "mosaic_tpu", "xla"]
        assert not isinstance(sys.modules["maxtext.kernels.mhc.api"].__loader__,
                              maxtext_compat._AliasLoader)


def test_jax_flash_attention_imports_and_refuses_to_run_where_jax_lacks_must_fuse_call():
    """maxtext/kernels/attention/jax_flash_attention.py:21 imports `must_fuse_call`, which
    jax 0.10.2 lacks: without the shim MaxText's attention module does not import there
    (this fails on the 3.11 job when the shim is removed). The stand-in never computes: a
    config that calls it (attention=jax_flash) fails with the reason."""
    from jax.experimental import xla_metadata

    require_maxtext()
    from maxtext.kernels.attention import jax_flash_attention

    stand_in = xla_metadata.must_fuse_call is maxtext_compat._refuse_must_fuse_call
    assert jax_flash_attention.must_fuse_call is xla_metadata.must_fuse_call
    if stand_in:
        with pytest.raises(NotImplementedError, match="attention=jax_flash needs"):
            jax_flash_attention.must_fuse_call("qk")
    else:  # this JAX has its own: the shim left it alone
        assert not maxtext_compat.missing_must_fuse_call()


def test_the_alias_loader_rewrites_exactly_the_named_statement(tmp_path):
    """Loaded through `_AliasLoader`, a module's one `type Name = value` line becomes
    `Name = value` (on any Python); a module without that line is refused, naming the
    shim, rather than loaded unchanged."""
    import importlib.util

    def load(name, source, statement):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        loader = maxtext_compat._AliasLoader(name, str(path), statement)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module

    module = load("aliased", "import typing\ntype Pair = tuple[int, int]\nx = 1\n",
                  "type Pair = ")
    assert module.Pair == tuple[int, int] and module.x == 1
    with pytest.raises(ImportError, match="expected one line starting 'type Pair = '"):
        load("changed", "Pair = tuple[int, int]\n", "type Pair = ")
