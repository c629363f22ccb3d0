"""What changing a placement costs: expert copies between two placements, and the bytes they move.

A device that already hosts an expert keeps its weights, whatever slot the expert sits in, so a
new placement copies, per layer and device, the experts the device hosts afterwards and did not
host before (`copied_experts`). A solver's device labels are arbitrary within a layer when every
layer is served independently (tp mode's exact homes, a single node): `align_devices` relabels
the new placement's devices per layer to keep the most experts where they are (a Hungarian
matching of old to new devices), which is what a runtime applying a full re-solve would do
before copying weights. Applied to every full re-layout in `sempar replay` (`resolve`,
`eplb-periodic`), so their migrated bytes are not inflated by labels.

Bytes per expert copy come from the model's shape (`drift.costs.expert_bytes`).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from sempar.errors import InputError
from sempar.placement.placement import Placement


def copied_experts(old: Placement, new: Placement) -> np.ndarray:
    """int64[L]: per layer, the (device, expert) pairs `new` hosts that `old` does not."""
    if old.phy2log.shape != new.phy2log.shape or old.num_devices != new.num_devices:
        raise InputError(f"placements differ in shape: {old.phy2log.shape} on {old.num_devices} "
                         f"devices against {new.phy2log.shape} on {new.num_devices}")
    return (new.hosts() & ~old.hosts()).sum(axis=(1, 2)).astype(np.int64)


def align_devices(old: Placement, new: Placement) -> Placement:
    """`new` with its devices relabelled per layer so that the most experts stay on the device
    that hosts them in `old` (Hungarian on the [G, G] overlap of hosted experts). Only valid
    where device labels are free per layer (one node); with several nodes `new` is returned."""
    if new.num_nodes > 1 or old.phy2log.shape != new.phy2log.shape:
        return new
    G, S = new.num_devices, new.slots_per_device
    ho, hn = old.hosts(), new.hosts()                                   # [L, G, N]
    phy = new.phy2log.copy()
    for l in range(new.num_layers):
        overlap = ho[l].astype(np.int64) @ hn[l].T.astype(np.int64)     # [old g, new g]
        old_dev, new_dev = linear_sum_assignment(-overlap)
        rows = new.slots(l)
        phy[l] = rows[new_dev[np.argsort(old_dev)]].reshape(-1)
    out = Placement(phy, new.num_experts, G, new.node_of.copy(), new.method, dict(new.info),
                    None, None)
    return out.validate()
