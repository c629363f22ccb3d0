"""The drift verbs' options, passed whole (as `SolveOptions` is to the solvers): the incremental
step's `RebalanceConfig` with the model's byte sizes filled in, and `ReplayConfig`, the replay's
knobs around it. Every default is declared once: `RebalanceConfig`'s in `placement.rebalance`,
the full solves' in `SolveOptions` (`solve_options`), the replay's here; `sempar rebalance`,
`sempar replay` and the benchmarks build their configs with `rebalance_config` / `ReplayConfig`
and pass only what the user set.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from sempar.drift.costs import MOVES_MAX
from sempar.drift.events import Events
from sempar.drift.history import History
from sempar.errors import InputError
from sempar.placement.dispatch import DEFAULT_DISPATCH
from sempar.placement.dispatch_peak import ReplicaPass
from sempar.placement.rebalance import RebalanceConfig
from sempar.solve_options import SolveOptions


def rebalance_config(model: str, *, expert_bytes: float | None = None,
                     remote_bytes: float | None = None, **knobs) -> RebalanceConfig:
    """`RebalanceConfig` of `knobs` (its field names; None or absent: its default), with
    `expert_bytes` / `remote_bytes` from `model`'s shape (`drift.costs`) unless given, and no
    move cap when only `max_bytes` is given (a byte budget alone bounds the step)."""
    from sempar.drift.costs import expert_bytes as bytes_of, remote_activation_bytes

    names = {f.name for f in fields(RebalanceConfig)}
    bad = sorted(set(knobs) - names)
    if bad:
        raise TypeError(f"rebalance_config: unknown fields {bad}")
    set_ = {k: v for k, v in knobs.items() if v is not None}
    if "max_moves" not in set_ and set_.get("max_bytes") is not None:
        set_["max_moves"] = MOVES_MAX
    eb = float(expert_bytes) if expert_bytes is not None else float(bytes_of(model))
    rb = float(remote_bytes) if remote_bytes is not None else float(remote_activation_bytes(model))
    return RebalanceConfig(expert_bytes=eb, remote_bytes=rb, **set_)


@dataclass(frozen=True)
class ReplayConfig:
    """The replay's knobs (`drift.replay`): EP degree, step and window in requests, the full
    solves' options (their `redundant` is the replica slots R every policy gets), the
    incremental step's config, history and switch test (`drift.events`), the dispatch rule
    among copies, and the engine
    cadence (`drift.engines`): the balancer `sempar-engine` runs in (`engine`) and the forward
    passes one step of `every` requests stands for (`passes_per_step`)."""

    ep: int
    every: int = 16                     # requests served per step (updates between steps)
    window: int = 32                    # requests each update sees (the last ones served)
    max_steps: int | None = None        # stop after this many steps (None: the whole stream)
    solve: SolveOptions = field(default_factory=lambda: SolveOptions(jobs=1))
    rebalance: RebalanceConfig = field(default_factory=RebalanceConfig)
    history: History = field(default_factory=History)   # sempar-incremental's load history
    dispatch: str = DEFAULT_DISPATCH    # which copy of a replicated expert serves a token
    replicas: ReplicaPass = field(default_factory=ReplicaPass)   # sempar-incremental's slots
    events: Events = field(default_factory=Events)   # sempar-incremental's switch test
    split_bound: bool = True            # sempar-incremental under a balancing dispatch: its
                                        # bound on the load the dispatch serves (True) or on the
                                        # nearest copy's (False: stricter, it leaves the replicas
                                        # as headroom); docs/drift.md "The bound after dispatch"
    warm_start: bool = True             # sempar-incremental: one update on the warm-up window
                                        # before step 0 (the start solve places replica slots
                                        # by its own rule, not for the peak the dispatch serves)
    warm_replica_moves: int | None = None   # replica slots per layer that warm-up update may
                                            # retarget (None: every slot, R)
    young_budget: bool = True           # sempar-incremental: its step updates while the stream
                                        # is younger than the history's span get the event
                                        # budget (`Events.max_moves` moves, `replica_moves`
                                        # slots per layer), as a young regime's do (False: the
                                        # step budget); docs/drift.md "Young-stream budget"
    young_cap: float | None = None      # and their bound on the youngest window (None: the
                                        # rebalance cap)
    young_resamples: int = 8            # sempar-incremental: on the warm-up update and the
                                        # young-stream updates (`young_budget`) its replica
                                        # pass also checks the peak on this many request-
                                        # bootstrap resamples of the youngest window
                                        # (`history.resample_loads`); docs/drift.md
                                        # "Resampled scenarios while the history is young"
    replica_resamples: int = 0          # the resamples one update's replica pass checks (the
                                        # replay sets it from `young_resamples` on those)
    resample_slack: bool = True         # the young resamples' cap: the replica pass's target
                                        # + `History.slack` (the budget over the fit cap;
                                        # False: the target, as the windows'); the locality
                                        # guard's resamples always get the target's
    locality_resamples: int = 0         # with `ReplicaPass.locality`: every update's replica
                                        # pass checks this many resamples too, so a retarget
                                        # chosen for locality cannot raise the peak on them
    replica_scenarios: str = "windows"  # sempar-incremental's replica pass checks the peak on
                                        # each history window's total ("windows") or on each
                                        # dispatch batch of them ("batches": what a per-batch
                                        # dispatch such as lp-cap balances)
    engine: str = "vllm"                # sempar-engine: the balancer it is plugged into
    plugin: tuple[tuple[str, str], ...] = ()   # sempar-engine: PluginConfig knobs (field, value),
                                        # read as the plug-in reads SEMPAR_EPLB_<FIELD> (none:
                                        # the plug-in's defaults in `engine`)
    passes_per_step: int = 1000         # forward passes one replay step stands for

    def __post_init__(self) -> None:
        if min(self.ep, self.every, self.window, self.passes_per_step) < 1:
            raise InputError(f"replay: ep {self.ep} / every {self.every} / window {self.window} "
                             f"/ passes per step {self.passes_per_step} must be >= 1")
        if min(self.young_resamples, self.replica_resamples, self.locality_resamples) < 0:
            raise InputError(f"replay: resamples {self.young_resamples} / "
                             f"{self.replica_resamples} / {self.locality_resamples} must be >= 0")
        if self.replica_scenarios not in ("windows", "batches"):
            raise InputError(f"replay: replica scenarios {self.replica_scenarios!r}: "
                             "windows or batches")

    @property
    def redundant(self) -> int:
        """Replica slots per layer every policy gets (R)."""
        return self.solve.redundant

    def span(self, policy) -> int:
        """Requests `policy`'s update sees: the window, and the history where it keeps one."""
        return self.history.span(self.window) if policy.history else self.window

    @classmethod
    def for_model(cls, model: str, ep: int, *, solve: SolveOptions | None = None,
                  rebalance: dict | None = None, **knobs) -> "ReplayConfig":
        """The config of a replay of `model` at EP `ep`: `solve` (None: `SolveOptions(jobs=1)`),
        `rebalance` (`rebalance_config`'s knobs; its bound defaults to the solves' fit cap, so
        every policy of the replay fits the same cap), the other `knobs` as given."""
        solve = solve or SolveOptions(jobs=1)
        rb = dict(rebalance or {})
        if rb.get("max_imbalance") is None:
            rb["max_imbalance"] = solve.max_imbalance
        knobs = {k: v for k, v in knobs.items() if v is not None}
        return cls(ep=ep, solve=solve, rebalance=rebalance_config(model, **rb), **knobs)

    def with_(self, **changes) -> "ReplayConfig":
        """A copy with `changes` (dataclasses.replace)."""
        return replace(self, **changes)
