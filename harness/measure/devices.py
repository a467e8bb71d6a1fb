"""What one device of a kind can do at most, from vendor datasheets: the denominators of
MFU and of a step's time bounds."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """What one JAX device of a kind can do at most (vendor datasheets), per JAX device: a
    chip JAX shows as two devices (TPU7x: one per TensorCore) gets half of each figure."""

    bf16_flops: float
    """Dense (no sparsity) bf16 peak FLOP/s."""
    hbm_bytes: float
    """HBM capacity."""
    hbm_bytes_per_s: float
    """HBM bandwidth."""
    devices_per_chip: int = 1
    source: str = ""


DEVICES: dict[str, DeviceSpec] = {
    # Google Cloud TPU docs (system architecture pages), per chip; v4 and v5p join their two
    # TensorCores into one device (megacore), v5e and v6e have one TensorCore per chip.
    "TPU v4": DeviceSpec(bf16_flops=275e12, hbm_bytes=32e9, hbm_bytes_per_s=1200e9,
                         source="cloud.google.com/tpu/docs/v4: 275 TFLOP/s, 32 GB, 1.2 TB/s"),
    "TPU v5 lite": DeviceSpec(bf16_flops=197e12, hbm_bytes=16e9, hbm_bytes_per_s=819e9,
                              source="cloud.google.com/tpu/docs/v5e: 197 TFLOP/s, 16 GB, "
                                     "819 GB/s"),
    "TPU v5": DeviceSpec(bf16_flops=459e12, hbm_bytes=95e9, hbm_bytes_per_s=2765e9,
                         source="cloud.google.com/tpu/docs/v5p: 459 TFLOP/s, 95 GB, 2765 GB/s"),
    "TPU v6 lite": DeviceSpec(bf16_flops=918e12, hbm_bytes=32e9, hbm_bytes_per_s=1640e9,
                              source="cloud.google.com/tpu/docs/v6e: 918 TFLOP/s, 32 GB, "
                                     "1640 GB/s"),
    # TPU7x (Ironwood): per chip 4614 TFLOP/s FP8 = 2307 bf16, 192 GB, 7.37 TB/s; JAX shows
    # each chip as two devices (8 on a 4-chip host), so a device has half of each.
    "TPU7x": DeviceSpec(bf16_flops=2307e12 / 2, hbm_bytes=192e9 / 2,
                        hbm_bytes_per_s=7.37e12 / 2, devices_per_chip=2,
                        source="cloud.google.com/tpu/docs/tpu7x, per chip: 2307 TFLOP/s bf16, "
                               "192 GB, 7.37 TB/s; halved: two devices per chip"),
    # NVIDIA datasheets: dense bf16 (the sparse figure is twice these).
    "NVIDIA H100 80GB HBM3": DeviceSpec(bf16_flops=989e12, hbm_bytes=80e9,
                                        hbm_bytes_per_s=3.35e12,
                                        source="H100 SXM datasheet: 989 TFLOP/s, 80 GB, "
                                               "3.35 TB/s"),
    "NVIDIA H200": DeviceSpec(bf16_flops=989e12, hbm_bytes=141e9, hbm_bytes_per_s=4.8e12,
                              source="H200 SXM datasheet: 989 TFLOP/s, 141 GB, 4.8 TB/s"),
    "NVIDIA B200": DeviceSpec(bf16_flops=2250e12, hbm_bytes=180e9, hbm_bytes_per_s=8e12,
                              source="DGX B200 datasheet per GPU: 2.25 PFLOP/s dense, "
                                     "180 GB, 8 TB/s"),
    # AMD Instinct datasheets: dense bf16.
    "AMD Instinct MI300X": DeviceSpec(bf16_flops=1307.4e12, hbm_bytes=192e9,
                                      hbm_bytes_per_s=5.3e12,
                                      source="MI300X datasheet: 1307.4 TFLOP/s, 192 GB, "
                                             "5.3 TB/s"),
    "AMD Instinct MI355X": DeviceSpec(bf16_flops=2516.6e12, hbm_bytes=288e9,
                                      hbm_bytes_per_s=8e12,
                                      source="MI355X datasheet: 2516.6 TFLOP/s, 288 GB, "
                                             "8 TB/s"),
}
"""Per JAX device, by `device_kind`; kinds not listed (CPU included) report FLOP/s without
MFU."""

PEAK_BF16_FLOPS: dict[str, float] = {kind: spec.bf16_flops for kind, spec in DEVICES.items()}
"""Dense bf16 peak FLOP/s per JAX device, by `device_kind` (MFU's denominator)."""
