"""Capacity rules shared by placement, scheduling and evaluation: the tp batch, equal shares and
proposal rounds.

- `BATCH`: tokens per batch in tp mode (docs/design.md, "Home device": 2,048 unless stated).
- `equal_shares(n, G)`: int64[G], n // G per device and the first n % G devices one more: the
  equal chunks reduce-scatter needs (Sem-MoE Alg. 3's align step).
- `slack_shares(n, G, slack)`: int64[G], the per-device cap of a batch with chunk slack epsilon:
  equal shares at 0, else ceil((1 + epsilon) n / G) each. Only the upper bound is enforced: a
  device may end below (1 - epsilon) n / G, because in tp mode every cost that depends on the
  chunks (the padded reduce-scatter / all-gather, `comm.simulate`) is set by the largest one.
- `proposal_rounds`: the capacity-bound assignment used by the tp oracle
  (`schedule.homes.oracle_home`), the exact pre-router's homes (`schedule.prerouter`), the
  next-best re-batching (`schedule.rebatch.propose`) and the sempar solver's token step
  (`placement.sempar.solver.capacitated_assign`). In round r every unplaced item asks its r-th
  preferred device; a device takes its askers by decreasing priority (ties: the earlier item)
  while they fit. A full device thus spills an item to *that item's* next-best device, never to
  the next device in id order. The papers leave the overflow rule open (Sem-MoE App. B.2, Alg. 3
  line 5's `align` keeps every device at an equal share, not saying who moves); this one is ours.
- `ASSIGN_RULES`: the capacity-bound home assignments by name, each (hits int[n, G], caps
  int[G]) -> int64[n]: "proposal" (the proposal rounds above, greedy) and "optimal"
  (`placement.transport.optimal_assign`: the most local activations any assignment within the
  caps reaches, a transportation problem solved exactly; ours). `capacity_home(..., rule=)`
  picks one: `DEFAULT_ASSIGN` ("optimal") wherever sempar homes tokens for a user (evaluate's
  tp oracle homes, the exact pre-router, the runtime's oracle and tp-exact modes, simulate's
  and drift's exact homes), `SEARCH_ASSIGN` ("proposal") inside the solvers' search loops.

Pure numpy, low in the package so that placement/ can use it (docs/design.md's layering).
"""

from __future__ import annotations

import math

import numpy as np

from sempar.errors import InputError
from sempar.placement.transport import optimal_assign
from sempar.registry import Registry

BATCH = 2048          # tokens per batch in tp mode (docs/design.md)


def equal_shares(num_items: int, num_devices: int) -> np.ndarray:
    """int64[G]: num_items // G per device, the first num_items % G devices one more."""
    base, extra = divmod(int(num_items), int(num_devices))
    return np.full(num_devices, base, np.int64) + (np.arange(num_devices) < extra)


def check_slack(slack: float, option: str = "chunk_slack") -> float:
    """`slack` as a float if it is finite and in [0, 1); else InputError naming `option`."""
    s = float(slack)
    if not math.isfinite(s) or not 0.0 <= s < 1.0:
        raise InputError(f"{option}: {slack} is not in [0, 1)")
    return s


