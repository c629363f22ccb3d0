"""`SemparConfig`: every tuning setting of the `sempar` solver in one frozen, typed object.

The solver's modules read their settings from the config they are handed, never from module
globals, so a test or a benchmark changes a setting by building a config
(`SemparConfig(pass_rounds=1)`, `dataclasses.replace(cfg, ...)`) and records it with
`dataclasses.asdict`. The defaults are the solver's settings when it is run by name
(`solve("sempar", ...)`, `place --method sempar`).

Five settings depend on the trace's shape: `large_trace`, `sparse_step`,
`bounded_experts`, `budget_rows` and `budget_restarts`. Left None they are undecided;
`for_shape` / `for_problem` decide them from the shape with the size rules below
(`scale_token_layers`, `scale_sparse_devices`, `full_search_experts`, `work_budget` x the
problem's `effort`), and the solver only ever sees decided values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sempar.affinity.affinity_stats import BLOCK_LAYERS
from sempar.errors import check_choice
from sempar.placement.sempar.held_out import HeldOut


@dataclass(frozen=True, kw_only=True)
class SemparConfig:
    """The `sempar` solver's settings (module docstring); N experts, G devices."""

    # ---- alternation of tokens (requests) and experts
    rounds: int = 12
    """Alternations of the token (request) step and the expert step, at most (default path)."""
    stop_gain: float = 1e-6
    """The alternations stop when a round gains less than this share of the fit objective."""
    token_slack: float = 0.0
    """Large-trace token step: a device may take (1 + token_slack) / G of the fit occurrences."""
    dp_token_table: str = "share"
    """dp token table: "share" (each token on the device holding most of its activations) or
    "requests" (on the rank where most of its fit requests went, Sem-MoE Alg. 1's label)."""

    # ---- tp token step (placement/sempar/tokens.py)
    shuffles: int = 4
    """Seeded request orders cut into pseudo-batches for tp mode's per-batch capacity."""
    token_price_steps: int = 80
    """Lagrangian price updates of the per-batch capacities in the tp token step."""

    token_patience: int = 0
    """tp token step: stop the price updates once this many in a row found no better iterate
    (0: never; the `rows` objective's layer solves take `row_patience`)."""

    # ---- expert step (placement/sempar/experts.py)
    price_steps: int = 25
    """Hungarian solves with Lagrangian load prices in the (unbounded) expert step."""
    swap_limit: int = 4
    """Unbounded expert step: at most swap_limit x N pairwise swaps per candidate."""
    full_search_experts: int = 64
    """Above this many experts the expert step is bounded like the large-trace path's (each swap
    scans N^2 pairs, so the full search grows as N^3 a candidate); `bounded_experts`' rule."""
    bounded_experts: bool | None = None
    """Whether the expert step takes the bounds of `scale.expert_bounds`; None: decided by
    `for_shape` (N > full_search_experts)."""

    # ---- hypergraph start (placement/sempar/hypergraph.py)
    hypergraph_start: bool = False
    """tp default path: a Mt-KaHyPar partition (repaired to N / G a device) as a second start
    of each layer's alternation beside METIS, the better by fit objective kept
    (`sempar-hypergraph`)."""
    hypergraph_effort: float = 2.0
    """From this `--effort` on, `for_shape` turns `hypergraph_start` on (2.5-6x the solve's CPU
    on the shipped traces, +0.001 to +0.010 in-sample exact-home LAR: docs/placement.md)."""
    hypergraph_objective: str = "km1"
    """The partitioner's objective: km1, soed or cut."""
    hypergraph_preset: str = "default"
    """Mt-KaHyPar's preset: deterministic, default or quality."""

    # ---- load model (placement/sempar/load.py)
    robust: float = 2.0
    """Load margin factor: a device's load counts sqrt(robust x V_d) of resampling spread.
    Not a lever for held-out balance on a small fit (issue 45, DeepSeek-V2-Lite EP 8 dp, 35 fit
    requests, fit cap 1.0, rows objective, no calibration; 20/80 split by request, seed 0):
    robust 0 / 0.7 / 2 / 6 / 16 held out at 1.133 / 1.102 / 1.106 / 1.116 / 1.134, LAR
    0.141-0.142: no trend beyond the noise of which experts share a device."""

    # ---- replicas (placement/sempar/replicas.py, --redundant)
    replica_slack: float = 1.0
    """With replicas to follow, the primary's cap keeps this share of the headroom above the
    mean load (1.0: the full --max-imbalance cap)."""
    replica_target: float = 0.2
    """The replica step's served-load cap keeps this share of the primary cap's headroom."""
    replica_margin: float = 3.0
    """x the primary's largest robust margin, taken off the replica step's cap."""
    pass_z: float = 1.5
    """tp balancing pass: robust served loads with pass_z x the load model's margin."""
    pass_peak: float = 0.0
    """tp balancing pass: swaps while the peak is above (1 + pass_peak) x the mean."""
    pass_moves: int = 12
    """tp balancing pass: at most pass_moves x G swaps a round."""
    pass_rounds: int = 2
    """tp balancing pass: rounds, each kept only if the peak stays lower once tokens follow."""
    dp_hot: int = 1
    """dp mode: the hottest experts of a layer put on every device before the primary solve."""
    tp_hot_fallback: bool = True
    """tp mode: where the replica step leaves the robust fit peak above the primary's cap, a
    second try with the layer's hottest expert on every device, the more balanced kept."""
    full_scan: int = 4096
    """The replica step scores every open (device, expert) pair up to this many; above, only
    `top_pairs` and the peak device's experts (and the balancing pass is skipped)."""
    top_pairs: int = 256
    """Above `full_scan`: the open pairs with the most fit activations made local, scored."""

    # ---- large-trace path (placement/sempar/scale.py)
    scale_token_layers: int = 8_000_000
    """Size rule: a fit trace with more token occurrences x MoE layers takes the large path."""
    large_trace: bool | None = None
    """Whether the large-trace path runs (tp mode only); None: decided by `for_shape`."""
    scale_rounds: int = 3
    """Large-trace path: alternations at most."""
    scale_stop_gain: float = 2e-3
    """Large path, sparse step: alternations stop when the fit objective gains less than this
    share."""
    scale_requests: int = 1024
    """Large-trace path: fit requests sampled for the load model and the greedy start."""
    scale_token_rounds: int = 8
    """Large-trace path: proposal rounds of the one-capacity token step."""
    scale_sparse_devices: int = 16
    """Up to this many devices the large path keeps the dense token step and the longer expert
    bounds (`scale_dense_*`); above, `sparse_step`'s settings. `sparse_step`'s rule."""
    sparse_step: bool | None = None
    """Whether the large path's sparse token step, the shorter expert bounds (`scale_price_steps`,
    `scale_polish`, `scale_swaps`) and the early stop (`scale_stop_gain`) apply (also to the
    bounded expert step of `bounded_experts`); None: decided by `for_shape`
    (G > scale_sparse_devices)."""
    scale_price_steps: int = 6
    """Bounded expert step, sparse step: Hungarian solves."""
    scale_polish: int = 1
    """Bounded expert step, sparse step: candidates that get swaps."""
    scale_swaps: int = 16
    """Bounded expert step, sparse step: swaps per candidate, at most."""
    scale_dense_price_steps: int = 8
    """Bounded expert step, dense step: Hungarian solves."""
    scale_dense_polish: int = 2
    """Bounded expert step, dense step: candidates that get swaps."""
    scale_dense_swaps: int = 32
    """Bounded expert step, dense step: swaps per candidate, at most."""
    row_sample: int = 200_000
    """`rows` objective: fit rows kept (whole requests, seeded) for the row-level solve."""
    row_sets: bool = True
    """`rows` objective, tp mode: each layer solved alone on its distinct expert sets, layers on
    forked workers (row_sets.py); False: the per-row solve of all layers at once (the old path,
    kept for benchmarks/bench_rows_speed.py)."""
    row_patience: int = 5
    """`rows` objective with `row_sets`: the token step's `token_patience` (the early stop
    where the priced assignment no longer improves)."""
    row_restarts: int = 3
    """`rows` objective: solves from different seeds, the best kept per layer (tp) or whole
    (dp) by fit local activations (rows.best_of); cut to `budget_restarts` on large models."""
    work_budget: float = 4e8
    """`rows` objective: fit rows x MoE layers x experts x restarts the solve may take at
    `--effort` 1 (`PlacementProblem.effort` multiplies it). About 20 M units a CPU second on the
    development machine; GPT-OSS-20B (152k rows, 24 x 32) and DeepSeek-V2-Lite (25k rows,
    26 x 64) fit whole with `row_restarts`; DeepSeek-V3 (58 x 256) gets 1 restart on 27k rows."""
    min_budget_rows: int = 4096
    """`rows` objective: the fewest fit rows the budget cuts the sample to."""
    budget_rows: int | None = None
    """`rows` objective: the fit rows solved (a seeded sample of whole requests, nested in the
    `row_sample` one); None: decided by `for_shape` from `work_budget`."""
    budget_restarts: int | None = None
    """`rows` objective: the restarts run; None: decided by `for_shape` from `work_budget`."""
    held_out_retries: int = 3
    """`rows` objective: solves after the first that lower the fit cap while the request
    bootstrap predicts a held-out imbalance above the target (held_out.py)."""
    held_out_replicates: int = 50
    """`rows` objective: request bootstrap replicates of that prediction."""
    held_out_resamples: int = 1
    """`rows` objective: the new requests that prediction is for: 1, the population's loads (a
    deployment's long run); 2, a new sample as large as the fit sample (held_out.py)."""
    held_out_folds: int = 4
    """`rows` objective: cross-validation folds over the fit requests that measure how much
    further than the bootstrap a placement drifts on new requests (held_out.py, step 3; each
    fold one more solve; 0: the bootstrap alone, and no imbalance is promised)."""
    held_out_refold: bool = True
    """`rows` objective: where the cap search moved the fit cap, the folds are solved again at
    the cap kept and the prediction uses their inflation (held_out.py, step 4)."""
    held_out_margin: float = 0.01
    """`rows` objective: the cap search aims the upper prediction at the target less this (the
    promise itself stays upper <= target). 0.01 (issue 45): at 0 GPT-OSS-20B EP 8 tp kept an
    upper figure of 1.0999 and held out 1.103; at 0.01 fit cap 1.0, held out 1.087, LAR
    0.374 -> 0.366 (held_out.py)."""
    held_out_fallback: str = "point"
    """`rows` objective: where no fit cap from 1.0 up has an upper prediction within the target
    (the fit too small to promise it), "upper" keeps the cap of the lowest upper prediction;
    "point" (ours, issue 45) searches the cap again on the point prediction with the refolded
    inflation, down to `held_out_min_cap` (held_out.py, step 6; docs/placement.md). Measured
    on the 8 real cases (2026-12-07): DeepSeek-V2-Lite EP 8 dp held out 1.106 -> 1.088 (LAR
    0.142 -> 0.139), EP 8 tp 1.096 -> 1.084 (LAR 0.436 -> 0.423), EP 4 dp kept at cap 1.0,
    the five cases whose upper prediction is within 1.10 unchanged."""
    held_out_min_cap: float = 0.95
    """`rows` objective, "point" search: the lowest fit cap (x the mean robust load; below 1.0
    the robust loads must sit under the mean, their margin past a random grouping's charged)."""
    held_out_point_retries: int = 3
    """`rows` objective, "point" search: solves at most. 3 (h45s, with the secant step; 2
    before): DeepSeek-V2-Lite EP 4 dp's third probe finds cap 1.008 within the aim (point
    1.089), LAR 0.267 -> 0.2695, held out 1.062 -> 1.074; EP 8 dp and tp keep their caps."""
    held_out_point_margin: float = 0.005
    """`rows` objective, "point" search (step 6, where no cap is promised): it aims the point
    prediction at the target less this (the upper search keeps `held_out_margin`). 0.005 (h45d,
    2026-12-08; 0.01 before), the three DeepSeek-V2-Lite cases that reach step 6, LAR (tp:
    exact homes by the greedy rounds) / held out / point: EP 8 dp 0.1391 / 1.088 / 1.084 ->
    0.1408 / 1.093 / 1.094 (cap 0.987 -> 0.9946, lead over eplb +0.009 -> +0.011); EP 4 dp
    0.2695 / 1.074 / 1.089 -> 0.2700 / 1.075 / 1.093 (cap 1.008 -> 1.0107); EP 8 tp 0.429 /
    1.078 / 1.089 -> 0.431 / 1.091 / 1.095 (cap 0.991 -> 0.9952). The five cases whose upper
    prediction is within never reach step 6."""
    budget_held_out_folds: int = 2
    """`rows` objective: the folds kept where the work budget cuts the fit sample (DeepSeek-V3
    shape at `--effort` 1: 240k tokens, EP 16, 12 solves in 426 CPU s with the full calibration;
    see `budget_held_out`)."""
    block_layers: int = BLOCK_LAYERS
    """Consecutive layers a forked worker takes at a time (the affinity statistics gather the
    trace's selections that many layers at once)."""

    def __post_init__(self) -> None:
        check_choice("dp_token_table", self.dp_token_table, ("share", "requests"))
        check_choice("held_out_fallback", self.held_out_fallback, ("upper", "point"))
        check_choice("hypergraph_objective", self.hypergraph_objective, ("km1", "soed", "cut"))
        check_choice("hypergraph_preset", self.hypergraph_preset,
                     ("deterministic", "default", "quality"))

    def budget(self, tokens: int, layers: int, experts: int, effort: float) -> tuple[int, int]:
        """(fit rows, restarts) the `rows` objective affords on a fit trace of `tokens` rows
        (`work_budget` x effort): all `row_restarts` while the sampled rows fit them, else one
        restart on as many rows as fit (at least `min_budget_rows`)."""
        rows = min(int(tokens), self.row_sample)
        unit = max(1, layers * experts)
        budget = self.work_budget * effort
        if rows * unit * self.row_restarts <= budget:
            return rows, self.row_restarts
        restarts = int(max(1, min(self.row_restarts, budget // (rows * unit))))
        if restarts > 1 or rows * unit <= budget:
            return rows, restarts
        return min(rows, max(self.min_budget_rows, int(budget // unit))), 1

    def budget_held_out(self) -> dict:
        """The held-out calibration's settings where the work budget cuts the fit sample: no
        cap search (the solve's cap is kept), no refold, and at most `budget_held_out_folds`
        folds (each solves on part of the fit, together about one more solve), no point
        search."""
        return {"held_out_retries": 0, "held_out_refold": False, "held_out_point_retries": 0,
                "held_out_folds": min(self.held_out_folds, self.budget_held_out_folds)}

    def held_out(self, problem):
        """The `HeldOut` settings (held_out.py) of `problem`'s calibrated solve: its target and
        seed, this config's `held_out_*` knobs."""
        return HeldOut(target=problem.held_out_imbalance, retries=self.held_out_retries,
                       replicates=self.held_out_replicates, resamples=self.held_out_resamples,
                       seed=problem.seed, folds=self.held_out_folds, refold=self.held_out_refold,
                       margin=self.held_out_margin, fallback=self.held_out_fallback,
                       min_cap=self.held_out_min_cap, point_retries=self.held_out_point_retries,
                       point_margin=self.held_out_point_margin)

    @classmethod
    def for_shape(cls, tokens: int, layers: int, experts: int, devices: int,
                  effort: float = 1.0, **settings) -> SemparConfig:
        """The config for a fit trace of `tokens` token occurrences and `layers` MoE layers,
        `experts` experts a layer, placed on `devices` devices at `effort`: `settings` (field
        values) with `large_trace`, `sparse_step`, `bounded_experts`, `budget_rows` and
        `budget_restarts` decided by the size rules wherever `settings` leaves them None, and
        `hypergraph_start` on from `hypergraph_effort`."""
        cfg = cls(**settings)
        rows, restarts = cfg.budget(tokens, layers, experts, effort)
        if rows < min(int(tokens), cfg.row_sample):
            # The budget cut the sample, so one solve is all it affords: the held-out
            # calibration's extra solves (up to 1 + retries + folds x 2) would multiply it.
            # Keep a 2-fold prediction at the solved cap; `--effort` raises the budget back.
            cfg = replace(cfg, **{k: v for k, v in cfg.budget_held_out().items()
                                  if k not in settings})
        return replace(
            cfg,
            budget_rows=rows if cfg.budget_rows is None else cfg.budget_rows,
            budget_restarts=restarts if cfg.budget_restarts is None else cfg.budget_restarts,
            hypergraph_start=cfg.hypergraph_start or effort >= cfg.hypergraph_effort,
            large_trace=(tokens * layers > cfg.scale_token_layers if cfg.large_trace is None
                         else cfg.large_trace),
            sparse_step=(devices > cfg.scale_sparse_devices if cfg.sparse_step is None
                         else cfg.sparse_step),
            bounded_experts=(experts > cfg.full_search_experts if cfg.bounded_experts is None
                             else cfg.bounded_experts))

    @classmethod
    def for_problem(cls, problem, **settings) -> SemparConfig:
        """`for_shape` of a `PlacementProblem`'s fit trace and device count."""
        meta = problem.trace.meta
        return cls.for_shape(problem.trace.num_tokens, meta.num_layers, meta.num_experts,
                             problem.num_devices, getattr(problem, "effort", 1.0), **settings)
