"""Request-level expert activation (Sem-MoE A.1, Fig. 6(a)): requests of one domain activate similar experts.

A request's **activation vector** is float64[L * N]: per layer, the share of its token-expert
selections that went to each expert (each layer's block sums to 1). Sem-MoE projects such vectors
of one layer with t-SNE; we use all layers, reduce with PCA to at most 50 dimensions, then t-SNE to
2-D for the picture. Two figures say how well domains separate, computed on the PCA vectors (not on
the picture): the silhouette of the domain labels (cosine distance, in [-1, 1]) and the k-nearest-
neighbour domain purity (share of each request's 5 nearest requests that share its domain), set
beside its chance level (the sum of squared domain shares).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def request_counts(request_index: np.ndarray, experts: np.ndarray, num_requests: int,
                   num_experts: int) -> np.ndarray:
    """int64[R, N] (or int64[R, L, N]): how many times each request selected each expert.

    request_index int[T]: each occurrence's request, in [0, num_requests); experts int[T, k]:
    one layer's selections, or int[T, L, k]: every layer's (then counted per layer)."""
    ridx = request_index.astype(np.int64)
    if experts.ndim == 2:
        key = ridx[:, None] * num_experts + experts
        shape: tuple[int, ...] = (num_requests, num_experts)
    else:
        L = experts.shape[1]
        key = (ridx[:, None, None] * L + np.arange(L)[None, :, None]) * num_experts + experts
        shape = (num_requests, L, num_experts)
    return np.bincount(key.ravel(), minlength=int(np.prod(shape))).reshape(shape)


def activation_vectors(request_id: np.ndarray, experts: np.ndarray,
                       num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(request ids int64[R], vectors float64[R, L * N]) for the requests present.

    request_id: int[T]; experts: int[T, L, k].
    """
    reqs, ridx = np.unique(request_id, return_inverse=True)
    L = experts.shape[1]
    counts = request_counts(ridx, experts, reqs.size, num_experts).astype(np.float64)
    counts /= np.maximum(counts.sum(axis=2, keepdims=True), 1.0)
    return reqs, counts.reshape(reqs.size, L * num_experts)


@dataclass
class RequestEmbedding:
    """2-D picture of requests and how well their domains separate."""

    request_id: np.ndarray   # int64[R]
    domain: np.ndarray       # int16[R]  (-1 unknown)
    xy: np.ndarray           # float64[R, 2]  t-SNE coordinates
    silhouette: float | None
    knn_purity: float | None
    knn_chance: float | None

    def summary(self, domains: list[str]) -> dict:
        return {"requests": int(self.request_id.size), "domains": list(domains),
                "silhouette": self.silhouette, "knn_purity": self.knn_purity,
                "knn_chance": self.knn_chance}


def embed_requests(request_id: np.ndarray, request_domain: np.ndarray, vectors: np.ndarray,
                   seed: int = 0, neighbours: int = 5) -> RequestEmbedding:
    """PCA + t-SNE of activation vectors; domain separation figures (None when < 2 domains).

    request_domain: int16[R] aligned with `vectors`.
    """
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE
    from sklearn.metrics import silhouette_score
    from sklearn.neighbors import NearestNeighbors

    from threadpoolctl import threadpool_limits

    R = vectors.shape[0]
    if R < 3:
        return RequestEmbedding(request_id, request_domain, np.zeros((R, 2)), None, None, None)
    dims = int(min(50, R - 1, vectors.shape[1]))
    # Thread pools oversubscribe a small shared machine: t-SNE of a thousand points is
    # faster on one thread than fighting for two busy cores.
    with threadpool_limits(1):
        reduced = PCA(n_components=dims, random_state=seed).fit_transform(vectors)
        perplexity = float(min(30.0, max(2.0, (R - 1) / 3.0)))
        xy = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed,
                  max_iter=500, n_jobs=1).fit_transform(reduced)
    labelled = request_domain >= 0
    labels = request_domain[labelled]
    sil = purity = chance = None
    if np.unique(labels).size >= 2 and labelled.sum() > neighbours + 1:
        X = reduced[labelled]
        sil = float(silhouette_score(X, labels, metric="cosine", random_state=seed))
        nn = NearestNeighbors(n_neighbors=neighbours + 1, metric="cosine").fit(X)
        idx = nn.kneighbors(X, return_distance=False)[:, 1:]
        purity = float((labels[idx] == labels[:, None]).mean())
        share = np.bincount(labels) / labels.size
        chance = float((share**2).sum())
    return RequestEmbedding(request_id, request_domain, xy, sil, purity, chance)
