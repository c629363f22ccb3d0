"""Accelerators for the serving roofline, by name (`sempar serve-sim --accelerator`).

Peak dense BF16 FLOP/s, HBM (or GDDR) bytes/s and memory from the vendors' data sheets:

- `a100`: A100-SXM4-80GB: 312 TFLOP/s BF16 dense, 2,039 GB/s HBM2e, 80 GB (ExFlow's Wilkes3 GPUs).
- `h100`: H100-SXM5-80GB: 989 TFLOP/s BF16 dense, 3,350 GB/s HBM3, 80 GB.
- `h200`: H200-SXM-141GB: 989 TFLOP/s BF16 dense, 4,800 GB/s HBM3e, 141 GB.
- `smoe-a`: s-MoE's GPU-Server-A card (Table 1: 96 GB HBM, 900 GB/s links). The paper does not
  name the card; 96 GB HBM with 900 GB/s NVLink is the H20's data sheet, whose figures we take
  (148 TFLOP/s BF16 dense, 4,000 GB/s HBM3) -- our assumption. Sem-MoE's server is the same class.
- `smoe-b`: s-MoE's GPU-Server-B card (Table 1: 48 GB GDDR6, PCIe 5.0). Not named either; we take
  the L40S data sheet (362 TFLOP/s BF16 dense, 864 GB/s GDDR6, 48 GB) -- our assumption.
- `cpu`: a placeholder for forecasting on this machine's CPU (`--accelerator cpu` with measured
  figures is what the bench check calibrates): 0.1 TFLOP/s, 20 GB/s, 16 GB.

Real kernels reach a fraction of peak: `flops_eff` and `bw_eff` (ours: 0.6 of peak FLOP/s, 0.8 of
peak bandwidth, the usual figures of large BF16 GEMMs and streaming reads on these parts).
`mem_util` is the share of memory the engine may use (SGLang's `--mem-fraction-static` 0.9).

The roofline is corrected by measurements where an accelerator profile exists
(`serving/accel_profile.py`: `profile` names one loaded from `--accelerator-profile`, else the
shipped `assets/accelerators/<name>.json` is used); GPUs without one keep the roofline plus the
fixed per-kernel cost fitted on the shipped H100 profile (`launch_floor`: the GPUs here; not
`cpu` nor accelerators built elsewhere, e.g. benchcheck's measured CPU).
`compute_scale` multiplies every compute time (the report's sensitivity line: 1.3 = 30 % slower).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sempar.registry import Registry

TERA, GIGA = 1e12, 1e9


@dataclass(frozen=True)
class Accelerator:
    name: str
    flops: float            # peak dense BF16 FLOP/s
    mem_bw: float           # bytes/s
    memory: float           # bytes
    flops_eff: float = 0.6
    bw_eff: float = 0.8
    mem_util: float = 0.9
    launch_floor: bool = False          # the GPUs below: a fixed cost per kernel block (calibration.py)
    compute_scale: float = 1.0          # every compute time x this (sensitivity)
    profile: Any = field(default=None, compare=False, repr=False)   # AcceleratorProfile | None

    @property
    def eff_flops(self) -> float:
        return self.flops * self.flops_eff

    @property
    def eff_bw(self) -> float:
        return self.mem_bw * self.bw_eff


ACCELERATORS: Registry[Accelerator] = Registry("accelerator")
for _a in (
    Accelerator("a100", 312 * TERA, 2039 * GIGA, 80 * GIGA, launch_floor=True),
    Accelerator("h100", 989 * TERA, 3350 * GIGA, 80 * GIGA, launch_floor=True),
    Accelerator("h200", 989 * TERA, 4800 * GIGA, 141 * GIGA, launch_floor=True),
    Accelerator("smoe-a", 148 * TERA, 4000 * GIGA, 96 * GIGA, launch_floor=True),
    Accelerator("smoe-b", 362 * TERA, 864 * GIGA, 48 * GIGA, launch_floor=True),
    Accelerator("cpu", 0.1 * TERA, 20 * GIGA, 16 * GIGA, flops_eff=1.0, bw_eff=1.0),
):
    ACCELERATORS.add(_a.name, _a)
