"""What the vLLM and SGLang plug-ins share: read SEMPAR_EPLB, run the policy, check its map,
log one line in the engine's logger, keep the last rebalance's figures, and say "use your
default" (None) on anything wrong, so a plug-in never takes the engine down."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import numpy as np

from sempar.eplb.config import ENV_FILE

if TYPE_CHECKING:
    from sempar.eplb.report import RebalanceReport

# The last rebalance, for an operator or a test: its `RebalanceReport` fields, or the reason
# of the last fallback. Also exported as Prometheus gauges where prometheus_client is there.
LAST: dict = {"rebalances": 0, "fallbacks": 0, "report": None, "fallback_reason": None}
_GAUGES: dict = {}


def enabled() -> bool:
    return bool(os.environ.get(ENV_FILE, "").strip())


def _gauges() -> dict:
    if not _GAUGES:
        try:
            from prometheus_client import Counter, Gauge

            _GAUGES.update(
                lar=Gauge("sempar_eplb_last_lar", "LAR of the last sempar rebalance on FILE's "
                          "sample rows (-1: no sample)"),
                locality=Gauge("sempar_eplb_last_locality", "share of FILE's co-activation "
                               "kept on one device after the last sempar rebalance"),
                moves=Gauge("sempar_eplb_last_moves", "slots whose expert the last sempar "
                            "rebalance changed"),
                imbalance=Gauge("sempar_eplb_last_imbalance", "mean max/mean device load of "
                                "the live window after the last sempar rebalance"),
                fallbacks=Counter("sempar_eplb_fallbacks", "rebalances that fell back to the "
                                  "engine's default policy"))
        except Exception:                      # no prometheus_client, or names taken
            _GAUGES["off"] = True
    return _GAUGES


def _record(report=None, reason: str | None = None) -> None:
    g = _gauges()
    if reason is not None:
        LAST["fallbacks"] += 1
        LAST["fallback_reason"] = reason
        if "fallbacks" in g:
            g["fallbacks"].inc()
        return
    LAST["rebalances"] += 1
    LAST["report"] = report
    LAST["fallback_reason"] = None
    if "moves" in g:
        g["moves"].set(report.moves)
        g["locality"].set(report.locality_after)
        g["imbalance"].set(report.imbalance_after)
        g["lar"].set(-1 if report.lar_after is None else report.lar_after)


def check_map(m: np.ndarray, L: int, P: int, N: int, G: int, distinct: bool = False
              ) -> str | None:
    """Why `m` is not a usable physical_to_logical map int[L, P] (every expert at least once;
    with `distinct`, no expert twice on one rank), or None. The engines accept two copies on
    one rank (their own policies make them), so a layer kept from the old map may have them."""
    if m.shape != (L, P):
        return f"map shape {m.shape}, not ({L}, {P})"
    if m.min() < 0 or m.max() >= N:
        return "expert id out of range"
    cnt = np.zeros((L, N), np.int64)
    np.add.at(cnt, (np.repeat(np.arange(L), P), m.ravel()), 1)
    if (cnt == 0).any():
        return "an expert has no slot"
    if not distinct:
        return None
    per_rank = m.reshape(L, G, P // G)
    srt = np.sort(per_rank, axis=2)
    if (srt[:, :, 1:] == srt[:, :, :-1]).any():
        return "an expert twice on one rank"
    return None


def checked_map(weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int,
                num_ranks: int, old_map: np.ndarray | None, source, config
                ) -> tuple[np.ndarray, RebalanceReport]:
    """(int64[L, P], its report): the policy's map for this rebalance on a loaded FILE
    (`source`) and `config`, checked with `check_map`; raises ValueError where it is unusable.
    The one path from the engine's arguments to a map: the plug-ins (`plan`) and the drift
    replay's `sempar-engine` both take it. weight float64[L, N]."""
    from sempar.eplb.policy import rebalance_report

    L, N = weight.shape
    m, report = rebalance_report(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                 old_map, source, config)
    bad = check_map(m, L, num_replicas, N, num_ranks)
    if bad:
        raise ValueError(f"sempar's map is unusable ({bad})")
    return m, report


def fallback_reason(err: Exception) -> str:
    """The one line a fallback logs: the message of a FILE or setting refusal, else the
    error's kind and first line."""
    kind = type(err).__name__
    msg = str(err).splitlines()[0] if str(err) else kind
    return msg if kind in ("SourceMismatch", "InputError") else f"{kind}: {msg}"


def plan(weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int,
         num_ranks: int, old_map: np.ndarray | None, logger: logging.Logger,
         model: str | None = None, engine_name: str = "") -> np.ndarray | None:
    """sempar's map int64[L, P] for this rebalance, or None: the caller returns its engine's
    default result (FILE missing, corrupt, stale or mismatched; any error). One log line
    either way. engine_name: "vllm" / "sglang" (`PluginConfig.engine`: its defaults)."""
    path = os.environ.get(ENV_FILE, "").strip()
    if not path:
        return None
    t0 = time.perf_counter()
    try:
        from sempar.eplb.config import PluginConfig
        from sempar.eplb.source import load_source

        w = np.asarray(weight, np.float64)
        if w.ndim != 2:
            raise ValueError(f"load window of shape {w.shape}, not [layers, experts]")
        L, N = w.shape
        cfg = PluginConfig.from_env(engine=engine_name)
        src = load_source(path, num_layers=L, num_experts=N, num_ranks=num_ranks, model=model,
                          max_age_s=cfg.max_age_s, sample_rows=cfg.sample_rows(), seed=cfg.seed,
                          settle_s=cfg.settle_s, layout=cfg.layout_knobs())
        m, report = checked_map(w, num_replicas, num_groups, num_nodes, num_ranks, old_map,
                                src, cfg)
    except Exception as err:  # noqa: BLE001 - never take the engine down
        reason = fallback_reason(err)
        logger.warning("sempar EPLB: using the engine's default policy for this rebalance: %s",
                       reason)
        _record(reason=reason)
        return None
    report.seconds = time.perf_counter() - t0
    logger.info("sempar EPLB (%s): %s", os.path.basename(path), report.line())
    _record(report)
    return m
