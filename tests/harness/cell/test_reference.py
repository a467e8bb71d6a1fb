"""harness.cell.reference: the exact reference of a cell, and, for work whose arithmetic is
not exact float32 (bfloat16 anywhere; float32 on an accelerator), the floor its tolerance is
sized by."""

import dataclasses

import jax
import pytest

from arms.spec import CellSpec
from arms.workload import exact_by_micro_batch, rel_l2
from engine.model import build_decoder, make_mesh
from harness.cell.reference import checked_parity, exact_arithmetic, parity_section
from reports.parity import FAIL, GRAD_TOLERANCE, PASS, parity_verdict
from reports.record import Record

SPEC = CellSpec(preset="tiny", seq=16, batch=4, ga=2, ragged=(20, 4))


def _exact(spec, batches, precision="default"):
    """The exact gradient of `spec` on `batches` at matmul `precision`, made here from the
    public parts."""
    with jax.default_matmul_precision(precision):
        model = build_decoder(spec.model_config(), seed=spec.seed,
                              mesh=make_mesh("", devices=jax.local_devices()[:1]))
        return exact_by_micro_batch(model, batches, spec.loss_fn())[1]


def test_a_bfloat16_cell_records_its_floor_and_is_judged_by_it(monkeypatch):
    monkeypatch.delenv("PARITY_REFERENCE_DIR", raising=False)
    bf16 = dataclasses.replace(SPEC, dtype="bfloat16")
    batches = bf16.micro_batches(0)
    exact16, exact32 = _exact(bf16, batches), _exact(SPEC, batches, "highest")
    # the bfloat16 reference itself, captured: exact; the floor is its distance from float32
    section = parity_section(bf16, exact16, first_loss=1.0, trainer_denominator=7.0)
    assert section.trainer_denominator == 7.0  # carried as the arm reported it
    assert section.rel_l2 == 0.0
    assert section.floor_rel_l2 == pytest.approx(rel_l2(exact16, exact32), rel=1e-12)
    assert 1e-4 < section.floor_rel_l2 < 1e-1  # bfloat16's rounding, not a different sum
    # judged by the floor: within it PASS, beyond it FAIL
    record = Record(arm="native", spec=bf16, parity=section)
    inside = dataclasses.replace(section, rel_l2=section.floor_rel_l2 / 3)
    beyond = dataclasses.replace(section, rel_l2=section.floor_rel_l2 * 1.5)
    assert parity_verdict(dataclasses.replace(record, parity=inside)).status == PASS
    assert parity_verdict(dataclasses.replace(record, parity=beyond)).status == FAIL
    assert parity_verdict(dataclasses.replace(record, parity=inside)).tolerance == (
        section.floor_rel_l2 > GRAD_TOLERANCE and section.floor_rel_l2)
    # a float32 cell has no floor: GRAD_TOLERANCE holds it
    plain = parity_section(SPEC, exact32, first_loss=1.0, trainer_denominator=None)
    assert plain.floor_rel_l2 is None and plain.rel_l2 == 0.0
    assert plain.float32_rel_l2 is None  # its rel_l2 is the distance from exact float32


def test_a_rounding_cell_says_its_own_distance_from_exact_float32(monkeypatch, tmp_path):
    """Two bfloat16 gradients equally far from the bfloat16 reference need not be equally
    far from the true one: each arm's distance from exact float32 is said beside. The
    reference itself is the floor away (by definition); exact float32 is 0 away; and a
    later cell reading the stored reference gets the same figures."""
    monkeypatch.setenv("PARITY_REFERENCE_DIR", str(tmp_path))
    bf16 = dataclasses.replace(SPEC, dtype="bfloat16")
    batches = bf16.micro_batches(0)
    exact16, exact32 = _exact(bf16, batches), _exact(SPEC, batches, "highest")
    computed = parity_section(bf16, exact16, first_loss=1.0, trainer_denominator=None)
    assert not computed.reference_shared
    assert computed.float32_rel_l2 == pytest.approx(computed.floor_rel_l2, rel=1e-6)
    nearer = parity_section(bf16, exact32, first_loss=1.0, trainer_denominator=None)
    assert nearer.reference_shared and nearer.float32_rel_l2 == pytest.approx(0.0, abs=1e-7)
    # its rel_l2 stays the distance from the bfloat16 reference (read back from the store)
    assert nearer.rel_l2 == pytest.approx(rel_l2(exact32, exact16), rel=1e-6)


def test_only_float32_work_on_the_cpu_is_exact_float32_arithmetic():
    """The rule that decides whether a cell gets a floor: an accelerator's default matmul
    rounds float32 inputs (TPU: one bfloat16 pass), so float32 work there is held to its
    floor as bfloat16 work is everywhere."""
    assert exact_arithmetic("float32", "cpu")
    assert not exact_arithmetic("float32", "tpu") and not exact_arithmetic("float32", "gpu")
    assert not exact_arithmetic("bfloat16", "cpu")


def test_a_check_that_raises_gives_no_verdict_and_says_why(monkeypatch):
    """checked_parity never raises for the check: an allocation XLA refuses is `oom`, any
    other error `exception`, each with its message."""
    from harness.cell import reference

    def refused(*args):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")

    monkeypatch.delenv("PARITY_REFERENCE_DIR", raising=False)
    monkeypatch.setattr(reference, "_compute_reference", refused)
    parity, why = checked_parity(SPEC, {}, 1.0, None)
    assert parity is None and why.startswith("oom: RuntimeError: RESOURCE_EXHAUSTED")
    monkeypatch.setattr(reference, "_compute_reference", lambda *args: 1 / 0)
    parity, why = checked_parity(SPEC, {}, 1.0, None)
    assert parity is None and why == "exception: ZeroDivisionError: division by zero"


