"""Dispatch rules: which copy of a replicated expert serves each activation (issue 45, item 2).

A placement with redundant slots (`Placement.redundant` > 0) hosts some logical experts on
several devices; the engine's dispatch picks, per activation, the physical copy that serves it,
and with it the device load and the locality the placement delivers. Every rule is registered
once in `DISPATCH` with its capabilities (`DispatchRule`), so `evaluate`, `replay`,
`serve-sim`, the export and the benchmarks list the same set:

- `nearest`: `placement.serving`'s rule (home, else a host on home's node, else the lowest
  host id); the evaluator's figures before this module, kept in its one home (`serving.table`).
- `sglang-static`: SGLang 0.5.23 `--ep-dispatch-algorithm static`
  (`sglang/srt/eplb/expert_location.py`, `compute_logical_to_rank_dispatch_physical_map`): a
  fixed copy per (rank, expert): the rank's own copy, else a copy on its node when that narrows
  the set, else the copies shared out evenly over the remaining ranks at random (seeded).
- `sglang-dynamic`: `--ep-dispatch-algorithm dynamic` (`expert_location_dispatch.py`, with an
  all-to-all backend): each activation picks a copy uniformly at random.
- `vllm-hash`: vLLM 0.33.0's EPLB mapping (`fused_moe/router/base_router.py`): copy
  `(row * 2654435769 mod 2^32) mod copies` of the expert's copies in physical-slot order, row the
  token's row in its rank's batch (here: its row among the batch's tokens homed on its device).
- `locality-first` (ours): per batch, an activation whose home device hosts the expert stays
  home; the others go, expert by expert (most activations first), to the copies that keep their
  devices' batch load lowest (integer water-filling; ties to the lower device id).
- `lp` (after LPLB, deepseek-ai/LPLB: per-batch linear program over the replicas' edges):
  per batch the split of each replicated expert's activations over its copies that minimises
  the most loaded device (scipy HiGHS), rounded by largest remainder; each copy's share is
  filled with the activations homed on its device first.
- `lp-local` (ours, beside `lp`): the same LP with a second objective, the most activations
  served on their home device among the splits of minimal peak (lexicographic by a small
  weight).
- `lp-cap` (ours, beside `lp`): the same LP with the peak bounded at `LP_CAP` x the batch's mean
  load instead of minimised: the least excess over the bound first, then the most activations
  on their home device (`placement.dispatch_lp`).

Shapes: T tokens, k selected experts per token, G devices, P = G * S physical slots, N logical
experts. All rules take one layer: experts int[T, k] (logical ids), home int[T] (device of
each token), phy2log int[P] (the layer's physical -> logical map; device g owns slots
[g * S, (g + 1) * S)), G, batch int[T] (a batch id per token: activations of one batch are
dispatched together), node_of int[G], and a `numpy.random.Generator` (used by the random
rules only), and return int64[T, k]: the device serving each activation, always a host of
its expert.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from sempar.placement import serving
from sempar.placement.dispatch_lp import lp_chooser
from sempar.registry import Registry

DispatchFn = Callable[[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray, np.ndarray,
                       np.random.Generator], np.ndarray]
DEFAULT_DISPATCH = "nearest"
KNUTH = 2654435769          # vLLM's multiplicative hash (floor(2^32 / golden ratio))
LOCAL_WEIGHT = 1e-4         # lp-local: weight of a home-served activation against the peak
LP_CAP = 1.05               # lp-cap: the device load bound, x the batch mean, it keeps first


@dataclass(frozen=True)
class DispatchRule:
    """A registered dispatch rule and its capabilities.

    per_batch: reads the batch ids (its choice depends on the batch's other tokens);
    locality: an activation whose home device hosts the expert is always served there;
    balances: chooses copies from the batch's device loads; random: draws from the generator;
    engines: engine name -> the launch flags that run exactly this rule (absent: no engine flag
    runs it; `engine_flags` names the closest one); source: where the rule comes from.
    """

    fn: DispatchFn
    per_batch: bool
    locality: bool
    balances: bool
    random: bool
    help: str
    source: str
    engines: dict[str, tuple[str, ...]] = field(default_factory=dict)


DISPATCH: Registry[DispatchRule] = Registry("dispatch rule")


def _rule(name: str, help: str, source: str, *, per_batch: bool = False,
          locality: bool = False, balances: bool = False, random: bool = False,
          engines: dict[str, tuple[str, ...]] | None = None) -> Callable[[DispatchFn], DispatchFn]:
    """Register the decorated function as rule `name` with its capabilities (`DispatchRule`)."""
    def deco(fn: DispatchFn) -> DispatchFn:
        DISPATCH.add(name, DispatchRule(fn, per_batch, locality, balances, random, help, source,
                                        dict(engines or {})))
        return fn
    return deco


# ---------------------------------------------------------------- the layer's copies

def _layout(phy2log: np.ndarray, G: int, N: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hosts bool[G, N], copies int64[N, C] devices of each expert's copies in physical-slot
    order padded with -1, count int64[N])."""
    phy2log = np.asarray(phy2log, np.int64)
    S = phy2log.size // G
    dev = np.arange(phy2log.size) // S
    hosts = np.zeros((G, N), bool)
    hosts[dev, phy2log] = True
    count = np.bincount(phy2log, minlength=N)
    order = np.argsort(phy2log, kind="stable")             # by expert, then physical slot
    e = phy2log[order]
    rank = np.arange(e.size) - np.searchsorted(e, e, side="left")
    copies = np.full((N, int(count.max())), -1, np.int64)
    copies[e, rank] = dev[order]
    return hosts, copies, count


def _num_experts(experts: np.ndarray, phy2log: np.ndarray) -> int:
    return int(max(np.max(phy2log), np.max(experts, initial=-1))) + 1


def _rows_in_group(group: np.ndarray) -> np.ndarray:
    """int64[T]: each token's row among the tokens with the same group key, in token order."""
    order = np.argsort(group, kind="stable")
    g = group[order]
    row = np.empty(group.size, np.int64)
    row[order] = np.arange(g.size) - np.searchsorted(g, g, side="left")
    return row


# ---------------------------------------------------------------- rules

@_rule("nearest", "home copy, else one on home's node, else the lowest host id "
      "(placement.serving)", "sempar placement.serving", locality=True)
def _nearest(experts, home, phy2log, G, batch, node_of, rng):
    hosts = _layout(phy2log, G, _num_experts(experts, phy2log))[0]
    return serving.serve(serving.table(hosts, serving.node_order(node_of)), home, experts)


def sglang_static_table(phy2log: np.ndarray, G: int, N: int, node_of: np.ndarray,
                        rng: np.random.Generator) -> np.ndarray:
    """int64[G, N]: SGLang's static dispatch table of one layer (see the module docstring)."""
    hosts, copies, count = _layout(phy2log, G, N)
    node_of = np.asarray(node_of)
    tab = np.full((G, N), -1, np.int64)
    for e in range(N):
        cand = copies[e, :count[e]]
        if cand.size == 1:
            tab[:, e] = cand[0]
            continue
        left = []
        for g in range(G):
            if hosts[g, e]:
                tab[g, e] = g
                continue
            same = cand[node_of[cand] == node_of[g]]
            if 0 < same.size < cand.size:        # the node narrows the set
                tab[g, e] = same[0]
            else:
                left.append(g)
        if left:                                  # even shares, remainder at random, shuffled
            q, r = divmod(len(left), cand.size)
            pick = np.concatenate([np.tile(cand, q), rng.choice(cand, r, replace=False)])
            tab[left, e] = rng.permutation(pick)
    return tab


@_rule("sglang-static", "fixed copy per (rank, expert): own, else same node, else spread "
      "evenly at random", "SGLang --ep-dispatch-algorithm static", locality=True, random=True,
      engines={"sglang": ("--ep-dispatch-algorithm", "static")})
def _sglang_static(experts, home, phy2log, G, batch, node_of, rng):
    tab = sglang_static_table(phy2log, G, _num_experts(experts, phy2log), node_of, rng)
    return tab[np.asarray(home)[:, None], experts]


@_rule("sglang-dynamic", "each activation a copy uniformly at random",
      "SGLang --ep-dispatch-algorithm dynamic", random=True,
      engines={"sglang": ("--ep-dispatch-algorithm", "dynamic")})
def _sglang_dynamic(experts, home, phy2log, G, batch, node_of, rng):
    _, copies, count = _layout(phy2log, G, _num_experts(experts, phy2log))
    pick = rng.integers(0, 65536, experts.shape) % count[experts]
    return copies[experts, pick]


@_rule("vllm-hash", "copy chosen by a multiplicative hash of the token's row in its batch",
      "vLLM EPLB (fused_moe router)", per_batch=True, engines={"vllm": ("--enable-eplb",)})
def _vllm_hash(experts, home, phy2log, G, batch, node_of, rng):
    _, copies, count = _layout(phy2log, G, _num_experts(experts, phy2log))
    home = np.asarray(home, np.int64)
    row = _rows_in_group(np.asarray(batch, np.int64) * G + home)
    pick = ((row * KNUTH) & 0xFFFFFFFF)[:, None] % count[experts]
    return copies[experts, pick]


def water_fill(load: np.ndarray, n: int) -> np.ndarray:
    """int64[m]: n units added to bins with `load` float[m] so that the largest is lowest
    (each unit on the currently least loaded bin; ties to the lower index)."""
    load = np.asarray(load, np.float64)
    m = load.size
    if n <= 0 or m == 0:
        return np.zeros(m, np.int64)
    srt = np.sort(load)
    # the level where the first j bins absorb n units: (n + sum of their loads) / j
    level = (n + np.cumsum(srt)) / np.arange(1, m + 1)
    j = int(np.nonzero(level >= srt)[0].max()) + 1 if m else 0
    lev = np.floor(level[j - 1])
    add = np.maximum(lev - load, 0).astype(np.int64)
    add = np.where(load <= lev, add, 0)
    rest = n - int(add.sum())
    if rest > 0:            # the units left raise the lowest bins at the level, lower ids first
        at = np.nonzero(load + add == lev)[0]
        add[at[:rest]] += 1
    return add


def _split(experts, home, phy2log, G, batch, node_of):
    """The shared first step of the per-batch rules: (served int64[T, k] with -1 where a copy is
    still to be chosen, copies, count, hosts): home copies and single-copy experts fixed."""
    N = _num_experts(experts, phy2log)
    hosts, copies, count = _layout(phy2log, G, N)
    home = np.asarray(home, np.int64)
    local = hosts[home[:, None], experts]
    served = np.where(local, home[:, None], np.where(count[experts] == 1,
                                                     copies[experts, 0], -1))
    return served, copies, count, hosts


def _batches(batch: np.ndarray):
    """(batch id, token indices) of every batch, in id order."""
    batch = np.asarray(batch)
    order = np.argsort(batch, kind="stable")
    b = batch[order]
    cut = np.nonzero(np.diff(b))[0] + 1
    return zip(b[np.r_[0, cut]] if b.size else [], np.split(order, cut))


@_rule("locality-first", "home copy, else the copy keeping its device's batch load lowest",
      "sempar (issue 45)", per_batch=True, locality=True, balances=True)
def _locality_first(experts, home, phy2log, G, batch, node_of, rng):
    served, copies, count, _ = _split(experts, home, phy2log, G, batch, node_of)

    def choose(tok: np.ndarray, open_: np.ndarray, load: np.ndarray) -> np.ndarray:
        ex = experts[tok][open_]
        todo = np.bincount(ex)
        fill = np.full(ex.size, -1, np.int64)
        for e in np.argsort(-todo, kind="stable")[:np.count_nonzero(todo)]:
            devs = copies[e, :count[e]]
            add = water_fill(load[devs], int(todo[e]))
            load[devs] += add
            fill[ex == e] = np.repeat(devs, add)
        return fill
    return _per_batch(served, batch, G, choose)


def _per_batch(served: np.ndarray, batch: np.ndarray, G: int, choose) -> np.ndarray:
    """served int64[T, k] with its open entries (-1) filled batch by batch: choose(token
    indices int[n], open bool[n, k], the batch's fixed load float[G]) -> devices of the open
    entries (row-major order)."""
    for _, tok in _batches(batch):
        s = served[tok]
        open_ = s < 0
        if open_.any():
            s[open_] = choose(tok, open_, np.bincount(s[~open_], minlength=G).astype(np.float64))
            served[tok] = s
    return served


def _lp_split(experts, home, phy2log, G, batch, node_of, local_weight: float,
              cap: float | None = None):
    """`lp` / `lp-local` / `lp-cap`: the per-batch LP (`placement.dispatch_lp`) over every
    replicated expert's activations; single-copy experts are served where they live."""
    N = _num_experts(experts, phy2log)
    _, copies, count = _layout(phy2log, G, N)
    served = np.where(count[experts] == 1, copies[experts, 0], -1)
    choose = lp_chooser(experts, np.asarray(home, np.int64), copies, count, G, local_weight, cap)
    return _per_batch(served, batch, G, choose)


@_rule("lp", "per-batch LP minimising the peak device load over the copies (after LPLB)",
      "LPLB (deepseek-ai/LPLB); SGLang --ep-dispatch-algorithm lp", per_batch=True,
      balances=True, engines={"sglang": ("--ep-dispatch-algorithm", "lp")})
def _lp(experts, home, phy2log, G, batch, node_of, rng):
    return _lp_split(experts, home, phy2log, G, batch, node_of, 0.0)


@_rule("lp-local", "lp, then the most activations served on their home device",
      "sempar (issue 45), after LPLB", per_batch=True, balances=True)
def _lp_local(experts, home, phy2log, G, batch, node_of, rng):
    return _lp_split(experts, home, phy2log, G, batch, node_of, LOCAL_WEIGHT)


@_rule("lp-cap", f"per-batch LP: every device within {LP_CAP} x the batch mean where the copies "
      "allow, then the most activations served on their home device",
      "sempar (issue 45), after LPLB", per_batch=True, balances=True)
def _lp_cap(experts, home, phy2log, G, batch, node_of, rng):
    return _lp_split(experts, home, phy2log, G, batch, node_of, 0.0, LP_CAP)


def dispatch(rule: str, experts: np.ndarray, home: np.ndarray, phy2log: np.ndarray, G: int,
             batch: np.ndarray | None = None, node_of: np.ndarray | None = None,
             seed: int = 0, rng: np.random.Generator | None = None) -> np.ndarray:
    """int64[T, k]: the device serving each activation of one layer under `rule`.

    experts int[T, k] logical ids; home int[T] each token's device; phy2log int[P] (P = G * S);
    batch int[T] batch id per token (None: one batch); node_of int[G] (None: one node);
    seed: the random rules' generator when `rng` is None."""
    spec = DISPATCH.get(rule)
    experts = np.asarray(experts, np.int64)
    home = np.asarray(home, np.int64)
    if batch is None:
        batch = np.zeros(home.size, np.int64)
    if node_of is None:
        node_of = np.zeros(G, np.int64)
    if rng is None:
        rng = np.random.default_rng(seed)
    return spec.fn(experts, home, np.asarray(phy2log), int(G), np.asarray(batch),
                   np.asarray(node_of), rng)


def dispatch_all(placement, experts: np.ndarray, home: np.ndarray, rule: str = DEFAULT_DISPATCH,
                 batch: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """int32[T, L, k]: `dispatch` of every layer of `placement` (a `Placement`); experts
    int[T, L, k], home int[T, L], batch int[T] (None: one batch). One generator runs through the
    layers, as the engines' tables are drawn once for the model."""
    rng = np.random.default_rng(seed)
    out = np.empty(np.shape(experts), np.int32)
    for l in range(out.shape[1]):
        out[:, l] = dispatch(rule, experts[:, l], home[:, l], placement.phy2log[l],
                             placement.num_devices, batch, placement.node_of, rng=rng)
    return out


def engine_flags(rule: str, engine: str) -> tuple[tuple[str, ...], str | None]:
    """(flags, note): the launch flags that make `engine` dispatch as `rule`, and a one-line note
    when no flag runs exactly `rule` (the flags then give the engine's closest rule)."""
    spec = DISPATCH.get(rule)
    if engine in spec.engines:
        return spec.engines[engine], None
    closest = {"sglang": ("--ep-dispatch-algorithm", "static" if spec.locality else
                          ("lp" if spec.balances else "dynamic")),
               "vllm": ("--enable-eplb",)}.get(engine, ())
    return closest, (f"{engine} has no dispatch rule {rule!r}; "
                     + (f"closest: {' '.join(closest)}" if closest else "no dispatch flag"))
