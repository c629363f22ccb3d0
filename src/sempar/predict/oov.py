"""Out-of-vocabulary tokens: nearest known token in the input-embedding space (Sem-MoE §3.2).

Sem-MoE §3.2: "Out-of-vocabulary tokens are handled via nearest-neighbor matching in the
embedding space." A token id never seen in the fit trace has no row in the tables Cp / T, so
`EmbeddingOOV` maps it to the known token whose input embedding (the model's `embed_tokens`
row) has the highest cosine similarity, and the tables are read at that token's row.

Our choices where the paper is open:

- Similarity is cosine (the embeddings' norms carry frequency, not meaning); ties go to the
  lowest known token id.
- A token id with no usable embedding (id >= V, or an all-zero row) maps to -1. The predictors
  report -1 for such tokens (device -1, confidence -1, no experts), the same convention as
  `TokenTable.lookup`: the re-batcher then treats them as tokens with no preference and fills
  the devices' remaining room with them, and Sem-MoE Alg. 3's `Tp > Ap` test hands them to the
  n-gram table, whose confidence is always >= 0.
- Without a mapper the predictors apply that same -1 fallback to every unseen token.

`load_input_embedding` reads the embedding from a local HF safetensors checkpoint (one file or
a sharded index); nothing is ever downloaded.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from sempar.errors import InputError

# Key names of the input embedding in HF checkpoints, most common first.
EMBEDDING_KEYS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
                  "transformer.wte.weight", "gpt_neox.embed_in.weight", "model.embed_in.weight",
                  "embed_tokens.weight", "tok_embeddings.weight")


def load_input_embedding(model_dir: str | Path) -> np.ndarray:
    """float32[V, H]: the input-embedding matrix of the HF safetensors checkpoint in `model_dir`.

    Reads `model.safetensors` or the shards named by `model.safetensors.index.json`; bf16/fp16
    weights are widened to float32. Raises `InputError` when no embedding tensor is found.
    """
    from sempar.models import checkpoint_shards

    d = Path(model_dir)
    shards, files = checkpoint_shards(d)
    if files is None:
        files = {}
        for f in shards:
            files.update({k: f for k in _read_shard(f, lambda h: list(h.keys()))})
    if not files:
        raise InputError(f"{d}: no safetensors checkpoint")
    key = next((k for k in EMBEDDING_KEYS if k in files), None)
    if key is None:
        key = next((k for k in sorted(files) if k.endswith(("embed_tokens.weight", "wte.weight"))),
                   None)
    if key is None:
        raise InputError(f"{d}: no input-embedding tensor (looked for {', '.join(EMBEDDING_KEYS)})")
    # torch reads bf16, which numpy cannot.
    return _read_shard(files[key], lambda h: h.get_tensor(key).float().numpy())


def _read_shard(path: Path, read):
    """read(handle) on safetensors file `path`; a corrupt or truncated file is InputError."""
    from safetensors import safe_open

    from sempar.native_path import utf8_path

    try:
        with utf8_path(path) as name, safe_open(name, "pt") as h:   # UTF-8 names only
            return read(h)
    except Exception as err:     # SafetensorError, OSError, a header that is not JSON
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"{path}: not a readable safetensors file ({reason[:200]})") from None


class EmbeddingOOV:
    """Map unseen token ids to the nearest known token id by cosine of input embeddings.

    Parameters: `embeddings` float32[V, H] (row v = token id v); `block` = the most similarity
    entries computed at once (queries x known tokens), which bounds memory.
    Learned (by `fit`): `known_` int64[K] sorted known token ids that have an embedding,
    `unit_` float32[K, H] their unit-norm embeddings.
    """

    def __init__(self, embeddings: np.ndarray, block: int = 1 << 22):
        self.embeddings = embeddings
        self.block = block

    def fit(self, known_token_ids: np.ndarray) -> "EmbeddingOOV":
        emb = np.asarray(self.embeddings, np.float32)
        if emb.ndim != 2:
            raise InputError(f"embeddings: shape {emb.shape} is not [vocab, hidden]")
        known = np.unique(np.asarray(known_token_ids, np.int64))
        known = known[(known >= 0) & (known < emb.shape[0])]
        unit, ok = _unit_rows(emb[known])
        self.known_ = known[ok]
        self.unit_ = unit[ok]
        return self

    def map(self, token_ids: np.ndarray) -> np.ndarray:
        """int64[T]: each token's own id when known, else its nearest known id, -1 when none."""
        ids = np.asarray(token_ids, np.int64)
        uniq, inv = np.unique(ids, return_inverse=True)
        out = np.full(uniq.size, -1, np.int64)
        if self.known_.size:
            pos = np.minimum(np.searchsorted(self.known_, uniq), self.known_.size - 1)
            known = self.known_[pos] == uniq
        else:
            known = np.zeros(uniq.size, bool)
        out[known] = uniq[known]
        emb = self.embeddings
        query = uniq[~known & (uniq >= 0) & (uniq < emb.shape[0])]
        if query.size and self.known_.size:
            unit, ok = _unit_rows(np.asarray(emb[query], np.float32))
            query, unit = query[ok], unit[ok]
            best = np.empty(query.size, np.int64)
            rows = max(1, self.block // self.known_.size)
            for s in range(0, query.size, rows):
                best[s:s + rows] = np.argmax(unit[s:s + rows] @ self.unit_.T, axis=1)
            out[np.searchsorted(uniq, query)] = self.known_[best]
        return out[inv].reshape(ids.shape)


def _unit_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x with unit-norm rows, bool mask of rows with a non-zero finite norm)."""
    norm = np.linalg.norm(x, axis=1)
    ok = np.isfinite(norm) & (norm > 0)
    return x / np.where(ok, norm, 1.0)[:, None], ok


def fitted_mapper(oov: EmbeddingOOV | None, known_token_ids: np.ndarray) -> EmbeddingOOV | None:
    """A copy of `oov` fitted to `known_token_ids` (the embeddings are shared, not copied)."""
    return None if oov is None else copy.copy(oov).fit(known_token_ids)


def resolve(tokens: np.ndarray, token_id: np.ndarray, oov: EmbeddingOOV | None
            ) -> tuple[np.ndarray, np.ndarray]:
    """(pos int64[T], seen bool[T]): each token's row in the sorted `tokens` after OOV mapping."""
    ids = np.asarray(token_id, np.int64)
    if oov is not None:
        ids = oov.map(ids)
    if tokens.size == 0:
        return np.zeros(ids.shape, np.int64), np.zeros(ids.shape, bool)
    pos = np.minimum(np.searchsorted(tokens, ids), tokens.size - 1)
    return pos, tokens[pos] == ids
