"""A shard's token tables handed from a build worker to the merging process through a file.

Why: `stats.run`'s local runner builds shards in forked workers. Returned through the process
pool, a shard's `RoutingStats` is pickled whole in the worker (a second copy of its token
tables beside the tables) and unpickled whole in the main process beside the running merge:
on 20M DeepSeek-V3-shape tokens in 2M-row shards, 0.94 GB of tables a shard, which put the
main process at 4.6 GB and each worker at up to 3.7 GB. Here the worker writes its token
tables to a private file layer by layer (no copy of the whole) and returns the rest of the
stats (loads, requests, the sample: a few hundred MB at most) with a `SpilledTables` in
place of the tables; the merge (`routing_stats.merge(consume=True)`) reads one layer at a
time from the file and drops it once summed, so the main process holds the running merge and
one shard layer, never a whole shard's tables.

The file is raw array bytes (each layer's data, indices and indptr, in layer order) at
offsets kept in the `SpilledTables` object; it lives in a private temporary folder of the
run (`stats.run`) and is unlinked as soon as it is opened for reading. It is no user-facing
format: the stats file is `stats.file`'s.
"""

from __future__ import annotations

import os

import numpy as np
from scipy import sparse


class SpilledTables:
    """L token tables (CSR [V, N]) in a file (module docstring), read one layer at a time.

    `tables[l]` reads layer l (or returns what was stored there), `tables[l] = x` stores x in
    memory (None drops it); a layer is read at most once from the file unless dropped."""

    def __init__(self, path: str, shape: tuple[int, int],
                 layout: list[tuple[tuple[int, str, int], ...]]):
        self.path, self.shape, self.layout = path, tuple(shape), layout
        self._held: dict[int, sparse.csr_matrix | None] = {}
        self._fd: int | None = None

    def __len__(self) -> int:
        return len(self.layout)

    def __iter__(self):
        return (self[l] for l in range(len(self)))

    def __getitem__(self, l: int) -> sparse.csr_matrix | None:
        if l in self._held:
            return self._held[l]
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            os.unlink(self.path)              # the open descriptor keeps it until closed
        arrays = []
        for offset, dtype, count in self.layout[l]:
            a = np.empty(count, np.dtype(dtype))
            view = memoryview(a).cast("B")
            got = 0
            while got < a.nbytes:            # os.preadv reads at most 2 GiB a call
                n = os.preadv(self._fd, [view[got:]], offset + got)
                if n <= 0:
                    raise OSError(f"{self.path}: the spilled token tables end early")
                got += n
            arrays.append(a)
        data, indices, indptr = arrays
        return sparse.csr_matrix((data, indices, indptr), shape=self.shape)

    def __setitem__(self, l: int, table: sparse.csr_matrix | None) -> None:
        self._held[l] = table
        if table is None and len(self._held) == len(self) \
                and all(t is None for t in self._held.values()):
            self.close()

    def close(self) -> None:
        """Close the file (it was unlinked when opened; unlink it if never read)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        elif os.path.exists(self.path):
            os.unlink(self.path)


def spill_tables(tables: list[sparse.csr_matrix], path: str) -> SpilledTables:
    """Write `tables` (L x CSR [V, N]) to `path` layer by layer, dropping each layer from the
    list once written; the `SpilledTables` that reads them back."""
    layout = []
    at = 0
    shape = tables[0].shape
    with open(path, "wb") as f:
        for l in range(len(tables)):
            t = tables[l]
            parts = []
            for a in (t.data, t.indices, t.indptr):
                a = np.ascontiguousarray(a)
                f.write(memoryview(a).cast("B") if a.size else b"")
                parts.append((at, a.dtype.str, int(a.size)))
                at += a.nbytes
            layout.append(tuple(parts))
            tables[l] = None
    return SpilledTables(path, shape, layout)