def test_ragged_work_says_what_a_mean_of_micro_batch_means_is_predicted_to_be_off_by(
        monkeypatch):
    """Beside the exact gradient, the reference of ragged work holds the mean of
    micro-batch mean gradients (what PeftTrainer's optax.MultiSteps computes), made here from
    each micro-batch's own exact gradient: a gradient that is that mean reads as it, at its
    predicted distance from sum/sum, and a PeftTrainer arm's FAIL says so."""
    from flax import nnx

    from arms.workload import exact_loss_and_gradient

    monkeypatch.delenv("PARITY_REFERENCE_DIR", raising=False)
    batches = SPEC.micro_batches(0)
    model = build_decoder(SPEC.model_config(), seed=SPEC.seed,
                          mesh=make_mesh("", devices=jax.local_devices()[:1]))
    each = [nnx.to_pure_dict(exact_loss_and_gradient(model, [b], SPEC.loss_fn())[1])
            for b in batches]
    mean = jax.tree.map(lambda *g: sum(g) / len(g), *each)
    exact = _exact(SPEC, batches)
    section = parity_section(SPEC, mean, first_loss=1.0, trainer_denominator=2.0)
    assert section.mean_of_means_rel_l2 <= 1e-6  # float32 sums in another order
    assert section.predicted_rel_l2 == pytest.approx(rel_l2(mean, exact), rel=1e-4)
    assert section.rel_l2 == pytest.approx(section.predicted_rel_l2, rel=1e-4)
    assert section.predicted_rel_l2 > 1e-2
    verdict = parity_verdict(Record(arm="peft-decoder", spec=SPEC, parity=section))
    assert verdict.status == FAIL
    assert verdict.cause == (f"mean of micro-batch means (optax.MultiSteps), at its predicted "
                             f"rel_l2 {section.predicted_rel_l2:.2e} (the mean of means to "
                             f"{section.mean_of_means_rel_l2:.1e}: PASS)")
    even = dataclasses.replace(SPEC, ragged=None)  # equal denominators: nothing to predict
    plain = parity_section(even, _exact(even, even.micro_batches(0)), 1.0, None)
    assert plain.predicted_rel_l2 is None and plain.mean_of_means_rel_l2 is None


def test_the_float32_reference_of_a_bfloat16_cell_reuses_its_weights(monkeypatch):
    """The floor's float32 reference holds the bfloat16 reference's own arrays: one
    initializer compiled for both (its compile took 30 s on the TPU v5e host), and the
    floor is the distance of the two references of the very same weights."""
    from engine.model.decoder import initializer
    from harness.cell.phases import CompileCounter
    from harness.cell.reference import exact_reference

    monkeypatch.delenv("PARITY_REFERENCE_DIR", raising=False)
    bf16 = dataclasses.replace(SPEC, dtype="bfloat16", seed=7)  # weights no test built yet
    initializer.cache_clear()
    jax.clear_caches()
    compiles = CompileCounter()
    entry, stored = exact_reference(bf16, bf16.micro_batches(0))
    programs = [e["program"] for e in compiles.log]
    assert not stored and programs.count("jit(init)") == 1, programs
    assert programs.count("jit(summed)") == 2  # the default and the highest precision
    assert 1e-4 < entry.floor_rel_l2 < 1e-1


def test_a_check_reads_the_gradient_once_however_many_references(monkeypatch, tmp_path):
    """Ragged bfloat16 work has three references (sum/sum, the mean of means, exact
    float32): the check makes each chunk of the arm's gradient float64 once, not once a
    reference (0.6 B parameters on the TPU v5e host), and its figures are each pair's."""
    import numpy as np

    import arms.workload.reference as reference

    monkeypatch.setenv("PARITY_REFERENCE_DIR", str(tmp_path))
    bf16 = dataclasses.replace(SPEC, dtype="bfloat16")
    batches = bf16.micro_batches(0)
    gradient = jax.device_get(_exact(bf16, batches, "highest"))  # on the host, as an arm's
    parity_section(bf16, gradient, first_loss=1.0, trainer_denominator=None)  # computes
    made = []
    real = reference._chunk
    monkeypatch.setattr(reference, "_chunk",
                        lambda leaf, start: made.append((id(leaf), start)) or real(leaf, start))
    section = parity_section(bf16, gradient, first_loss=1.0, trainer_denominator=None)
    assert section.reference_shared
    leaves = [np.asarray(x) for x in jax.tree.leaves(gradient)]
    of_gradient = [key for key in made if key[0] in {id(x) for x in leaves}]
    assert len(of_gradient) == len(set(of_gradient)) == sum(
        -(-x.size // reference.CHUNK) for x in leaves)
    stored = reference_store_entry(tmp_path)
    assert section.mean_of_means_rel_l2 == rel_l2(gradient, stored.mean_of_means)
    assert section.float32_rel_l2 == rel_l2(gradient, stored.exact32)
    assert section.rel_l2 == rel_l2(gradient, stored.gradient)


def reference_store_entry(root):
    """The one entry of the reference store at `root`."""
    from harness.cell.reference_store import ReferenceStore

    store = ReferenceStore(root)
    (entry,) = store.entries()
    return store.read(entry[2].name)
