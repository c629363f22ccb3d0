"""Package of R x C compute dies on a 2-D mesh (FSE-DP Table I, §V-C, §VI-A, eqs. 1-2).

Defaults are the paper's test chip (Table I): per die 2048 MACs at 800 MHz quoted as 4.865 TOPS,
UCIe D2D links at 288 GB/s with 4.02 ns FDI-to-FDI latency, DDR3-1600 4 x 25.6 GB/s. Expert weights
live in DDR, token activations on chip.

Choices the paper leaves open ("ours"):

- **Compute.** Peak `peak_ops` = 4.865e12 ops/s per die as quoted (2048 MACs x 2 x 800 MHz is
  3.28e12; we keep the paper's figure). The array works on `lanes` = 16 token rows per weight pass
  (2048 MACs = 128 weight columns x 16 token lanes), so a micro-slice visited with n tokens costs
  ceil(n / 16) passes: few-token experts are weight-streaming bound, as in the paper's Fig. 6 where a
  DDR load takes about 4 x one micro-slice compute. Each micro-slice compute also pays
  `ctrl_overhead_s` and each DDR load or D2D transfer `xfer_overhead_s` (§IV: finer micro-slices
  "increase relative control/scheduling overhead and per-transfer header cost"; Fig. 17).
- **DDR.** One DDR channel per die (`ddr_bw_per_die`, 25.6 GB/s; 4 x 25.6 GB/s for 2x2): a die can
  pull at most one channel's bandwidth; the package total grows with the die count.
- **D2D.** Every directed mesh link carries `d2d_bw`; a transfer of b bytes over h hops takes
  b / d2d_bw + h x (fdi_latency + hop_latency); all-to-all phases are routed XY and cost the most
  loaded link.
- **Eqs. 1-2.** Area per die ceil(BW_D2D / BW_UCIe) x A_UCIe + A_compute + A_buffer <= A_th and
  package power P_compute + P_D2D + P_DDR <= P_th with BW_UCIe = 512/3 GB/s (§VI-D: 512 GB/s = 3 UCIe
  x32 modules), A_th = 30 mm^2 and P_th = 60 W (§VI-D); the per-unit figures below are ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from sempar.errors import InputError

MB = 1 << 20


@dataclass(frozen=True)
class ChipletConfig:
    """Hardware of one multi-chiplet package (SI units: bytes, seconds, bytes/s)."""

    rows: int = 2
    cols: int = 2
    macs: int = 2048
    freq_hz: float = 800e6
    peak_ops: float = 4.865e12          # ops/s per die (Table I)
    lanes: int = 16                     # token rows per weight pass (ours)
    buffer_bytes: int = 16 * MB         # on-chip expert-weight buffer per die (ours)
    d2d_bw: float = 288e9               # per directed mesh link (Table I)
    fdi_latency_s: float = 4.02e-9      # UCIe FDI-to-FDI (Table I)
    hop_latency_s: float = 10e-9        # router traversal per hop (ours)
    ddr_bw_per_die: float = 25.6e9      # one DDR3-1600 channel per die (Table I: 4 x 25.6 GB/s)
    ddr_latency_s: float = 100e-9       # ours
    ctrl_overhead_s: float = 0.25e-6    # per micro-slice compute (ours; Fig. 17's control cost)
    xfer_overhead_s: float = 0.5e-6     # per DDR burst / D2D packet: descriptor + header (ours)
    act_bytes: int = 2                  # bf16 activations (ours)

    def __post_init__(self) -> None:
        for name in ("rows", "cols", "macs", "lanes"):
            if getattr(self, name) < 1:
                raise InputError(f"chiplet {name}: {getattr(self, name)} must be at least 1")
        for name in ("peak_ops", "d2d_bw", "ddr_bw_per_die", "buffer_bytes"):
            if not getattr(self, name) > 0:
                raise InputError(f"chiplet {name}: {getattr(self, name)} must be positive")
        if self.rows * self.cols > 16:
            raise InputError(f"chiplet mesh {self.rows}x{self.cols}: at most 16 dies are modelled")

    @property
    def dies(self) -> int:
        return self.rows * self.cols

    @property
    def mesh(self) -> "Mesh":
        return mesh_of(self.rows, self.cols)

    def with_(self, **kw) -> "ChipletConfig":
        return replace(self, **kw)


def parse_mesh(text: str) -> tuple[int, int]:
    """'2x2' -> (2, 2); InputError otherwise."""
    try:
        r, c = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise InputError(f"--mesh: {text!r} is not ROWSxCOLS (e.g. 2x2)") from None
    if r < 1 or c < 1 or r * c > 16 or r * c < 2:
        raise InputError(f"--mesh: {text!r} must have 2 to 16 dies")
    return r, c


@dataclass(frozen=True)
class Mesh:
    """Die coordinates, hop distances, the logical ring and XY routes of an R x C mesh.

    - `hops`: int64[D, D] Manhattan distance.
    - `ring`: int64[D] a snake (boustrophedon) order of the dies; a trajectory visits its dies in
      this cyclic order (§VI-A: "we schedule an expert trajectory as a ring ... a *logical* route").
    - `route`: float64[D*D, links] 1 where the XY route of (src, dst) uses a directed link.
    """

    rows: int
    cols: int
    hops: np.ndarray
    ring: np.ndarray
    ring_pos: np.ndarray
    route: np.ndarray
    links: list[tuple[int, int]] = field(repr=False)

    @property
    def dies(self) -> int:
        return self.rows * self.cols

    def link_time(self, bytes_sd: np.ndarray, bw: float, lat_per_hop: float) -> np.ndarray:
        """All-to-all phase time per instance: float64[B] from bytes_sd float64[B, D, D].

        Max over directed links of routed bytes / bw, plus the longest used route's latency.
        """
        B, D, _ = bytes_sd.shape
        flat = bytes_sd.reshape(B, D * D)
        load = flat @ self.route
        used = flat > 0
        hop = np.where(used, self.hops.reshape(1, -1), 0).max(axis=1)
        return load.max(axis=1, initial=0.0) / bw + hop * lat_per_hop


@lru_cache(maxsize=None)
def mesh_of(rows: int, cols: int) -> Mesh:
    D = rows * cols
    xy = np.array([(d // cols, d % cols) for d in range(D)])
    hops = np.abs(xy[:, None, :] - xy[None, :, :]).sum(-1)
    ring = np.array([r * cols + (c if r % 2 == 0 else cols - 1 - c)
                     for r in range(rows) for c in range(cols)])
    ring_pos = np.empty(D, np.int64)
    ring_pos[ring] = np.arange(D)
    links: list[tuple[int, int]] = []
    for a in range(D):
        for b in range(D):
            if hops[a, b] == 1:
                links.append((a, b))
    index = {lk: i for i, lk in enumerate(links)}
    route = np.zeros((D * D, len(links)))
    for s in range(D):
        for d in range(D):
            (r, c), (r2, c2) = xy[s], xy[d]
            cur = s
            while c != c2:                      # X first
                c += 1 if c2 > c else -1
                nxt = r * cols + c
                route[s * D + d, index[(cur, nxt)]] = 1
                cur = nxt
            while r != r2:
                r += 1 if r2 > r else -1
                nxt = r * cols + c
                route[s * D + d, index[(cur, nxt)]] = 1
                cur = nxt
    return Mesh(rows, cols, hops, ring, ring_pos, route, links)


# ---- eqs. 1-2: area and power limits of the design-space exploration (§VI-D) ----

@dataclass(frozen=True)
class Budget:
    """Constants of eqs. 1-2. A_th and P_th are the paper's; the unit costs are ours."""

    bw_ucie: float = 512e9 / 3        # one UCIe x32 module (§VI-D: 512 GB/s = 3 modules)
    area_ucie_mm2: float = 1.1        # ours
    area_compute_mm2: float = 6.5     # ours: 2048 MACs + NLU + DMU in 5 nm (die is 12.7 mm^2)
    area_sram_mm2_per_mb: float = 0.55  # ours: 5 nm SRAM macro with periphery
    area_th_mm2: float = 30.0         # §VI-D
    power_compute_w: float = 2.187    # per die, Table I upper figure
    d2d_pj_per_bit: float = 0.6       # ours (0.29-0.82 pJ/b cited in §II-B)
    ddr_pj_per_bit: float = 20.0      # ours (DDR3 interface + device)
    power_th_w: float = 60.0          # §VI-D


def area_mm2(cfg: ChipletConfig, budget: Budget = Budget()) -> float:
    """Left-hand side of eq. 1 for one die."""
    modules = math.ceil(cfg.d2d_bw / budget.bw_ucie - 1e-9)
    return (modules * budget.area_ucie_mm2 + budget.area_compute_mm2
            + cfg.buffer_bytes / MB * budget.area_sram_mm2_per_mb)


def power_w(cfg: ChipletConfig, budget: Budget = Budget()) -> float:
    """Left-hand side of eq. 2 for the package (all links and channels at full rate)."""
    D = cfg.dies
    links_per_die = len(cfg.mesh.links) / D
    p_d2d = D * links_per_die * cfg.d2d_bw * 8 * budget.d2d_pj_per_bit * 1e-12
    p_ddr = D * cfg.ddr_bw_per_die * 8 * budget.ddr_pj_per_bit * 1e-12
    return D * budget.power_compute_w + p_d2d + p_ddr


def feasible(cfg: ChipletConfig, budget: Budget = Budget()) -> bool:
    """Eqs. 1 and 2 both hold."""
    return area_mm2(cfg, budget) <= budget.area_th_mm2 and power_w(cfg, budget) <= budget.power_th_w
