"""Test-only arms: the real native arm with an injected fault, registered by name.

Loaded into `parity run` with `--plugin tests.harness.fault_arms`; never part of the product.
"""

import os
import signal
import time

from arms.native import NativeArm
from arms.registry import register


class _Faulty(NativeArm):
    fault = "none"

    def __init__(self, spec):
        super().__init__(spec, "decoder")

    def build(self):
        if self.fault == "exit":
            os._exit(1)  # a hard crash: no record, no traceback
        super().build()

    def step(self, micro_batches):
        if self.fault == "raise":
            raise RuntimeError("injected failure in step")
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "oom":  # a real allocation failure: XLA's RESOURCE_EXHAUSTED
            import jax.numpy as jnp

            jnp.zeros((1 << 44,), jnp.float32).block_until_ready()  # 64 TiB
        if self.fault == "sigkill":  # killed from outside, as the OOM killer would
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "kill-zygote":  # the zygote that forked this worker dies
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
                if b"harness.cell.zygote" not in cmdline.read():
                    raise RuntimeError("test-kill-zygote runs only in a worker forked by a "
                                       "zygote (it kills its parent)")
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(60)  # the kernel kills this worker with its parent (PDEATHSIG)
        return super().step(micro_batches)


def _make(fault):
    return type(f"Fault_{fault}", (_Faulty,), {"fault": fault, "trainer": f"test-{fault}"})


for _fault in ("raise", "exit", "hang", "oom", "sigkill", "kill-zygote"):
    register(f"test-{_fault}", _make(_fault))


def _slow_down(arm_class, fraction):
    """Makes every step of `arm_class` take `fraction` longer than its own measured duration.

    The extra time is spent busy (a spin on the host), as real work would be: a sleep lets
    the CPU idle and the next step then runs faster, so a 10% sleep slowed the native step
    on a 2-core VM by only 4-7%."""
    original = arm_class.step

    def step(self, micro_batches):
        import jax

        start = time.perf_counter()
        out = original(self, micro_batches)
        jax.block_until_ready(out)
        deadline = time.perf_counter() + fraction * (time.perf_counter() - start)
        while time.perf_counter() < deadline:
            pass
        return out

    arm_class.step = step


class _Same(NativeArm):
    """The native arm under another name: an A/A partner for in-process pairing (two arms
    of one process need two names)."""

    trainer = "test-same"

    def __init__(self, spec):
        super().__init__(spec, "decoder")


class _Spin(_Same):
    """The native arm with every step spun PARITY_TEST_SPIN (default 0.05) of its own
    duration longer: a planted slowdown of known size for in-process pairing."""

    trainer = "test-spin"


register("test-same", _Same)
register("test-spin", _Spin)
_slow_down(_Spin, float(os.environ.get("PARITY_TEST_SPIN", "0.05")))

# The test-only switch of the nightly test: PARITY_TEST_SLOWDOWN=F slows the native arm's
# every step by F times its own duration.
if os.environ.get("PARITY_TEST_SLOWDOWN"):
    _slow_down(NativeArm, float(os.environ["PARITY_TEST_SLOWDOWN"]))


def _plant_extra_param_pass():
    """Makes the native step do one more param-sized elementwise pass after its update
    (p + 1e-30 * sin(p): the values round back to p, the compiled cost grows)."""
    import jax
    import jax.numpy as jnp

    from arms import native

    original = native.native_step

    def native_step(*args, **options):
        params, rest, opt_state, loss = original(*args, **options)
        params = jax.tree.map(lambda p: p + jnp.asarray(1e-30, p.dtype) * jnp.sin(p), params)
        return params, rest, opt_state, loss

    native.native_step = native_step


# PARITY_TEST_EXTRA_PASS=1 plants that cost change: the compare test's cost regression.
if os.environ.get("PARITY_TEST_EXTRA_PASS"):
    _plant_extra_param_pass()


class _DiesOnProcessOne(NativeArm):
    """Process 1 of a multi-process cell dies mid-step; process 0 must not hang."""

    trainer = "test-die-1"

    def __init__(self, spec):
        super().__init__(spec, "decoder")

    def step(self, micro_batches):
        import jax

        if jax.process_index() == 1:
            os._exit(1)
        return super().step(micro_batches)


register("test-die-1", _DiesOnProcessOne)
