"""What one device of a kind can do at most, from vendor datasheets: the denominators of
MFU and of a step's time bounds (harness.measure.roofline)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """What one JAX device of a kind can do at most (vendor datasheets), per JAX device: a
    chip JAX shows as two devices (TPU7x: one per TensorCore) gets half of each figure."""

    bf16_flops: float
    """Dense (no sparsity) bf16 matmul peak FLOP/s."""
    f32_matmul_flops: float | None
    """Dense peak FLOP/s of a float32 matmul at JAX's default precision: on a TPU one bf16
    pass of the MXU (the bf16 peak); on an NVIDIA or AMD GPU its TF32 tensor cores; None
    where no such figure is kept."""
    hbm_bytes: float
    """HBM capacity."""
    hbm_bytes_per_s: float
    """HBM bandwidth."""
    interconnect_bytes_per_s: float | None
    """The device's share of its chip's bidirectional chip-to-chip bandwidth (TPU ICI, NVIDIA
    NVLink, AMD Infinity Fabric: the datasheet's per-chip figure / devices_per_chip); None
    where the datasheet gives none."""
    devices_per_chip: int = 1
    source: str = ""
    """Where every figure above comes from, per chip as the vendor states it."""

    def matmul_flops(self, dtype: str) -> float | None:
        """Peak FLOP/s of matmuls in `dtype` ('bfloat16' or 'float32')."""
        return {"bfloat16": self.bf16_flops, "float32": self.f32_matmul_flops}.get(dtype)


def _tpu(*, bf16_tflops: float, hbm_gb: float, hbm_gb_per_s: float,
         ici_gb_per_s: float | None, devices_per_chip: int, source: str) -> DeviceSpec:
    """A TPU's spec from its per-chip datasheet figures (decimal GB, GB/s), per device."""
    per = devices_per_chip
    return DeviceSpec(bf16_flops=bf16_tflops * 1e12 / per,
                      f32_matmul_flops=bf16_tflops * 1e12 / per,
                      hbm_bytes=hbm_gb * 1e9 / per, hbm_bytes_per_s=hbm_gb_per_s * 1e9 / per,
                      interconnect_bytes_per_s=ici_gb_per_s and ici_gb_per_s * 1e9 / per,
                      devices_per_chip=per,
                      source=source + "; float32 matmuls at JAX's default precision: one "
                                      "bf16 MXU pass (the bf16 peak)")


DEVICES: dict[str, DeviceSpec] = {
    # Google Cloud TPU docs (system architecture pages), per chip; v4 and v5p join their two
    # TensorCores into one device (megacore), v5e and v6e have one TensorCore per chip.
    "TPU v4": _tpu(bf16_tflops=275, hbm_gb=32, hbm_gb_per_s=1200, ici_gb_per_s=None,
                   devices_per_chip=1,
                   source="cloud.google.com/tpu/docs/v4: 275 TFLOP/s, 32 GB, 1.2 TB/s (no "
                          "per-chip ICI figure on that page)"),
    "TPU v5 lite": _tpu(bf16_tflops=197, hbm_gb=16, hbm_gb_per_s=819, ici_gb_per_s=400,
                        devices_per_chip=1,
                        source="cloud.google.com/tpu/docs/v5e: 197 TFLOP/s, 16 GB, 819 GB/s, "
                               "bidirectional ICI 400 GB/s"),
    "TPU v5": _tpu(bf16_tflops=459, hbm_gb=95, hbm_gb_per_s=2765, ici_gb_per_s=1200,
                   devices_per_chip=1,
                   source="cloud.google.com/tpu/docs/v5p: 459 TFLOP/s, 95 GB, 2765 GB/s, "
                          "bidirectional ICI 1200 GB/s"),
    "TPU v6 lite": _tpu(bf16_tflops=918, hbm_gb=32, hbm_gb_per_s=1640, ici_gb_per_s=800,
                        devices_per_chip=1,
                        source="cloud.google.com/tpu/docs/v6e: 918 TFLOP/s, 32 GB, 1640 GB/s; "
                               "cloud.google.com/tpu/docs/tpu7x (its v6e column): "
                               "bidirectional ICI 800 GB/s"),
    # TPU7x (Ironwood): JAX shows each chip as two devices (8 on a 4-chip host), so a device
    # has half of each per-chip figure.
    "TPU7x": _tpu(bf16_tflops=2307, hbm_gb=192, hbm_gb_per_s=7380, ici_gb_per_s=1200,
                  devices_per_chip=2,
                  source="cloud.google.com/tpu/docs/tpu7x, per chip: 2307 TFLOP/s bf16, "
                         "192 GB, 7380 GB/s, bidirectional ICI 1200 GB/s; halved: two "
                         "devices per chip"),
    # NVIDIA datasheets: dense bf16 and TF32 (the sparse figures are twice these); NVLink
    # is the per-GPU total of both directions.
    "NVIDIA H100 80GB HBM3": DeviceSpec(
        bf16_flops=989e12, f32_matmul_flops=494.5e12, hbm_bytes=80e9, hbm_bytes_per_s=3.35e12,
        interconnect_bytes_per_s=900e9,
        source="H100 SXM datasheet: 989 TFLOP/s bf16, TF32 989 with sparsity (494.5 dense), "
               "80 GB, 3.35 TB/s, NVLink 900 GB/s"),
    "NVIDIA H200": DeviceSpec(
        bf16_flops=989e12, f32_matmul_flops=494.5e12, hbm_bytes=141e9, hbm_bytes_per_s=4.8e12,
        interconnect_bytes_per_s=900e9,
        source="H200 SXM datasheet: 989 TFLOP/s bf16, TF32 989 with sparsity (494.5 dense), "
               "141 GB, 4.8 TB/s, NVLink 900 GB/s"),
    "NVIDIA B200": DeviceSpec(
        bf16_flops=2250e12, f32_matmul_flops=None, hbm_bytes=180e9, hbm_bytes_per_s=8e12,
        interconnect_bytes_per_s=1.8e12,
        source="DGX B200 datasheet per GPU: 2.25 PFLOP/s dense bf16, 180 GB, 8 TB/s, NVLink "
               "1.8 TB/s"),
    # AMD Instinct datasheets: dense bf16; Infinity Fabric: 7 links x 128 GB/s (MI300X),
    # 7 x 153.6 GB/s (MI355X), both directions.
    "AMD Instinct MI300X": DeviceSpec(
        bf16_flops=1307.4e12, f32_matmul_flops=653.7e12, hbm_bytes=192e9,
        hbm_bytes_per_s=5.3e12, interconnect_bytes_per_s=896e9,
        source="MI300X datasheet: 1307.4 TFLOP/s bf16, TF32 653.7, 192 GB, 5.3 TB/s, "
               "Infinity Fabric 896 GB/s"),
    "AMD Instinct MI355X": DeviceSpec(
        bf16_flops=2516.6e12, f32_matmul_flops=None, hbm_bytes=288e9, hbm_bytes_per_s=8e12,
        interconnect_bytes_per_s=1075.2e9,
        source="MI355X datasheet: 2516.6 TFLOP/s bf16, 288 GB, 8 TB/s, Infinity Fabric "
               "1075.2 GB/s"),
}
"""Per JAX device, by `device_kind`; kinds not listed (CPU included) report FLOP/s without
MFU, and plans for them carry no roofline."""

PEAK_BF16_FLOPS: dict[str, float] = {kind: spec.bf16_flops for kind, spec in DEVICES.items()}
"""Dense bf16 peak FLOP/s per JAX device, by `device_kind` (MFU's denominator)."""
