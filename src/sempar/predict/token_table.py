"""`TokenTable`: the token -> device table T with its confidence Tp (Sem-MoE §3.2, Alg. 2-3).

For every MoE layer l and every token id u seen in the fit trace, `device[l, u]` is the device
the token should sit on when layer l's router runs and `confidence[l, u]` in [0, 1] is how sure
the table is (for the co-clustering solvers: the share of the token's expected activations at
layer l that land on that device). Token ids the table does not know get device -1.

Stored compactly, as the paper does: device ids as int16 (Sem-MoE quotes 11.72 MB for
DeepSeek-V2's T: 60 layers x 102,400 tokens x 2 bytes = 11.72 MiB), confidences as float16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sempar.errors import InputError


@dataclass
class TokenTable:
    """token_id int64[U] (sorted, unique); device int16[L, U]; confidence float32[L, U]."""

    token_id: np.ndarray
    device: np.ndarray
    confidence: np.ndarray

    def __post_init__(self) -> None:
        self.token_id = np.asarray(self.token_id, np.int64)
        self.device = np.asarray(self.device, np.int16)
        self.confidence = np.asarray(self.confidence, np.float32)
        U = self.token_id.size
        if self.device.ndim != 2 or self.device.shape[1] != U:
            raise InputError(f"token table: device has shape {self.device.shape}, expected [L, {U}]")
        if self.confidence.shape != self.device.shape:
            raise InputError(f"token table: confidence has shape {self.confidence.shape}, "
                             f"expected {self.device.shape}")
        if U > 1 and np.any(np.diff(self.token_id) <= 0):
            raise InputError("token table: token ids must be sorted and unique")

    @property
    def num_layers(self) -> int:
        return self.device.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.token_id.size

    def nbytes(self) -> dict[str, int]:
        """Bytes as served: int16 devices (the table T) and float16 confidences (Tp)."""
        n = self.device.size
        return {"device": 2 * n, "confidence": 2 * n, "token_id": 4 * self.token_id.size}

    def index(self, token_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pos int64[T], seen bool[T]): each token's column in the table, and whether it has one."""
        token_id = np.asarray(token_id, np.int64)
        if self.token_id.size == 0:
            return np.zeros(token_id.shape, np.int64), np.zeros(token_id.shape, bool)
        pos = np.minimum(np.searchsorted(self.token_id, token_id), self.token_id.size - 1)
        return pos, self.token_id[pos] == token_id

    def lookup(self, token_id: np.ndarray, layer: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(device int16[T, L] or [T], confidence float32[T, L] or [T]); -1 for unknown tokens."""
        pos, seen = self.index(token_id)
        if layer is None:
            dev = np.where(seen[:, None], self.device[:, pos].T, -1).astype(np.int16)
            conf = np.where(seen[:, None], self.confidence[:, pos].T, -1.0).astype(np.float32)
        else:
            dev = np.where(seen, self.device[layer, pos], -1).astype(np.int16)
            conf = np.where(seen, self.confidence[layer, pos], -1.0).astype(np.float32)
        return dev, conf

    def to_json(self) -> dict[str, Any]:
        return {"token_id": self.token_id.tolist(), "device": self.device.tolist(),
                "confidence": np.round(self.confidence, 4).tolist()}

    @classmethod
    def from_json(cls, d: Any) -> "TokenTable":
        if isinstance(d, TokenTable):
            return d
        try:
            tok, dev = np.asarray(d["token_id"]), np.asarray(d["device"])
            conf = np.asarray(d["confidence"], np.float64)
            for name, a, lo, hi in (("token_id", tok, 0, np.iinfo(np.int32).max),
                                    ("device", dev, 0, np.iinfo(np.int16).max)):
                if a.size and (a.dtype.kind not in "iu" or a.min() < lo or a.max() > hi):
                    raise InputError(f"token table: {name} holds a value that is not an integer "
                                     f"in [{lo}, {hi}]")
            if conf.size and not (np.isfinite(conf).all() and (conf >= 0).all() and (conf <= 1).all()):
                raise InputError("token table: confidence holds a value outside [0, 1]")
            return cls(tok, dev.reshape(-1, len(d["token_id"])),
                       conf.reshape(-1, len(d["token_id"])))
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            if isinstance(e, InputError):
                raise
            raise InputError(f"token table: malformed ({e})") from None