def slack_shares(num_items: int, num_devices: int, slack: float = 0.0) -> np.ndarray:
    """int64[G]: each device's cap for a batch of n items: `equal_shares` at slack 0, else
    ceil((1 + slack) n / G) each (at most n; their sum >= n, so every item finds room)."""
    if check_slack(slack) == 0.0:
        return equal_shares(num_items, num_devices)
    n = int(num_items)
    cap = min(n, math.ceil((1.0 + slack) * n / num_devices - 1e-9))
    return np.full(num_devices, max(cap, -(-n // num_devices)), np.int64)


def proposal_rounds(pref: np.ndarray, priority: np.ndarray, cap: np.ndarray,
                    weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(device int64[n] per item, -1 = not placed; room left [G], cap's dtype or float64).

    pref: int[n, R], each item's devices in its order of preference, -1 = no more choices;
    priority: float[n] (fixed) or float[n, R] (priority[:, r]: the item's priority when it asks
    pref[:, r]); cap: [G] capacities (items, or weight units with `weight`); weight: float[n] > 0
    or None (every item weighs 1, so a device takes its first cap[g] askers). With weights a
    device takes its askers in priority order while the running sum of their weights fits its
    room (+1e-9), so a heavy asker that does not fit also blocks the lighter ones behind it.
    Items never placed (every choice full) are the caller's to settle.
    """
    pref = np.asarray(pref)
    n, R = pref.shape
    G = cap.shape[0]
    room = cap.astype(np.float64) if weight is not None else cap.astype(np.int64)
    prio = np.asarray(priority)
    out = np.full(n, -1, np.int64)
    for r in range(R):
        idx = np.flatnonzero(out < 0)
        if idx.size == 0:
            break
        choice = pref[idx, r]
        if (choice < 0).any():
            idx, choice = idx[choice >= 0], choice[choice >= 0]
        p = prio[idx, r] if prio.ndim == 2 else prio[idx]
        order = np.lexsort((-p, choice))            # by device, then priority, then item
        c = choice[order]
        if weight is None:
            rank = np.arange(c.size) - np.searchsorted(c, c, side="left")
            ok = rank < room[c]
            room -= np.bincount(c[ok], minlength=G)
        else:
            w = weight[idx[order]]
            csum = np.cumsum(w)
            start = np.searchsorted(c, np.arange(G), side="left")
            before = csum - w - np.concatenate([[0.0], csum])[start[c]]
            ok = before + w <= room[c] + 1e-9
            room -= np.bincount(c[ok], weights=w[ok], minlength=G)
        out[idx[order[ok]]] = c[ok]
    return out, room


def fill_in_order(home: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Unplaced items (home < 0), in item order, fill the room left int[G] in device order;
    `home` int[n] is updated in place and returned."""
    rest = np.flatnonzero(home < 0)
    home[rest] = np.repeat(np.arange(room.shape[0]), np.maximum(room, 0))[: rest.size]
    return home


def proposal_assign(hits: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """int64[n]: proposal rounds over each item's devices by decreasing hits int[n, G] (ties:
    lower id), priority its hits at its best device (ties: earlier item), device g taking at
    most caps int[G] (sum >= n, so every item is placed: its last choice is every device)."""
    pref = np.argsort(-hits, axis=1, kind="stable")
    return proposal_rounds(pref, hits.max(axis=1), np.asarray(caps))[0]


ASSIGN_RULES: Registry = Registry("capacity home rule")
ASSIGN_RULES.add("proposal", proposal_assign)
ASSIGN_RULES.add("optimal", optimal_assign)
# every home sempar assigns by a capacity rule for a user (evaluate's tp oracle homes, the exact
# pre-router, the runtime's oracle mode, simulate's and drift's exact homes): the optimum, at
# 1-2x the greedy rounds' time per batch (docs/placement.md, "The exact home rule")
DEFAULT_ASSIGN = "optimal"
# the rule inside the solvers' search loops (sempar's held-out prediction, replica picks and
# rebalance scoring, the exact solver's candidates without its swap pass): cheap, called per
# candidate, and what the shipped placements were searched with, so they stay as they were
SEARCH_ASSIGN = "proposal"


def capacity_home(hits: np.ndarray, batch: int | None = None, slack: float = 0.0,
                  rule: str = DEFAULT_ASSIGN) -> np.ndarray:
    """int64[T]: each item's device under equal shares per batch, knowing its local activations.

    hits: int[T, G] local activations per device. Per batch of `batch` items (None: all), device
    g takes `equal_shares` (slack > 0: at most `slack_shares`, ceil((1 + slack) n / G)), by
    `ASSIGN_RULES[rule]`: "proposal" rounds (`proposal_assign`) or the "optimal" assignment
    (`transport.optimal_assign`). The capacity-bound oracle of docs/design.md ("Oracle LAR", tp
    mode).
    """
    assign = ASSIGN_RULES.get(rule)
    T, G = hits.shape
    step = T if batch is None or batch >= T else batch
    out = np.empty(T, np.int64)
    for lo in range(0, T, max(step, 1)):
        h = hits[lo:lo + step]
        out[lo:lo + step] = assign(h, slack_shares(h.shape[0], G, slack))
    return out


def place_leftovers(out: np.ndarray, weight: np.ndarray, room: np.ndarray,
                    roomiest: bool = True) -> None:
    """Settle the items proposal rounds left unplaced (out < 0), in place on out int64[n] and
    room float[G]: with `roomiest`, heaviest first, each device in order of decreasing room
    takes them while they fit; any still left (heavier than every device's room) goes to the
    device with the most room, overfilling it."""
    if roomiest:
        left = np.flatnonzero(out < 0)
        left = left[np.argsort(-weight[left], kind="stable")]
        for g in np.argsort(-room, kind="stable"):
            if left.size == 0:
                break
            fit = np.cumsum(weight[left]) <= room[g] + 1e-9
            out[left[fit]] = g
            room[g] -= weight[left[fit]].sum()
            left = left[~fit]
    for i in np.flatnonzero(out < 0):
        g = int(np.argmax(room))
        out[i] = g
        room[g] -= weight[i]
