"""Bytes the re-placement cost model prices, from the model's shape (`serving.dims`): one expert
copy, and one remote activation. Kept out of `placement/` (placement sits left of serving in the
data flow); the commands and the benchmark put them into `RebalanceConfig`."""

from __future__ import annotations

MOVES_MAX = 1_000_000   # the move budget when only a byte budget bounds a step (no move cap)


def expert_bytes(model: str) -> int:
    """Bytes of one routed expert's weights (gate, up, down x dtype bytes) of `model`, a preset
    or packaged tiny model (`serving.dims.model_dims`); InputError when its shape is unknown."""
    from sempar.serving.dims import model_dims

    d = model_dims(model)
    return int(d.expert_params * d.dtype_bytes)


def remote_activation_bytes(model: str) -> int:
    """Bytes one remote (token, expert) activation moves: the hidden state there (dispatch) and
    the expert's output back (combine), hidden x dtype bytes each way."""
    from sempar.serving.dims import model_dims

    d = model_dims(model)
    return int(2 * d.hidden * d.dtype_bytes)
