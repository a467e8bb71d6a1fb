"""The Tunix datatypes MaxText's engine imports: provided only where Tunix lacks them."""

import sys
import types

import jax.numpy as jnp
import pytest
import tunix.sft.utils

from arms.models import tunix_datatypes


@pytest.mark.maxtext
def test_install_provides_what_pypi_tunix_lacks_and_maxtext_engine_imports():
    tunix_datatypes.install()
    assert tunix_datatypes.missing() == []
    from maxtext.training_engine import abstract_engine
    from tunix.experimental.common.datatypes import RLTrainerPayload, TrainerPayload

    assert abstract_engine.WeightedMetric is tunix.sft.utils.WeightedMetric
    assert issubclass(RLTrainerPayload, TrainerPayload)
    assert tunix_datatypes.install() == []  # idempotent


def test_weighted_metric_is_sum_over_denominator_and_zero_for_an_empty_one():
    wm = tunix_datatypes.WeightedMetric
    assert float(wm(jnp.float32(6.0), jnp.float32(3.0)).compute()) == 2.0
    assert float(wm(jnp.float32(6.0), jnp.float32(0.0)).compute()) == 0.0
    assert float(wm(jnp.float32(6.0), jnp.float32(1.0), eps=2.0).compute()) == 2.0
    assert float(wm(jnp.float32(6.0), jnp.float32(1.0), min_denom=4.0).compute()) == 1.5


def test_a_tunix_that_has_the_datatypes_keeps_its_own(monkeypatch):
    own = types.ModuleType(tunix_datatypes.DATATYPES_MODULE)
    own.TrainerPayload, own.RLTrainerPayload = object, object
    monkeypatch.setitem(sys.modules, tunix_datatypes.DATATYPES_MODULE, own)
    sentinel = type("WeightedMetric", (), {})
    monkeypatch.setattr(tunix.sft.utils, "WeightedMetric", sentinel, raising=False)
    monkeypatch.setattr(tunix.sft.utils, "LossOutput", sentinel, raising=False)
    assert tunix_datatypes.install() == []
    assert tunix.sft.utils.WeightedMetric is sentinel
    assert sys.modules[tunix_datatypes.DATATYPES_MODULE] is own


@pytest.mark.parametrize("name", ["TrainerPayload", "RLTrainerPayload"])
def test_payloads_are_frozen_kw_only(name):
    cls = getattr(tunix_datatypes, name)
    with pytest.raises(TypeError):
        cls(jnp.zeros(1))  # positional
