"""`SolveOptions`: the user-level options of a placement solve, one frozen object passed whole.

Every verb that solves placements (`place`, `evaluate` and its cross-dataset matrix, the serving
forecast behind `serve-sim` / `plan`, the bench, the demo) builds one `SolveOptions` from its
command line (`commands._options.solve_options`) and hands it on unchanged, the way
Megatron-core passes its `TransformerConfig` whole instead of field by field, so that a knob
added here reaches every solver, and each knob's default lives here once:

    SolveOptions(mode="dp", max_imbalance=1.2, redundant=4)  -> base.solve(..., options=...)

`placement.base.PlacementProblem` is these options plus the fit trace and the device count. The
solver-internal knobs of `sempar` (rounds, restarts, sample sizes) are not user options: they
live in `placement/sempar/config.py`'s `SemparConfig`. A shared module beside `bounds.py` (it
imports nothing of the placement package), so that the command line can declare each option with
its default from here without loading the solvers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sempar.errors import InputError, check_choice
from sempar.registry import Registry

MODES = ("dp", "tp")                       # the attention mode a placement serves
OBJECTIVES = ("auto", "tokens", "rows")    # sempar's items (placement/sempar/rows.py)


@dataclass(frozen=True)
class HomeRule:
    """How the deployment will choose each token's home device, and the objective of `sempar`
    that serves it (`objective`: "rows" or "tokens", placement/sempar/rows.py)."""

    objective: str
    description: str


HOME_RULES: Registry[HomeRule] = Registry("home rule")
HOME_RULES.add("positions", HomeRule(
    "rows", "position homes, de-duplicated dispatch (sglang-ep, attn-dp, ds-moe): a token stays "
    "on its request's DP rank or its batch chunk; what counts is how few devices the experts "
    "one token selects together span"))
HOME_RULES.add("exact", HomeRule(
    "rows", "exact pre-routing (smoe-exact, Sem-MoE Alg. 3): each token homed knowing its real "
    "experts, on the device hosting most of them"))
HOME_RULES.add("table", HomeRule(
    "tokens", "homes predicted from the placement's token table (smoe's re-batching, "
    "Attention-DP's expert-aware request policies): what counts is which experts a token id "
    "activates on average"))
# The command line's `--homes` (place, evaluate): `sglang-ep`'s position homes, the pipeline
# `sempar plan` recommends most often. A library call that names no rule (`homes=None`) keeps
# the trace's own choice (`items`).
DEFAULT_HOMES = "positions"


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """What the user chose for a placement solve (checked on construction, one line each).

    mode: the attention mode the placement serves, "tp" or "dp" (mode-aware solvers);
    max_imbalance: per-layer device load cap, x the mean (solvers that take it);
    redundant: extra physical slots per layer (replicas), spread over the devices;
    num_nodes: nodes the devices are grouped into (contiguous device ranges);
    seed: every random choice of the solvers;
    preserve_groups: expert e stays in its expert group's slot range (DeepSeek-V3 groups);
    homes: how the deployment will choose homes (`HOME_RULES`: positions, exact, table), or
        None when the caller does not say (the command line always does: `DEFAULT_HOMES`);
    objective: sempar's items, "tokens" (token ids), "rows" (fit rows) or "auto": the home
        rule's objective ("rows" on a trace without token ids), see `items`;
    held_out_imbalance: the held-out imbalance sempar's rows objective aims at;
    jobs: worker processes for per-layer work (None: the usable CPUs);
    effort: x the work budget of sempar's rows objective (`SemparConfig.work_budget`: the fit
        rows solved and the restarts are cut to it on large models; more buys both back).
    """

    mode: str = "tp"
    max_imbalance: float = 1.05
    redundant: int = 0
    num_nodes: int = 1
    seed: int = 0
    preserve_groups: bool = False
    homes: str | None = None
    objective: str = "auto"
    held_out_imbalance: float = 1.10
    jobs: int | None = None
    effort: float = 1.0

    def __post_init__(self) -> None:
        check_choice("--mode", self.mode, MODES)
        check_choice("--objective", self.objective, OBJECTIVES)
        if self.homes is not None:
            check_choice("--homes", self.homes, HOME_RULES.names())
        if not 1.0 <= self.held_out_imbalance < 100:
            raise InputError(f"--held-out-imbalance: {self.held_out_imbalance} is not in [1, 100)")
        if not 1.0 <= self.max_imbalance < 100:
            raise InputError(f"--max-imbalance: {self.max_imbalance} is not in [1, 100)")
        if self.jobs is not None and self.jobs < 1:
            raise InputError(f"--jobs: {self.jobs} is not a positive number of processes")
        if not 0 < self.effort <= 1000:
            raise InputError(f"--effort: {self.effort} is not in (0, 1000]")
        if self.redundant < 0:
            raise InputError(f"--redundant: {self.redundant} is negative")

    def items(self, has_token_ids: bool) -> str:
        """The objective `sempar` solves on, "tokens" or "rows": the one named, or for `auto`
        the home rule's (rows for position and exact homes, tokens for token-table homes; with
        no rule named, tokens: the co-clustering solver), rows on a trace without token ids
        (`rows.resolve_objective` refuses "tokens" named there)."""
        if self.objective != "auto":
            return self.objective
        if not has_token_ids:
            return "rows"
        return "tokens" if self.homes is None else HOME_RULES.get(self.homes).objective

    def knobs(self) -> dict:
        """{field: value} of these options alone (a `PlacementProblem`'s without its trace and
        devices)."""
        return {f.name: getattr(self, f.name) for f in fields(SolveOptions)}

    def solve_options(self) -> "SolveOptions":
        """These options alone (from a `PlacementProblem`: what to pass on to another solve)."""
        return SolveOptions(**self.knobs())
