"""`PluginConfig`: the knobs of the engine-balancer policy (`policy.rebalance`), and how the
plug-ins read them from the environment (docs/eplb-plugin.md lists every variable)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

from sempar.errors import InputError

ENV_FILE = "SEMPAR_EPLB"
ENV_PREFIX = "SEMPAR_EPLB_"
SWAP_RULES = ("balance-first", "per-cut")   # `swaps.py`: how a balance swap is chosen
# `PluginConfig.scenario_count` when SCENARIOS is unset: by the engine the plug-in runs in
SCENARIOS_BY_ENGINE = {"vllm": 17, "sglang": 5}
SCENARIOS_OTHER = 5
REPLICA_RULES = ("load", "home", "cold")            # `policy` step 3: where the redundant copies go
# `PluginConfig.replica_rule` when unset: by the engine's default dispatch among copies
REPLICA_RULE_BY_ENGINE = {"vllm": "load", "sglang": "load"}


@dataclass(frozen=True)
class PluginConfig:
    """Budget and balance bound of one rebalance.

    max_moves: physical slots whose expert may change per rebalance (expert copies written;
    None: no limit). max_bytes with expert_bytes: the same budget in bytes (the smaller wins).
    max_imbalance: per-layer bound on max / mean device load of the live window that the
    balancing swaps aim for. min_gain: a layer is re-laid only when its imbalance falls by this
    much or its locality (share of FILE's co-activation kept on one device) rises by this much.
    max_age_s: FILE older than this is stale (the engine's default is used; None: no limit).
    settle_s: a refreshed FILE is used once it is this old (`source.load_source`: every rank
    must switch at the same rebalance; 0: at once).
    swaps_per_slot: balancing swaps per layer, at most, per slot of a device.
    lar_rows: rows of a stats FILE's sample the reported LAR is measured on (0: not measured).
    scenarios: load vectors a rebalance balances at once (`policy.scenario_loads`): the live
    window and scenarios - 1 contiguous splits of FILE's sample rows (runs of requests), so the
    layout holds when the mix moves toward any of them and experts that spike together in some
    run of requests are not left on one device (1: the live window alone). None (the
    default): by the engine (`scenario_count`, `SCENARIOS_BY_ENGINE`; ours, issue 43): 17
    under vLLM, 5 under SGLang and elsewhere. vLLM keeps a map for step_interval / window
    (3 in the drift replay) windows, SGLang rebalances after each: a map that must hold longer
    past its window needs the finer splits, 16 runs of one to four requests of a rolling FILE
    of 16-64 requests, which show the experts one request drives together (4 splits average
    them away). Measured in the drift replay (docs/eplb-plugin.md): 17 at vLLM's cadence cut
    the imbalance after a switch to unseen traffic (ESFT-tasks R 0: p95 1.441 -> 1.392 against
    vLLM's 1.387) for about 1% of the LAR; at SGLang's cadence it bought no needed balance and
    cost 0.01-0.05 of the LAR ratio (ESFT-mixture R 8: 1.235x -> 1.181x). Time per rebalance
    at DeepSeek-V3 shape: 0.68 s CPU with 17, 0.33 s with 5.
    engine: the engine the plug-in runs in ("vllm", "sglang"; "" unknown), set by the plug-in
    (`engine.plan`), not read from the environment.
    scenario_slack: a split's bound is max_imbalance + this (+ scenario_distance x its
    distance from the live window's mix, `scenarios.caps_of`).
    scenario_distance: a split's bound rises by this x the total variation distance of its
    load mix from the live window's (0: every split at max_imbalance + scenario_slack, the
    first rule).
    scenario_rows: sample rows of a stats FILE read for the scenarios (and the LAR).
    layout: the locality layout of a stats FILE (`layout.LAYOUTS`): "sempar" (ours, the
    default: sempar's rows-objective solver on FILE's sample rows, once per FILE version;
    "metis" where FILE has no sample or the solve fails) or "metis" (the METIS baseline on the
    co-activation graph). A placement FILE is sempar's layout already.
    layout_rows: sample rows the `sempar` layout is solved on, at most (its cost grows with
    them; 0: every row read).
    layout_effort: x the sempar solver's work budget for the layout (`SolveOptions.effort`).
    swap_rule: how a balance swap is chosen (`swaps.py`, `SWAP_RULES`): "balance-first" (the
    default: among the swaps cutting the peak by at least swap_min_cut x the best cut, the
    one losing the least affinity) or "per-cut" (ours, issue 43: among those, the least
    affinity lost per unit of peak cut). Measured on the MMLU drift windows (EP 8, R 0, one
    rebalance per window, judged on the next step): both on one LAR / imbalance line, per-cut
    no better, so balance-first stays the default.
    swap_min_cut: the share of the best cut a swap must reach to be considered (0.5: the
    rule of `placement/sempar/experts.py`); lower keeps more locality and balances slower
    (MMLU: 0.2 gave LAR 0.400 / next-step imbalance 1.281 against 0.390 / 1.249 at 0.5).
    finish_live: when the scenario swaps stop at a peak no swap can cut, go on balancing the
    live window's peak without lifting any scenario above the worst peak left, the two loops
    in turn to a fixpoint (`swaps.balance_swaps`; ours, issue 43). Off by default (the robust
    loop's stop is final). Measured at 17 scenarios on a FILE profiled away from the traffic
    (`bench_eplb_plugin.py`, one rebalance): live max / mean 1.063 -> 1.042 (V2-Lite, LAR
    0.434 -> 0.425) and 1.149 -> 1.127 (GPT-OSS-20B, 0.486 -> 0.479); in the engines' drift
    replay (`bench_drift_engines.py --suites engines`, all 12 cases) it lost two met LAR
    targets (ESFT-mixture at vLLM's cadence, R 0 / 8: 1.251x / 1.236x -> 1.184x / 1.177x) and
    fixed no p95 miss (MMLU R 0 vLLM +0.056 -> +0.043).
    replica_rule: where the redundant slots go (`REPLICA_RULES`; `policy` step 3): "load"
    (copies of the experts with the highest load per copy, DeepSeek EPLB's rule), "home"
    (ours, issue 43: the copies an expert needs to fit a device's bound by load, then each
    device's free slots to the experts its experts co-activate with most,
    `policy._home_replicas`) or "cold" (ours: the needed copies, then the free slots to the
    least-loaded experts a device lacks). None (the default): by the engine's default
    dispatch among copies (`REPLICA_RULE_BY_ENGINE`), "load" in both for now: "home" suits
    SGLang's `static` (a copy on a token's own device serves it) and "cold" vLLM's hash (a
    copy of a hot expert loses its locality), both gaining LAR on GPT-OSS-20B, but at
    DeepSeek-V3 shape (synthetic routing, EP 32, R 32, one rebalance) they balance the window
    less well (max / mean 1.072 home, 1.247 cold, against 1.046): opt-in until that is
    fixed. Measured in docs/eplb-plugin.md ("Replica slots").
    """

    max_moves: int | None = None
    max_bytes: float | None = None
    expert_bytes: float | None = None
    max_imbalance: float = 1.02
    min_gain: float = 0.005
    max_age_s: float | None = None
    settle_s: float = 30.0
    swaps_per_slot: int = 32
    lar_rows: int = 1024
    scenarios: int | None = None
    scenario_slack: float = 0.0
    scenario_distance: float = 0.0
    scenario_rows: int = 4096
    layout: str = "sempar"
    layout_rows: int = 4096
    layout_effort: float = 1.0
    swap_rule: str = "balance-first"
    swap_min_cut: float = 0.5
    finish_live: bool = False
    replica_rule: str | None = None
    seed: int = 0
    engine: str = ""

    def __post_init__(self) -> None:
        if self.max_moves is not None and self.max_moves < 0:
            raise InputError(f"{ENV_PREFIX}MAX_MOVES: {self.max_moves} is negative")
        if not (math.isfinite(self.settle_s) and self.settle_s >= 0):
            raise InputError(f"{ENV_PREFIX}SETTLE_S: {self.settle_s} is not a number >= 0")
        for name in ("max_bytes", "expert_bytes", "max_age_s"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise InputError(f"{ENV_PREFIX}{name.upper()}: {v} is not a positive number")
        if not 1.0 <= self.max_imbalance < 100:
            raise InputError(f"{ENV_PREFIX}MAX_IMBALANCE: {self.max_imbalance} not in [1, 100)")
        if self.swaps_per_slot < 0 or self.lar_rows < 0 or not self.min_gain >= 0:
            raise InputError(f"{ENV_PREFIX}*: swaps_per_slot / lar_rows / min_gain negative")
        if (self.scenarios is not None and self.scenarios < 1) or self.scenario_rows < 0 or not self.scenario_slack >= 0 \
                or not self.scenario_distance >= 0:
            raise InputError(f"{ENV_PREFIX}SCENARIOS: {self.scenarios} < 1 (or SCENARIO_ROWS "
                             f"{self.scenario_rows} negative)")
        if self.replica_rule is not None and self.replica_rule not in REPLICA_RULES:
            raise InputError(f"{ENV_PREFIX}REPLICA_RULE: {self.replica_rule!r} is not one of "
                             f"{', '.join(REPLICA_RULES)}")
        if self.swap_rule not in SWAP_RULES:
            raise InputError(f"{ENV_PREFIX}SWAP_RULE: {self.swap_rule!r} is not one of "
                             f"{', '.join(SWAP_RULES)}")
        if not 0 < self.swap_min_cut <= 1:
            raise InputError(f"{ENV_PREFIX}SWAP_MIN_CUT: {self.swap_min_cut} not in (0, 1]")
        from sempar.eplb.layout import LAYOUTS

        if self.layout not in LAYOUTS:
            raise InputError(f"{ENV_PREFIX}LAYOUT: {self.layout!r} is not one of "
                             f"{', '.join(LAYOUTS.names())}")
        if self.layout_rows < 0 or not (math.isfinite(self.layout_effort) and
                                        0 < self.layout_effort <= 1000):
            raise InputError(f"{ENV_PREFIX}LAYOUT_ROWS / LAYOUT_EFFORT: {self.layout_rows} "
                             f"negative or {self.layout_effort} not in (0, 1000]")

    def scenario_count(self) -> int:
        """Load vectors a rebalance balances (`scenarios`, or the engine's default)."""
        if self.scenarios is not None:
            return self.scenarios
        return SCENARIOS_BY_ENGINE.get(self.engine, SCENARIOS_OTHER)

    def replica_rule_of(self) -> str:
        """Where the redundant copies go (`replica_rule`, or the engine's default)."""
        if self.replica_rule is not None:
            return self.replica_rule
        return REPLICA_RULE_BY_ENGINE.get(self.engine, "load")

    def sample_rows(self) -> int:
        """Rows of a stats FILE's sample to read: enough for the LAR and the scenarios (0:
        every row)."""
        layout = self.layout_rows if self.layout == "sempar" else 0
        if self.lar_rows == 0 and self.scenario_count() <= 1 and self.layout != "sempar":
            return 1                        # nothing needs the sample; keep what is read small
        if self.layout == "sempar" and layout == 0:
            return 0
        return max(self.lar_rows, self.scenario_rows if self.scenario_count() > 1 else 0, layout)

    def layout_knobs(self) -> dict:
        """The `sempar` layout's work settings, as `source.load_source` takes them."""
        return {"layout_rows": self.layout_rows, "layout_effort": self.layout_effort}

    def move_budget(self) -> int | None:
        """Slot changes allowed per rebalance: the smaller of max_moves and max_bytes /
        expert_bytes (None: no limit)."""
        budget = self.max_moves
        if self.max_bytes is not None:
            if self.expert_bytes is None:
                raise InputError(f"{ENV_PREFIX}MAX_BYTES needs {ENV_PREFIX}EXPERT_BYTES "
                                 f"(bytes of one expert's weights)")
            by_bytes = int(self.max_bytes // self.expert_bytes)
            budget = by_bytes if budget is None else min(budget, by_bytes)
        return budget

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, engine: str = "") -> "PluginConfig":
        """The config from `SEMPAR_EPLB_<FIELD>` variables (field name upper-cased) for a
        plug-in in `engine`; a value that does not parse is bad input (one line)."""
        env = os.environ if env is None else env
        kw: dict = {"engine": engine}
        for f in fields(cls):
            if f.name == "engine":
                continue
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw.strip() == "":
                continue
            if f.name in ("layout", "swap_rule", "replica_rule"):
                kw[f.name] = raw.strip()
                continue
            if f.name == "finish_live":
                flag = raw.strip().lower()
                if flag not in ("0", "1", "true", "false"):
                    raise InputError(f"{ENV_PREFIX}FINISH_LIVE: {raw!r} is not 0, 1, true or false")
                kw[f.name] = flag in ("1", "true")
                continue
            kind = int if f.name in ("max_moves", "swaps_per_slot", "lar_rows", "seed", "scenarios",
                                   "scenario_rows", "layout_rows") else float
            try:
                kw[f.name] = kind(raw)
            except ValueError:
                raise InputError(f"{ENV_PREFIX}{f.name.upper()}: {raw!r} is not a number") from None
        return cls(**kw)
