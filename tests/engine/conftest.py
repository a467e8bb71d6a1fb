import tempfile

import jax
import optax
import pytest

from arms.capture import with_capture
from arms.workload import TokenCrossEntropy, make_micro_batches
from engine import EngineConfig, TrainingEngine
from engine.model import build_decoder, get_preset, make_mesh

RAGGED = [64, 16, 40, 8]


def bytes_per_device(tree) -> int:
    """Bytes one device holds of `tree` (the first addressable shard of each array)."""
    return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


def ragged_batches(seed=0, counts=RAGGED, batch_size=2, seq_len=32, **kw):
    return make_micro_batches(seed=seed, batch_size=batch_size, seq_len=seq_len,
                              vocab_size=256, loss_tokens=counts, **kw)


def make_engine(*, ga=1, mesh="fsdp=2", paths=("split", "fused"), loss=None, example=None,
                tx=None, preset="tiny", model_overrides=None, model=None, **config):
    mesh = make_mesh(mesh)
    if model is None:
        model = build_decoder(get_preset(preset, **(model_overrides or {})), mesh=mesh)
    engine = TrainingEngine(model, tx or with_capture(optax.adamw(1e-3)),
                            loss or TokenCrossEntropy(), mesh=mesh,
                            config=EngineConfig(gradient_accumulation_steps=ga, **config))
    engine.compile(example if example is not None else ragged_batches()[0], paths=paths)
    return engine


@pytest.fixture
def engine_factory(devices):
    return make_engine


def traced_executions(engine, step_fn, steps=3) -> list[int]:
    """XLA executions in each of `steps` profiled steps, counted from the xplane trace:
    independent of the engine's own call counter."""
    import jax

    from harness.contract import STEP_ANNOTATION
    from harness.measure import trace

    step_fn()  # warm: anything lazily created on the first step is not counted
    engine.block()
    with tempfile.TemporaryDirectory(prefix="parity-test-trace-") as logdir:
        with trace.capture(logdir) as directory:
            for i in range(steps):
                with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=i):
                    step_fn()
                    engine.block()
        return [s.executions for s in trace.parse_steps(trace.find_xplane(directory))]
