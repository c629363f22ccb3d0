"""The plan's choice among its ranked deployments: the leader by throughput under the SLO,
unless a simpler deployment is within the forecast's noise of it.

Noise (plan.py): the relative spread of the leader's and the baseline's throughput under the
SLO over other arrival streams, at least the rate search's tolerance. A deployment is within it
when its figure is at least (1 - noise) x the leader's, or its throughput interval reaches the
leader's lower end. Among those, the lowest `complexity` (deploy.py: placement file, replica
slots, request router, non-upstream pipeline) is recommended, then the higher figure; the
result names the deployments tied and says when the simpler one was preferred.
"""

from __future__ import annotations


def label(r: dict) -> str:
    """One ranked deployment in words."""
    return (f"{r['pipeline']} / {r['placement']} / {r['policy']} / {r['redundant']} redundant "
            f"/ EP {r['ep']}")


def within(r: dict, lead: dict, noise: float) -> bool:
    t, best = r["throughput_under_slo"] or 0.0, lead["throughput_under_slo"] or 0.0
    hi = (r.get("throughput_interval") or [None, None])[1]
    return best > 0 and (t >= (1 - noise) * best or (hi is not None and hi >= best))


def choose(ranked: list[dict], noise: float) -> tuple[list[dict], dict]:
    """(ranked with the recommended deployment first, the choice: leader, tied, preferred,
    text). `ranked` is sorted by throughput under the SLO, highest first."""
    if not ranked or not ranked[0]["throughput_under_slo"]:
        return ranked, {"tied": [], "prefers_simpler": False, "text": ""}
    lead = ranked[0]
    tied = [r for r in ranked if within(r, lead, noise)]
    pick = min(tied, key=lambda r: (r["complexity"], -(r["throughput_under_slo"] or 0.0)))
    out = [pick] + [r for r in ranked if r is not pick]
    simpler = pick is not lead
    if len(tied) == 1:
        text = (f"No other deployment is within the forecast's noise ({noise:.1%}) of "
                f"{label(lead)}.")
    elif simpler:
        text = (f"{len(tied)} deployments are within the forecast's noise ({noise:.1%}) of the "
                f"leader {label(lead)}; the simpler {label(pick)} is recommended (it needs "
                f"{pick['complexity']} change(s) from SGLang's launch, the leader "
                f"{lead['complexity']}).")
    else:
        text = (f"{len(tied)} deployments are within the forecast's noise ({noise:.1%}); the "
                f"leader {label(lead)} is also the simplest of them.")
    return out, {"leader": label(lead), "recommended": label(pick), "tied": [label(r) for r in tied],
                 "prefers_simpler": simpler, "noise": noise, "text": text}
