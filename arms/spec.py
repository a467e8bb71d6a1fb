"""CellSpec: what every arm of one comparison shares (model, shapes, loss, optimizer, data)."""

from __future__ import annotations

import dataclasses
import functools

import optax

from arms.workload import (
    LossFn,
    MicroBatch,
    check_decoder_options,
    get_loss,
    make_micro_batches,
)
from arms.workload.optimizers import OPTIMIZERS, optimizer_tx
from engine.model import DecoderConfig, check_fits, get_preset, make_mesh
from engine.model.sharding import parse_mesh_spec

MAX_SEQ_LEN = 40_960
"""Qwen3's context length (max_position_embeddings of every Qwen3 config): RoPE is defined
beyond it, but no Qwen3 was trained there, and a longer sequence on a small host only runs
into the cell's timeout."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellSpec:
    """One benchmark cell, minus the arm: every arm built from it sees the same work."""

    preset: str = "tiny"
    """Model preset (engine.model.PRESETS)."""
    seq: int = 32
    """Sequence length of every micro-batch."""
    batch: int = 8
    """Global batch size per optimizer step (rows); split into `ga` micro-batches."""
    ga: int = 1
    """Gradient-accumulation steps (micro-batches per optimizer step)."""
    dtype: str = "float32"
    """Compute dtype ("float32" or "bfloat16"); parameters stay float32."""
    mesh: str = ""
    """Mesh spec such as "fsdp=8" or "fsdp=4,tensor=2"; empty = 1 device."""
    loss: str = "xent"
    """Workload loss (arms.workload.LOSSES): "xent", "grpo" (a clipped surrogate written
    here, on packed sequences) or "tunix-grpo" (Tunix's own `grpo_loss_fn`, on rollouts)."""
    z_loss: float = 0.0
    """z-loss weight for the xent loss."""
    loss_agg_mode: str = "token-mean"
    """tunix-grpo: Tunix's loss aggregation mode."""
    beta: float = 0.0
    """tunix-grpo: KL penalty weight (> 0: reference log-probs from the initial weights)."""
    epsilon: float = 0.2
    """tunix-grpo: lower clip of the importance ratio."""
    epsilon_high: float | None = None
    """tunix-grpo: upper clip of the importance ratio (None: epsilon)."""
    epsilon_c: float | None = None
    """tunix-grpo: dual-clip bound (None: no dual clip)."""
    optimizer: str = "adamw"
    """Optax optimizer ("adamw" or "sgd": arms.workload.optimizers)."""
    learning_rate: float = 1e-3
    """Optimizer learning rate."""
    clip: float | None = None
    """Global-norm gradient clip, or None."""
    ragged: tuple[int, ...] | None = None
    """Loss tokens per micro-batch (e.g. (64, 16, 40, 8)); None = mask_fraction of tokens."""
    mask_fraction: float = 1.0
    """Fraction of tokens carrying loss when `ragged` is None."""
    seed: int = 0
    """Seed of the weights and of the data."""
    scan_layers: bool = False
    """Decoder option scan_layers."""
    remat: str = "none"
    """Decoder option remat."""
    attention: str = "xla"
    """Decoder option attention: "xla", "splash" (JAX's Pallas kernel) or "auto" (splash on a
    TPU from seq 2048 up, xla elsewhere); other models run their own attention."""
    attention_block_q: int = 512
    """Decoder option attention_block_q: query rows per block of the attention kernel."""
    attention_block_kv: int = 1024
    """Decoder option attention_block_kv: keys per block of the attention kernel."""
    logits_chunk: int = 0
    """Decoder option logits_chunk: positions per chunk of the head and the loss's per-token
    statistics (no [B, L, V] float32 logits); 0 = the whole logits at once."""
    scan_backward: str = "jax"
    """Decoder option scan_backward: "jax" (the scan's own transpose, its stacked weight
    gradient zero-filled first) or "unfilled" (written into a buffer never filled; scanned,
    fully rematerialized blocks)."""

    def __post_init__(self):
        if self.batch < 1:
            raise ValueError(f"--batch {self.batch}: give a batch of at least 1 row")
        if not 2 <= self.seq <= MAX_SEQ_LEN:
            raise ValueError(
                f"--seq {self.seq}: give a sequence length from 2 (each row packs two "
                f"documents) to {MAX_SEQ_LEN} (Qwen3's context length)")
        if self.ga < 1 or self.batch % self.ga:
            raise ValueError(f"--ga {self.ga} does not divide --batch {self.batch}; pick a GA "
                             f"from the divisors of {self.batch}")
        if self.ragged is not None and len(self.ragged) != self.ga:
            raise ValueError(f"{len(self.ragged)} ragged counts for ga={self.ga}; give one "
                             "count per micro-batch")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; valid: "
                             f"{', '.join(OPTIMIZERS)}")
        self.loss_fn()  # validates the name and the loss's options
        set_options = [f"--{name.replace('_', '-')}" for name in TUNIX_GRPO_OPTIONS
                       if getattr(self, name) != _DEFAULTS[name]]
        if set_options and self.loss != "tunix-grpo":
            raise ValueError(f"{', '.join(set_options)} given with --loss {self.loss}: only "
                             "--loss tunix-grpo reads them")
        if self.loss == "tunix-grpo":
            from arms.workload.rollouts import group_size

            group_size(self.batch)
        if self.ragged is not None:
            negative = [n for n in self.ragged if n < 0]
            if negative:
                raise ValueError(f"--ragged {','.join(map(str, self.ragged))}: a count of "
                                 f"{negative[0]} loss tokens; give counts >= 0")
        if (self.ragged is not None and not sum(self.ragged)) or not self.mask_fraction > 0:
            raise ValueError("the step has no loss tokens (its loss would be 0/0): give "
                             "--ragged counts that sum to at least 1 (or a mask_fraction "
                             "above 0)")
        parse_mesh_spec(self.mesh)
        # validates the preset and options, the decoder's against the length and the loss
        check_decoder_options(self.loss, self.model_config(), self.seq)

    @property
    def micro_batch(self) -> int:
        return self.batch // self.ga

    def model_config(self) -> DecoderConfig:
        return get_preset(self.preset, dtype=self.dtype, scan_layers=self.scan_layers,
                          remat=self.remat, **{name: getattr(self, name)
                                               for name in DECODER_OPTIONS})

    def make_mesh(self, devices=None):
        """The cell's mesh over `devices` (default: this process's); a -1 axis takes every
        device the others leave."""
        mesh = make_mesh(self.mesh or None, devices)
        check_fits(self.model_config(), mesh, self.micro_batch)
        return mesh

    def loss_fn(self) -> LossFn:
        if self.loss == "tunix-grpo":
            return get_loss(self.loss, **{name: getattr(self, name)
                                          for name in TUNIX_GRPO_OPTIONS})
        return get_loss(self.loss, **({"z_loss_weight": self.z_loss} if self.loss == "xent"
                                      and self.z_loss else {}))

    def optimizer_tx(self) -> optax.GradientTransformation:
        """The cell's optimizer (arms.workload.optimizers.optimizer_tx)."""
        return optimizer_tx(self.optimizer, self.learning_rate)

    def data_seed(self, step: int) -> int:
        """The seed of step `step`'s data (the weights use `seed` itself)."""
        return self.seed * 1_000_003 + step

    def micro_batches(self, step: int = 0, *, logprobs: bool = True) -> list[MicroBatch]:
        """The micro-batches of optimizer step `step` (deterministic in seed and step).

        tunix-grpo's rollouts carry log-probs of the initial policy, a forward pass of the
        cell's model: computed once per (spec, step) in a process; `logprobs=False` leaves
        them zeros of the same shapes (for plans and validation, which run no model)."""
        if self.loss == "tunix-grpo":
            return list(_rollouts(self, step, logprobs))
        return make_micro_batches(
            seed=self.data_seed(step), batch_size=self.micro_batch, seq_len=self.seq,
            vocab_size=self.model_config().vocab_size, num_micro_batches=self.ga,
            loss_tokens=self.ragged, mask_fraction=None if self.ragged else self.mask_fraction,
            grpo=self.loss == "grpo")

    def to_dict(self) -> dict:
        """The spec as data; tunix-grpo's options and the decoder's attention, logits_chunk
        and scan_backward are left out where they keep their defaults, and the attention
        block sizes where the XLA attention runs (it reads none; a kernel's are always kept),
        so the data (and the hash) of every other cell is what it always was."""
        data = dataclasses.asdict(self)
        for name in (*TUNIX_GRPO_OPTIONS, "attention", "logits_chunk", "scan_backward"):
            if data[name] == _DEFAULTS[name]:
                del data[name]
        if self.attention == "xla":
            for name in ATTENTION_BLOCKS:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> CellSpec:
        data = dict(data)
        if data.get("ragged") is not None:
            data["ragged"] = tuple(data["ragged"])
        return cls(**data)


