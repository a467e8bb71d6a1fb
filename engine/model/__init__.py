"""MaxText-style Qwen3 decoder: config and presets, modules, logical-axis sharding."""

from engine.model.attention import AUTO_KERNEL, AUTO_KERNEL_MIN_SEQ
from engine.model.config import ATTENTION_KINDS, PRESETS, DecoderConfig, get_preset
from engine.model.decoder import (
    Decoder,
    abstract_decoder,
    attention_mask,
    build_decoder,
    check_sequence,
    param_count,
    run_once_options,
)
from engine.model.sharding import (
    LOGICAL_AXIS_RULES,
    MESH_AXES,
    abstract_on,
    batch_sharding,
    check_fits,
    constrain,
    make_mesh,
    named_shardings,
    optimizer_shardings,
    parse_mesh_spec,
    shard_model,
    sharding_context,
)

__all__ = [
    "ATTENTION_KINDS", "AUTO_KERNEL", "AUTO_KERNEL_MIN_SEQ",
    "LOGICAL_AXIS_RULES", "MESH_AXES", "PRESETS", "Decoder", "DecoderConfig", "abstract_decoder",
    "abstract_on", "attention_mask",
    "batch_sharding", "build_decoder", "check_fits", "check_sequence", "constrain", "get_preset",
    "make_mesh",
    "named_shardings", "optimizer_shardings", "param_count", "parse_mesh_spec",
    "run_once_options", "shard_model", "sharding_context",
]
