"""`parity kernels`: the attention and loss microbenchmark (harness.measure.kernels)."""

from __future__ import annotations

import argparse

from harness.cli.command import Command

DEFAULT_ATTENTION = ("xla,splash:512x1024,splash:512x512,splash:1024x1024,splash:256x1024,"
                     "splash:512x2048,splash:1024x2048,flash:512x512,flash:512x1024")
"""The variants a chip session compares by default: XLA, splash around the issue's best
(512-row query blocks, 1024 keys), flash at the issue's 512-row blocks."""


class Kernels(Command):
    name = "kernels"
    help = "time one layer's attention variants and the loss's head variants (fwd + bwd)"
    description = (
        "One decoder layer's attention (the preset's heads and head dim) by XLA and by JAX's "
        "Pallas splash and flash kernels at given block sizes, and the output head with the "
        "cross-entropy + z-loss statistics through the whole [B, S, V] float32 logits or in "
        "chunks of positions; each forward + backward timed as the median of --steps runs on "
        "the first device, beside XLA's planned temporary bytes and its values' relative l2 "
        "distance from the plain variant's (xla, whole). Off a TPU the kernels run in Pallas "
        "interpret mode: their times mean nothing there. Exit 0, 2 on bad input.")

    @classmethod
    def setup(cls, parser):
        from engine.model import PRESETS

        parser.add_argument("--preset", default="qwen3-0.6b",
                            help=f"model preset whose shapes are timed ({', '.join(PRESETS)})")
        parser.add_argument("--dtype", choices=["bf16", "f32"], default="bf16",
                            help="compute dtype (default bf16)")
        parser.add_argument("--shapes", default="2x1024,1x4096",
                            help="BATCHxSEQ micro-batches (default: the tpu-v5e suite's)")
        parser.add_argument("--attention", default=DEFAULT_ATTENTION,
                            help="variants: xla, splash:QxKV, flash:QxKV (query rows x keys "
                                 "per block); xla is always timed first; a variant whose "
                                 "blocks do not divide a shape's length is skipped there "
                                 "(and said so), refused where they divide none")
        parser.add_argument("--logits-chunks", default="0,256,512,1024",
                            help="positions per chunk of the loss (0: whole logits, always "
                                 "timed first); skipped where it does not divide a length")
        parser.add_argument("--no-attention", action="store_true", help="time the loss only")
        parser.add_argument("--no-loss", action="store_true", help="time attention only")
        parser.add_argument("--steps", type=int, default=20, help="timed runs (median of N)")
        parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
        parser.add_argument("--json", action="store_true", help="print JSON, not markdown")

    @classmethod
    def run(cls, args: argparse.Namespace) -> int:
        import dataclasses
        import json

        import jax

        from engine.model import get_preset
        from harness.measure import kernels

        config = get_preset(args.preset, dtype="bfloat16" if args.dtype == "bf16" else "float32")
        shapes = kernels.parse_shapes(args.shapes)
        variants = [] if args.no_attention else kernels.parse_variants(args.attention)
        chunks = None if args.no_loss else kernels.parse_chunks(args.logits_chunks)
        timings, skipped = kernels.run(config, shapes, variants=variants, chunks=chunks,
                                       steps=args.steps, warmup=args.warmup)
        device = jax.devices()[0]
        about = {"preset": args.preset, "dtype": str(config.compute_dtype),
                 "platform": device.platform, "device_kind": device.device_kind,
                 "jax": jax.__version__, "interpret": device.platform != "tpu"}
        if args.json:
            print(json.dumps({**about, "timings": [dataclasses.asdict(t) for t in timings],
                              "skipped": [dataclasses.asdict(s) for s in skipped],
                              "fastest": kernels.fastest(timings)}))
            return 0
        print(_markdown(about, timings, skipped, kernels.fastest(timings)))
        return 0


def _markdown(about: dict, timings, skipped, fastest: list[str]) -> str:
    lines = [f"{about['preset']} {about['dtype']} on {about['device_kind']} "
             f"({about['platform']}, jax {about['jax']})"
             + (": kernels in Pallas interpret mode, times mean nothing" if about["interpret"]
                else ""), "",
             "| part | shape | variant | median ms | min | max | compile s | temp MiB | rel_l2 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in timings:
        temp = "-" if t.temp_bytes is None else f"{t.temp_bytes / 2**20:.1f}"
        lines.append(f"| {t.part} | {t.shape} | {t.variant} | {t.median_ms:.3f} | "
                     f"{t.min_ms:.3f} | {t.max_ms:.3f} | {t.compile_s:.1f} | {temp} | "
                     f"{t.rel_l2:.2e} |")
    skips = [f"skipped at {s.shape}: {s.part} {s.variant} ({s.why})" for s in skipped]
    return "\n".join([*lines, "", *fastest, *(["", *skips] if skips else [])])
