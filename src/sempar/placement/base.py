"""One `solve()` interface for every placement method, and the registry that names them.

A solver maps routing statistics of a fit trace to a `Placement`:

    solve(method, trace, *, num_devices=G, options=SolveOptions(...)) -> Placement

`options` (`placement.options.SolveOptions`: mode, load cap, replicas, nodes, seed, objective,
...) is the user's choice, passed whole; `mode` and `max_imbalance` are read by the solvers that
use them (`sempar`); the others ignore them. `preserve_groups` (DeepSeek-V3 style expert groups, `trace.meta.num_expert_groups`):
expert e may only sit in a physical slot of its own group's range, group g = experts and slots
[g N / ng, (g + 1) N / ng), so that a checkpoint can be permuted within groups.

Each method lives in its own module and registers itself in `SOLVERS` with its capabilities
(`SolverSpec`): whether it places replicas, preserves expert groups, solves differently per
mode, which modes it serves, and whether it needs token ids. `solve` refuses what a solver does
not declare, with one line, before running it; the CLI, the reports and the benchmarks list the
same set from `SOLVERS`.

Token ids: a solver whose placement is built from a token -> expert table (it co-clusters
tokens and experts, and its token table places eval tokens) declares `needs_token_ids` (True,
or the modes that do); `solve` refuses it on a trace without token ids
(`TraceMeta.has_token_ids`), and drops the token table any other solver built from such a
trace (one meaningless token), so its homes are the vanilla ones (`info["token_table_dropped"]`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from sempar.errors import InputError
from sempar.solve_options import SolveOptions
from sempar.placement.placement import (Placement, RequestClusters, contiguous_nodes,
                                        cross_group_slots)
from sempar.predict.token_table import TokenTable
from sempar.registry import Registry
from sempar.trace.schema import RoutingTrace, require_token_ids


@dataclass(frozen=True)
class PlacementProblem(SolveOptions):
    """What every solver is given: the fit trace, the device count and the user's options
    (`SolveOptions`' fields, keyword-only: `PlacementProblem(trace, G, mode="dp")`)."""

    trace: RoutingTrace
    num_devices: int

    @classmethod
    def of(cls, trace: RoutingTrace, num_devices: int,
           options: SolveOptions | None = None) -> "PlacementProblem":
        """The problem of solving `trace` on `num_devices` devices with `options`."""
        return cls(trace, num_devices, **(options or SolveOptions()).knobs())

    def __post_init__(self) -> None:
        super().__post_init__()
        N, G = self.trace.meta.num_experts, self.num_devices
        if G < 1 or G > N:
            raise InputError(f"--ep: {G} devices for {N} experts (need 1..{N})")
        if (N + self.redundant) % G:
            raise InputError(f"--redundant: {N} experts + {self.redundant} replicas do not split "
                             f"evenly over {G} devices")
        contiguous_nodes(G, self.num_nodes)

    @property
    def slots_per_device(self) -> int:
        return (self.trace.meta.num_experts + self.redundant) // self.num_devices

    def node_of(self) -> np.ndarray:
        return contiguous_nodes(self.num_devices, self.num_nodes)

    def expert_load(self) -> np.ndarray:
        """int64[L, N]: token-expert activations per layer in the fit trace."""
        L, N = self.trace.meta.num_layers, self.trace.meta.num_experts
        # One layer at a time: a [T, L, k] int64 key would be 7.4 GB at DeepSeek-V3 / 2M tokens.
        return np.stack([np.bincount(self.trace.experts[:, l].ravel().astype(np.int64), minlength=N)
                         for l in range(L)]).reshape(L, N)


def slot_groups(p: PlacementProblem) -> tuple[np.ndarray, np.ndarray]:
    """(slot group int64[G, S0], expert group int64[N]) with S0 = N / G primary slots: the
    expert group each slot range belongs to under `preserve_groups`, all zeros without it."""
    N, G = p.trace.meta.num_experts, p.num_devices
    ng = p.trace.meta.num_expert_groups if p.preserve_groups else 1
    group = np.arange(N) // (N // ng)
    return group.reshape(G, N // G), group


def crosses_groups(placement: Placement, num_groups: int) -> str | None:
    """Where `placement` puts an expert in another group's slot range, in words, else None."""
    bad = cross_group_slots(placement, num_groups)
    if not bad.any():
        return None
    l, s = (int(i) for i in np.argwhere(bad)[0])
    size = placement.num_experts // num_groups
    return (f"layer {l}: expert {int(placement.phy2log[l, s])} sits in slot {s} of group "
            f"{s // size}")


def token_table_row(stats, l: int, expert_device: np.ndarray, G: int,
                    token_device: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(device int16[U], confidence float32[U]): layer l's token table row of a co-clustering
    solver (`coclustered_placement`'s rule). expert_device int[N]; token_device int[U] or None."""
    share = stats.device_share(l, expert_device, G)                          # [U, G]
    best = share.argmax(axis=1)
    if token_device is not None:
        best = np.where(token_device >= 0, token_device, best)
    return best.astype(np.int16), share[np.arange(stats.U), best].astype(np.float32)


def coclustered_placement(p: PlacementProblem, name: str, expert_device: np.ndarray,
                          stats, token_device: np.ndarray | None = None,
                          info: dict | None = None, rows: list | None = None,
                          request_cluster: RequestClusters | None = None) -> Placement:
    """The placement and token table of a co-clustering solver.

    expert_device int[L, N]: device of each expert (N/G each); stats: the fit trace's
    `affinity.affinity_stats.AffinityStats` (tokens, per-layer counts); token_device int[L, U]: the
    solver's token clusters, where -1 (or token_device None for all) sends the token where most
    of its expected activations land (lowest device on ties). The table's confidence is the
    share of the token's expected activations on its device. Built one layer at a time from the
    counts (ours: the dense [L, U, N] einsum did not fit in memory at DeepSeek-V3's shape), or
    given: rows, each layer's `token_table_row` (a solver that computed them with the layer).
    request_cluster: the solver's request clusters (dp mode), or None.
    """
    L, N = expert_device.shape
    G = p.num_devices
    if rows is None:
        rows = [token_table_row(stats, l, expert_device[l], G,
                                None if token_device is None else token_device[l])
                for l in range(L)]
    device = np.stack([r[0] for r in rows])                                   # int16[L, U]
    conf = np.stack([r[1] for r in rows])                                     # float32[L, U]
    phy2log = np.stack([np.argsort(expert_device[l], kind="stable") for l in range(L)])
    return Placement(phy2log, N, G, p.node_of(), name, info=dict(info or {}),
                     token_table=TokenTable(stats.tokens, device, conf),
                     request_cluster=request_cluster)


class Solver(Protocol):
    def __call__(self, problem: PlacementProblem) -> Placement: ...


@dataclass(frozen=True)
class SolverSpec:
    """A registered solver and its declared capabilities.

    replicas: places `redundant` extra slots by its own rule (else it places each expert once);
    preserves_groups: honours `preserve_groups`; mode_aware: its placement depends on `mode`
    (`evaluate` solves it once per mode, the others once for all); modes: the modes it serves;
    extends: the registered method whose finished placement of the same problem it starts from
    (its function then also takes it as keyword `base`: `evaluate`, having solved that method,
    hands it over instead of the solver solving it again), else None.
    """

    fn: Solver
    replicas: bool
    preserves_groups: bool
    mode_aware: bool
    modes: tuple[str, ...] = ("tp", "dp")
    needs_token_ids: bool | tuple[str, ...] = False   # True, or the modes that need them
    extends: str | None = None

    def refusal(self, method: str, trace: RoutingTrace, *, redundant: int = 0, mode: str = "tp",
                preserve_groups: bool = False) -> str | None:
        """The one-line reason `method` cannot serve this request, else None."""
        ng = trace.meta.num_expert_groups
        if redundant and not self.replicas:
            return f"--redundant {redundant}: {method} places every expert once (no replicas)"
        if preserve_groups and ng > 1 and not self.preserves_groups:
            return (f"{method}: --preserve-groups is not supported (it moves experts across "
                    f"the model's {ng} expert groups); use sempar or vanilla")
        if mode not in self.modes:
            return f"--mode {mode}: {method} serves only {', '.join(self.modes)}"
        return None


class SolverRegistry(Registry[SolverSpec]):
    """`Registry` of `SolverSpec`s; `register` takes the capabilities beside the name and
    returns the solver function itself, so modules can still call it directly."""

    def register(self, name: str, *, replicas: bool,  # type: ignore[override]
                 preserves_groups: bool, mode_aware: bool,
                 modes: tuple[str, ...] = ("tp", "dp"),
                 needs_token_ids: bool | tuple[str, ...] = False,
                 extends: str | None = None) -> Callable[[Solver], Solver]:
        def deco(fn: Solver) -> Solver:
            self.add(name, SolverSpec(fn, replicas, preserves_groups, mode_aware, tuple(modes),
                                      needs_token_ids, extends))
            return fn

        return deco


SOLVERS = SolverRegistry("placement method")


def needs_token_ids(method: str, mode: str, registry: SolverRegistry = SOLVERS) -> bool:
    """Whether `method` in `mode` needs token ids (its declared `needs_token_ids`)."""
    need = registry.get(method).needs_token_ids
    return mode in need if isinstance(need, tuple) else bool(need)


def check_token_ids(method: str, mode: str, trace: RoutingTrace, hint: bool = True,
                    registry: SolverRegistry = SOLVERS) -> None:
    """Bad input when `method` in `mode` needs token ids and `trace` has none (`hint`: the
    message lists the methods that do not)."""
    if needs_token_ids(method, mode, registry):
        modes = registry.get(method).needs_token_ids
        free = [m for m in registry.names() if m != "oracle"
                and not needs_token_ids(m, mode, registry)]
        require_token_ids(trace.meta, f"{method}{f' in {mode} mode' if isinstance(modes, tuple) else ''}",
                          f"; methods without: {', '.join(free)}" if hint else "")


def solve(method: str, trace: RoutingTrace, *, num_devices: int,
          options: SolveOptions | None = None, registry: SolverRegistry = SOLVERS,
          **knobs) -> Placement:
    """Run the registered `method` on `trace` over `num_devices` devices with the user's
    `options` (None: `SolveOptions()`'s defaults) and return its validated placement.

    `knobs`: `SolveOptions` fields set over `options` for this call (`mode="dp"`); `registry`:
    where `method` is looked up. A request the solver does not declare it can serve
    (`SolverSpec.refusal`) is refused before it runs."""
    options = options or SolveOptions()
    if knobs:
        options = dataclasses.replace(options, **knobs)
    return solve_problem(method, PlacementProblem.of(trace, num_devices, options),
                         registry=registry)


def solve_problem(method: str, problem: PlacementProblem,
                  solver: Callable[[PlacementProblem], Placement] | None = None, *,
                  registry: SolverRegistry = SOLVERS) -> Placement:
    """`solve`'s placement of `problem` by `method`: the declared capabilities checked, then
    `solver` (None: the registered one; a solver's own entry point passes itself with
    non-default settings), then what every placement gets: devices relabelled onto nodes, the
    method's name, the group check, the model's layout, validation."""
    spec = registry.get(method)
    trace, num_nodes, preserve_groups = problem.trace, problem.num_nodes, problem.preserve_groups
    why = spec.refusal(method, trace, redundant=problem.redundant, mode=problem.mode,
                       preserve_groups=preserve_groups)
    if why:
        raise InputError(why)
    check_token_ids(method, problem.mode, trace, registry=registry)
    ng = trace.meta.num_expert_groups
    placement = (solver or spec.fn)(problem)
    if not trace.meta.has_token_ids and placement.token_table is not None:
        placement.token_table = None
        placement.info["token_table_dropped"] = "the fit trace has no token ids"
    if num_nodes > 1 and placement.token_table is not None and not placement.info.get("node_aware") \
            and not preserve_groups:       # relabelling devices would move experts across groups
        # A co-clustering solver's device labels are arbitrary: pick them so that devices whose
        # experts the same tokens activate share a node (nodes.py).
        from sempar.placement.nodes import device_affinity, group_devices, relabel_devices

        perm = group_devices(device_affinity(placement, trace.experts, problem.seed), num_nodes)
        placement = relabel_devices(placement, perm)
    placement.method = method
    if preserve_groups:
        where = crosses_groups(placement, ng)
        if where:
            raise InputError(f"{method}: --preserve-groups violated ({where})")
        placement.info["preserve_groups"] = True
    placement.info.setdefault("model", trace.meta.model)
    for key, value in trace.meta.layout().items():  # the model's layer numbering, for exports
        placement.info.setdefault(key, value)
    return placement.validate()