TUNIX_GRPO_OPTIONS = ("loss_agg_mode", "beta", "epsilon", "epsilon_high", "epsilon_c")
"""CellSpec fields only the tunix-grpo loss reads."""
ATTENTION_BLOCKS = ("attention_block_q", "attention_block_kv")
"""CellSpec fields only an attention kernel reads."""
DECODER_OPTIONS = ("attention", *ATTENTION_BLOCKS, "logits_chunk", "scan_backward")
"""CellSpec fields naming how our decoder computes (the same function either way)."""
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CellSpec)}


@functools.lru_cache(maxsize=8)
def _rollouts(spec: CellSpec, step: int, logprobs: bool) -> tuple[MicroBatch, ...]:
    """Step `step`'s rollout micro-batches of a tunix-grpo cell; with `logprobs`, the old
    (and, with beta > 0, reference) log-probs of the initial policy: the cell's seeded
    weights in float32 on one device, layers scanned (the same values whatever the cell's
    dtype, layer layout or mesh)."""
    from arms.workload.rollouts import make_rollouts, with_policy_logprobs

    config = spec.model_config()
    batches = make_rollouts(
        seed=spec.data_seed(step), batch_size=spec.micro_batch, seq_len=spec.seq,
        vocab_size=config.vocab_size, num_micro_batches=spec.ga, loss_tokens=spec.ragged,
        mask_fraction=spec.mask_fraction)
    if not logprobs:
        import numpy as np

        zeros = np.zeros(batches[0].tokens.shape, np.float32)
        return tuple(b._replace(old_logprobs=zeros, ref_logprobs=zeros if spec.beta else None)
                     for b in batches)
    import jax

    from engine.model import build_decoder, get_preset, make_mesh

    policy = build_decoder(
        get_preset(spec.preset, dtype="float32", scan_layers=True, remat="none"),
        seed=spec.seed, mesh=make_mesh("", devices=jax.local_devices()[:1]))
    return tuple(with_policy_logprobs(batches, policy, reference=bool(spec.beta)))
