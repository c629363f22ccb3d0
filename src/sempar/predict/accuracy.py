"""How well the routing tables predict a token's device (Sem-MoE §3.2-3.3, App. B.1, Alg. 3).

`prediction_accuracy` scores, per layer, three predictions of each (token, layer)'s device
state (the device hosting most of its real selected experts, `device_state.py`):

- `token`: the token table T (`TokenDevice`, or a solver's `TokenTable`);
- `ngram`: the device n-gram table A (`DeviceNgram.predict_trace`: the token's real states at
  the previous layers, known when layer l's router runs);
- `combined`: Sem-MoE Alg. 3 line 2, `cond(Tp > Ap, T, A)`: per (token, layer) the table with
  the higher confidence (ties to A; a token T does not know has Tp = -1, so A decides).

Accuracy = share of (token, layer) whose predicted device equals the state (a -1 prediction is
a miss). Alongside, the **local share** of each prediction: the share of the token's k
activations hosted on the predicted device (the LAR the prediction would reach if every token
could go where it was sent, with no equal-chunk capacity rule); `oracle` is that of the state
itself, the ceiling.
"""

from __future__ import annotations

import numpy as np

from sempar.errors import InputError
from sempar.affinity.affinity_stats import device_states
from sempar.predict.device_state import check_placement, local_share
from sempar.predict.ngram import DeviceNgram
from sempar.predict.token_device import TokenDevice
from sempar.predict.token_table import TokenTable
from sempar.trace.schema import RoutingTrace

PREDICTIONS = ("token", "ngram", "combined")


def combine(t_dev: np.ndarray, t_conf: np.ndarray, a_dev: np.ndarray, a_conf: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Sem-MoE Alg. 3 line 2 on arrays of equal shape: (device int16, confidence float32)."""
    use_t = t_conf > a_conf
    return (np.where(use_t, t_dev, a_dev).astype(np.int16),
            np.where(use_t, t_conf, a_conf).astype(np.float32))


def prediction_accuracy(trace: RoutingTrace, placement, token_device: TokenDevice | TokenTable,
                        ngram: DeviceNgram) -> dict:
    """Per-layer accuracy of T, A and their combination on `trace` under `placement`.

    token_device: a fitted `TokenDevice` or a `TokenTable` (e.g. `placement.token_table`);
    ngram: a `DeviceNgram` fitted with the same placement.
    Returns {"token", "ngram", "combined": float64[L] accuracy, "<name>_mean": float,
    "token_chosen": float64[L] share of (token, layer) the combination took from T,
    "token_known": share of tokens T has a device for (after OOV mapping),
    "local": {name or "oracle": float64[L] local share}, "local_mean": {name: float}}.
    """
    hosts = placement.hosts()
    check_placement(trace, hosts)
    if not np.array_equal(ngram.hosts_, hosts):
        raise InputError("ngram: fitted with another placement than the one scored")
    state = device_states(trace.experts, hosts)
    if isinstance(token_device, TokenTable):
        t_dev, t_conf = token_device.lookup(trace.token_id)
    else:
        t_dev, t_conf = token_device.predict(trace.token_id)
    a_dev, a_conf = ngram.predict_states(state)
    c_dev, _ = combine(t_dev, t_conf, a_dev, a_conf)
    pred = {"token": t_dev, "ngram": a_dev, "combined": c_dev}
    out: dict = {}
    for name, dev in pred.items():
        acc = (dev == state).mean(axis=0) if trace.num_tokens else np.full(state.shape[1], np.nan)
        out[name] = acc
        out[f"{name}_mean"] = float(np.mean(acc))
    out["token_chosen"] = (t_conf > a_conf).mean(axis=0)
    out["token_known"] = float((t_dev[:, 0] >= 0).mean()) if trace.num_tokens else float("nan")
    local = {name: local_share(trace.experts, hosts, dev).mean(axis=0)
             for name, dev in (*pred.items(), ("oracle", state))}
    out["local"] = local
    out["local_mean"] = {name: float(np.mean(v)) for name, v in local.items()}
    return out
