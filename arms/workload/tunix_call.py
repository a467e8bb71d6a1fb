"""Any model of the workload behind the call Tunix's RL code makes:
`model(tokens, positions=, cache=None, attention_mask=, segment_ids=)` -> `(logits, cache)`.
"""

from __future__ import annotations

from flax import nnx


class TunixCall(nnx.Module):
    """A model with our decoder's call, (tokens, positions, segment_ids) -> logits, behind
    the call Tunix makes. Tunix gives a model whose signature takes `segment_ids` the
    non-pad mask (1 real, 0 pad) as segment ids, and the dense causal non-pad mask as
    `attention_mask`: for every real query the two allow the same keys (the real ones at or
    before it), so the segment ids carry the mask and the dense one is not read."""

    def __init__(self, model):
        self.model = model

    def __call__(self, tokens, positions, cache=None, attention_mask=None, segment_ids=None):
        del attention_mask  # the same mask as segment_ids on every real query (see above)
        return self.model(tokens, positions, segment_ids), cache


def tunix_module(model) -> nnx.Module:
    """What Tunix's loss is given for `model`: Tunix's own Qwen3 where the model wraps one
    (`tunix_qwen3()`), else the model behind `TunixCall`."""
    inner = getattr(model, "tunix_qwen3", None)
    return inner() if inner is not None else TunixCall(model)
