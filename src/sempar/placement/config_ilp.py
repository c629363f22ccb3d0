"""The integer device-configuration program: the bound of `device_bound` without its second
relaxation, solved as a MILP, and its optimal partition as a placement candidate.

`device_bound.config_bound` bounds the capacity-bound exact-home LAR of any placement at one
layer in two relaxations (its docstring): (1) each device counts its own best rows alone,
V(D) = sum over tp batches of the ceil(n_b / G) largest |S_t ∩ D|, so a placement's figure is
<= sum_d V(D_d); (2) the max over partitions of sum_d V(D_d) is relaxed to an LP over every
S-subset D. Here step 2 is kept integer (ours: the Dantzig-Wolfe / set-partitioning form of
the same program, as in column-based formulations of capacitated clustering and of graph
partitioning):

    max  sum_D V(D) x_D   s.t.  sum_{D ∋ e} x_D = 1 for every expert e,  x_D in {0, 1},

over the S-subsets D whose load (activations at this layer) is at most max_imbalance x the
mean (a placement within that balance uses only such sets). Its optimum is an upper bound on
every such placement's figure; where HiGHS (scipy.optimize.milp) stops at the time limit its
dual bound is one too (the MILP's own gap is reported). The LP bound is kept where lower
(`device_bound`'s Lagrangian form does not rest on HiGHS's tolerances; both are upper bounds).

On real routing step 1 is where the bound's slack lies, not step 2: at GPT-OSS-20B EP 8 the
MILP is 0.0-0.6 % below the LP per layer, 0.4557 against 0.4572 over the 24 layers
(docs/placement.md). Its optimal partition is still a good start: `exact.py` (`sempar-exact`)
evaluates it with the real, coupled figure.

Runs where C(N, N / G) sets can be listed (`ConfigIlpConfig.max_device_sets`: GPT-OSS-20B at
EP 8, C(32, 4) = 35,960; not C(32, 8) = 10.5M at EP 4).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from math import comb
from typing import Callable

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import csr_matrix

from sempar.placement.capacity import BATCH, SEARCH_ASSIGN, capacity_home
from sempar.placement.device_bound import device_sets, device_values
from sempar.placement.metrics import peak_ratio


@dataclass(frozen=True)
class ConfigIlpConfig:
    """Knobs of the integer configuration program.

    time_limit_s: HiGHS's limit for one layer's MILP (stopped there, its dual bound is the
        bound and its incumbent the partition; GPT-OSS-20B EP 8 layers solve to optimality in
        1-3 s on one core after the reduced-cost fixing, 5-20 s without);
    mip_rel_gap: HiGHS's relative gap at which it stops (its dual bound stays valid);
    max_device_sets: the MILP runs where C(N, N / G) is at most this;
    batch: the tp batch whose equal shares cap each device (docs/design.md's 2,048)."""

    time_limit_s: float = 60.0
    mip_rel_gap: float = 1e-4
    max_device_sets: int = 100_000
    batch: int = BATCH


def listable(N: int, G: int, config: ConfigIlpConfig = ConfigIlpConfig()) -> bool:
    """Whether the C(N, N / G) device sets of N experts on G devices are few enough to list."""
    return G > 0 and N % G == 0 and comb(N, N // G) <= config.max_device_sets


def set_loads(experts: np.ndarray, N: int, sets: np.ndarray) -> tuple[np.ndarray, float]:
    """(float64[n] activations at this layer of each device set sets int[n, S], the layer's
    total activations T k: the mean device load is that / G)."""
    count = np.bincount(np.asarray(experts, np.int64).ravel(), minlength=N).astype(np.float64)
    return count[sets].sum(axis=1), float(count.sum())


def layer_local(device: np.ndarray, experts: np.ndarray, G: int, batch: int = BATCH,
                rule: str = SEARCH_ASSIGN) -> float:
    """The capacity-bound exact-home local activations at one layer: device int[N] of each
    expert, experts int[T, k]; each row homed by `capacity.capacity_home` (the evaluator's
    rule, `schedule.homes.oracle_home`; `rule` its home rule, `capacity.ASSIGN_RULES`)."""
    on = np.asarray(device, np.int64)[np.asarray(experts, np.int64)]             # [T, k]
    hits = np.stack([(on == d).sum(axis=1) for d in range(G)], axis=1)           # [T, G]
    home = capacity_home(hits, batch, rule=rule)
    return float(hits[np.arange(hits.shape[0]), home].sum())


def imbalance(device: np.ndarray, count: np.ndarray, G: int) -> float:
    """max / mean device load of device int[N] of each expert, count float[N] its activations."""
    return float(peak_ratio(np.bincount(device, weights=count, minlength=G)))


def integer_config(experts: np.ndarray, N: int, G: int,
                   config: ConfigIlpConfig = ConfigIlpConfig(),
                   max_imbalance: float | None = None, starts: tuple = (),
                   admit: Callable[[np.ndarray], np.ndarray] | None = None) -> dict | None:
    """The integer configuration program at one layer (module docstring), or None where the
    sets cannot be listed or no partition is within max_imbalance.

    experts: int[T, k] one layer's routed experts (distinct within a row); starts: partitions
    int64[N] (experts in device order, slot // S = device) known already, e.g. the solver's;
    admit: None, or sets int[n, S] -> bool[n], the sets a caller's own balance rule allows
    (the program then ranges over the sets both allow).
    Returns {"local": an upper bound on the local activations of every placement within
    max_imbalance (None: any), "value": sum V of the partition found, "gap": (local - value) /
    local, "optimal": whether HiGHS proved its optimum, "partition": int64[N] or None,
    "lp": the LP's Lagrangian bound, "sets": columns listed, "columns": columns left to the
    MILP, "seconds"}.

    Reduced-cost fixing first (the LP, then the columns no partition better than the best
    known can use are dropped): with the LP's duals mu and rc(D) = V(D) - mu(D), every partition
    P has sum_d V(D_d) = sum_e mu_e + sum_d rc(D_d) exactly, so one that uses D is worth at
    most ub(D) = sum mu + rc(D) + (G - 1) max(0, max rc). Columns with ub below the best known
    partition's value leave; the bound is the larger of HiGHS's dual bound on the rest and the
    largest ub dropped, capped by the LP's. On GPT-OSS-20B EP 8 this leaves a few hundred of the
    ~24k sets within the balance, and the MILP then closes in well under a second."""
    if not listable(N, G, config):
        return None
    t0 = time.perf_counter()
    S = N // G
    D = device_sets(N, S)
    V = device_values(experts, N, G, config.batch, D)
    load, total = set_loads(experts, N, D)
    cap = np.inf if max_imbalance is None else max_imbalance * total / G * (1 + 1e-12)
    if max_imbalance is not None:
        D, V = D[load <= cap], V[load <= cap]
    if admit is not None:            # a caller's own balance rule on top (sempar's load model)
        ok = np.asarray(admit(D), bool)
        D, V = D[ok], V[ok]
    if not len(D):
        return None
    lp = _lp(D, V, N, G, config.time_limit_s)
    if lp is None:
        return None
    mu, x = lp
    rc = V - mu[D].sum(axis=1)
    lag = float(mu.sum() + G * rc.max())                     # valid at any prices
    ub = mu.sum() + rc + (G - 1) * max(float(rc.max()), 0.0)
    known = [p for p in (*starts, _rounded(D, x, V, N, G)) if p is not None]
    best, best_value = None, -np.inf
    for p in known:
        groups = np.sort(np.asarray(p, np.int64).reshape(G, S), axis=1)
        if load_of(experts, N, groups).max() <= cap and (admit is None or admit(groups).all()):
            v = float(device_values(experts, N, G, config.batch, groups).sum())
            if v > best_value:
                best, best_value = np.asarray(p, np.int64), v
    keep = ub >= best_value - 1e-9 * abs(best_value) - 1e-6 if best is not None \
        else np.ones(len(D), bool)
    dropped = float(ub[~keep].max()) if (~keep).any() else -np.inf
    Dk, Vk = D[keep], V[keep]
    A = csr_matrix((np.ones(Dk.size), (Dk.ravel(), np.repeat(np.arange(Dk.shape[0]), S))),
                   shape=(N, Dk.shape[0]))
    res = milp(-Vk, constraints=LinearConstraint(A, 1.0, 1.0), integrality=np.ones(len(Vk)),
               bounds=Bounds(0.0, 1.0),
               options={"time_limit": config.time_limit_s, "mip_rel_gap": config.mip_rel_gap,
                        "disp": False})
    partition, value = best, (best_value if best is not None else None)
    if res.x is not None:
        chosen = np.flatnonzero(res.x > 0.5)
        cand = np.concatenate([Dk[j] for j in chosen]).astype(np.int64)
        if np.sort(cand).tolist() == list(range(N)) and (value is None or
                                                          Vk[chosen].sum() > value):
            partition, value = cand, float(Vk[chosen].sum())
    dual = getattr(res, "mip_dual_bound", None)
    # the dual bound of min -V x: -dual >= the max over the columns kept
    upper = -float(dual) if dual is not None and np.isfinite(dual) else lag
    upper = min(max(upper, dropped, value if value is not None else -np.inf), lag)
    upper = upper * (1 + 1e-9) + 1e-6                       # a hair for HiGHS's tolerances
    return {"local": min(upper, float(np.asarray(experts).size)), "value": value,
            "gap": 0.0 if value is None else (upper - value) / max(abs(upper), 1e-12),
            "optimal": bool(res.status == 0), "partition": partition, "lp": lag,
            "sets": int(len(D)), "columns": int(keep.sum()),
            "seconds": time.perf_counter() - t0}


def load_of(experts: np.ndarray, N: int, groups: np.ndarray) -> np.ndarray:
    """float64[G]: activations at this layer of each group of experts groups int[G, S]."""
    return set_loads(experts, N, groups)[0]


def _lp(D: np.ndarray, V: np.ndarray, N: int, G: int, time_limit: float
        ) -> tuple[np.ndarray, np.ndarray] | None:
    """(duals mu float64[N] of "each expert on one device", weights x float64[n]) of the LP
    max V x, each expert covered once, x >= 0, over the sets D int[n, S]; None where HiGHS did
    not finish."""
    S = D.shape[1]
    cover = csr_matrix((np.ones(D.size), (D.ravel(), np.repeat(np.arange(len(D)), S))),
                       shape=(N, len(D)))
    res = linprog(-V, A_eq=cover, b_eq=np.ones(N), bounds=(0, None), method="highs",
                  options={"time_limit": time_limit})
    if res.status != 0:
        return None
    return -np.asarray(res.eqlin.marginals, np.float64), np.asarray(res.x, np.float64)


def _rounded(D: np.ndarray, x: np.ndarray, V: np.ndarray, N: int, G: int) -> np.ndarray | None:
    """int64[N]: the LP's sets by decreasing weight, each taken while disjoint from those
    taken, then the other sets by decreasing V likewise; None where they do not cover every
    device (the MILP then keeps every column)."""
    used = np.zeros(N, bool)
    groups = []
    pos = np.flatnonzero(x > 1e-9)
    rest = np.flatnonzero(x <= 1e-9)
    for j in (*pos[np.argsort(-x[pos], kind="stable")], *rest[np.argsort(-V[rest], kind="stable")]):
        if len(groups) == G:
            break
        if not used[D[j]].any():
            groups.append(D[j])
            used[D[j]] = True
    return np.concatenate(groups).astype(np.int64) if len(groups) == G else None


INTEGER_METHOD = "integer device configuration (HiGHS MILP)"


def tighten_bound(experts: np.ndarray, N: int, G: int, bound: dict,
                  config: ConfigIlpConfig = ConfigIlpConfig(),
                  max_imbalance: float | None = None) -> dict:
    """`bound.lar_upper_bound`'s answer `bound` for experts int[T, L, k] of N experts on G
    devices (computed at max_imbalance) with each listable layer's bound replaced by the
    integer program's where lower (both are valid: each layer keeps the least). Adds "milp_gap"
    per layer (HiGHS's own relative gap, None where it did not run), "milp_seconds" and
    "lp_per_layer" (the bound before); a layer's "witness" becomes the MILP's partition where
    its real figure (`layer_local`) is higher and it is within max_imbalance. The balance-free
    entry ("lar_mean_any_balance") is left as it was."""
    ex_all = np.asarray(experts, np.int64)
    T, L, k = ex_all.shape
    out = dict(bound, per_layer=list(bound["per_layer"]), witness=list(bound["witness"]),
               per_layer_method=list(bound["per_layer_method"]), seconds=list(bound["seconds"]))
    gaps, secs = [None] * L, [0.0] * L
    for l in range(L):
        if not listable(N, G, config):
            break
        ex = ex_all[:, l]
        old = out["witness"][l]
        r = integer_config(ex, N, G, config, max_imbalance, starts=() if old is None else (old,))
        if r is None:
            continue
        gaps[l], secs[l] = r["gap"], r["seconds"]
        out["seconds"][l] += r["seconds"]
        if r["local"] / max(T * k, 1) < out["per_layer"][l]:
            out["per_layer"][l] = r["local"] / max(T * k, 1)
            out["per_layer_method"][l] = INTEGER_METHOD
        if r["partition"] is not None:
            count = np.bincount(ex.ravel(), minlength=N).astype(np.float64)
            mine = expert_devices(r["partition"], G)
            if old is None or layer_local(mine, ex, G, config.batch) > layer_local(
                    expert_devices(old, G), ex, G, config.batch):
                if max_imbalance is None or \
                        imbalance(mine, count, G) <= max_imbalance * (1 + 1e-12):
                    out["witness"][l] = r["partition"]
    out["lar_mean"] = float(np.mean(out["per_layer"])) if L else 0.0
    seen = list(dict.fromkeys(out["per_layer_method"]))
    out["method"] = " + ".join(seen)
    out["milp_gap"], out["milp_seconds"] = gaps, secs
    out["lp_per_layer"] = list(bound["per_layer"])         # before the MILP: how much it tightened
    return out


def expert_devices(order: np.ndarray, G: int) -> np.ndarray:
    """int64[N]: device of each expert from its experts in device order (slot // S = device)."""
    order = np.asarray(order, np.int64)
    dev = np.empty(order.size, np.int64)
    dev[order] = np.arange(order.size) // (order.size // G)
    return dev
