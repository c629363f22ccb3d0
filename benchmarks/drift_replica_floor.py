"""Is the replicas suite's ceiling a floor? (issue 45, item 3.) Per step of a drift stream, with
R = G replica slots and the `lp-cap` dispatch: the suite's `oracle` (DeepSeek EPLB on the step's
own requests) served as `sempar replay` serves it; the least peak its copies allow on the step's
total and on the step's worst dispatch batch (`dispatch_peak.min_peak`, exact max-flow bound);
and the same layout after the replica pass over the step's dispatch batches (every slot free,
target 1.0), served likewise. Where that pass serves below the oracle, the oracle is not the
floor: a per-batch dispatch is held back by single batches, and a layout that sees them does
better.

    nice -n 5 python benchmarks/drift_replica_floor.py mmlu-groups 8
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(name: str, ep: int) -> None:
    from bench_drift_engines import load_stream

    from sempar.drift.config import ReplayConfig
    from sempar.drift.policies import solve_window
    from sempar.drift.replay import serve_figures
    from sempar.drift.streams import request_table
    from sempar.placement.dispatch_peak import ReplicaPass, min_peak, replica_pass
    from sempar.placement.placement import Placement
    from sempar.solve_options import SolveOptions

    trace, stream, every, window = load_stream(name)
    cfg = ReplayConfig.for_model(trace.meta.model, ep, solve=SolveOptions(jobs=1, redundant=ep),
                                 every=every, window=window, dispatch="lp-cap")
    _, _, rows, starts = request_table(stream)
    R, B, N = starts.size - 1, cfg.rebalance.batch, stream.meta.num_experts
    res = []
    for s, a in enumerate(range(cfg.window, R, cfg.every)):
        part = stream.take(rows[starts[a]:starts[min(a + cfg.every, R)]])
        p = solve_window("eplb", part, cfg)
        imb = serve_figures(p, part.experts, B, "lp-cap", cfg.solve.seed)[1].mean()
        T, L, _ = part.experts.shape
        nb = -(-T // B)
        loads = np.zeros((L, nb, N))                       # [L, batches, N] expert loads
        for i in range(nb):
            for layer in range(L):
                loads[layer, i] = np.bincount(part.experts[i * B:(i + 1) * B, layer].ravel(),
                                              minlength=N)
        total = loads.sum(axis=1)
        step_peak = np.mean([min_peak(p.phy2log[x], total[x], ep)[0] for x in range(L)])
        batch_peak = np.mean([min_peak(p.phy2log[x], loads[x], ep).max() for x in range(L)])
        phy, moved = replica_pass(p.phy2log, ep, np.concatenate([loads, total[:, None]], 1),
                                  np.ones(nb + 1), ReplicaPass(max_moves=ep, target=1.0))
        q = Placement(phy, p.num_experts, p.num_devices, p.node_of.copy(), "eplb+batches",
                      {}).validate()
        imb2 = serve_figures(q, part.experts, B, "lp-cap", cfg.solve.seed)[1].mean()
        res.append((imb, imb2))
        print(f"step {s}: oracle {imb:.3f} (least peak: step {step_peak:.3f}, worst batch "
              f"{batch_peak:.3f}); + replica pass on the step's {nb} batches ({moved} "
              f"retargets) {imb2:.3f}", flush=True)
    x = np.array(res)
    print(f"{name} EP {ep}: imbalance p95 oracle {np.percentile(x[:, 0], 95):.3f}, "
          f"oracle + batch replica pass {np.percentile(x[:, 1], 95):.3f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
