"""SGLang per_token expert-distribution dumps -> RoutingTrace (physical -> logical, requests)."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sempar.errors import InputError  # noqa: E402
from sempar.trace import read_trace  # noqa: E402
from sempar.trace.sglang import import_sglang, request_starts  # noqa: E402

L_MODEL, N, P, K_SLOTS, TOP_K = 4, 6, 8, 8, 2   # layer 0 is dense; 2 redundant replicas
EXTEND, DECODE, IDLE = 1, 2, 4


def make_map(seed: int = 0) -> np.ndarray:
    """int[L, P]: per layer a shuffled physical layout of the 6 logical experts + 2 replicas."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(L_MODEL):
        row = np.concatenate([np.arange(N), rng.choice(N, P - N, replace=False)])
        rows.append(rng.permutation(row))
    return np.stack(rows)


class Dumper:
    """Writes dumps in SGLang's per_token layout from a known logical routing."""

    def __init__(self, pmap: np.ndarray, seed: int = 1):
        self.pmap = pmap
        self.rng = np.random.default_rng(seed)

    def record(self, rank: int, pass_id: int, ids, positions, mode=EXTEND, seq_lens=None,
               as_tensor=False):
        T = len(ids)
        logical = np.full((T, L_MODEL - 1, TOP_K), -1, np.int64)
        topk = np.full((L_MODEL, T, K_SLOTS), -1, np.int64)  # dense layer 0 stays -1
        for t in range(T):
            for l in range(1, L_MODEL):
                chosen = self.rng.choice(N, TOP_K, replace=False)
                logical[t, l - 1] = chosen
                for s, e in enumerate(chosen):  # a random replica of each logical expert
                    topk[l, t, s] = self.rng.choice(np.flatnonzero(self.pmap[l] == e))
        conv = (lambda x: torch.tensor(x, dtype=torch.int64)) if as_tensor else list
        rec = dict(forward_pass_id=pass_id, rank=rank, gatherer_key="primary",
                   input_ids=conv(ids), positions=conv(positions),
                   extend_seq_lens=seq_lens, forward_mode=mode,
                   topk_ids_of_layer=torch.tensor(topk, dtype=torch.int32), misc_objects=[],
                   global_physical_count=torch.zeros(L_MODEL, P, dtype=torch.int32))
        return rec, logical

    def save(self, path: Path, records: list, pmap: np.ndarray | None = None) -> Path:
        m = self.pmap if pmap is None else pmap
        torch.save({"records": records,
                    "last_physical_to_logical_map": torch.tensor(m, dtype=torch.int64)}, path)
        return path


@pytest.fixture
def dumps(tmp_path):
    pmap = make_map()
    d = Dumper(pmap)
    r0 = [d.record(0, 0, [5, 6, 7, 8, 9, 10, 11], [0, 1, 2, 0, 1, 2, 3], seq_lens=[3, 4]),
          d.record(0, 1, [20, 21, 22, 23, 24, 25], [0, 1, 2, 3, 0, 1], as_tensor=True),
          d.record(0, 2, [30, 31], [4, 5], mode=DECODE),      # consecutive, yet 2 sequences
          d.record(0, 3, [], [], mode=IDLE)]
    r1 = [d.record(1, 0, [40, 41, 42], [5, 6, 7]),            # prefix-cached extend
          d.record(1, 1, [43, 44, 45, 46], [0, 1, 2, 3], as_tensor=True)]
    # rank 1's file comes first on the command line: output follows rank order
    p1 = d.save(tmp_path / "expert_distribution_recorder_1700000000.1_1.pt", [r for r, _ in r1])
    p0 = d.save(tmp_path / "expert_distribution_recorder_1700000000.1_0.pt", [r for r, _ in r0])
    truth = np.concatenate([lg for _, lg in r0 + r1 if lg.shape[0]])
    return [p1, p0], truth, d


def test_import_exact(dumps, tmp_path):
    paths, truth, _ = dumps
    out = tmp_path / "t.parquet"
    seen = []
    s = import_sglang(paths, out, progress=seen.append)
    tr = read_trace(out)
    m = tr.meta
    assert (m.model, m.num_layers, m.layers, m.num_experts, m.top_k, m.vocab_size) == (
        "sglang-dump", 3, (1, 2, 3), N, TOP_K, 47)
    assert m.extra["ranks"] == [0, 1] and m.extra["importer"] == "sempar.import_sglang"
    assert m.extra["tokens_by_forward_mode"] == {"1": 20, "2": 2}  # the empty IDLE pass is skipped
    np.testing.assert_array_equal(tr.experts, truth)            # logical ids, engine slot order
    assert tr.token_id.tolist() == [5, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23, 24, 25, 30, 31,
                                    40, 41, 42, 43, 44, 45, 46]
    assert tr.position.tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 4, 5, 5, 6, 7,
                                    0, 1, 2, 3]
    assert tr.request_id.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 4, 5, 6, 6, 6,
                                      7, 7, 7, 7]
    assert tr.domain is None and tr.weights is None
    assert s["tokens"] == 22 and s["requests"] == 8 and s["records"] == 5 and sum(seen) == 22
    assert s["duplicate_records_dropped"] == 0


def test_request_starts():
    pos = np.array([0, 1, 2, 0, 1, 7, 8, 3])
    assert request_starts(pos).tolist() == [1, 0, 0, 1, 0, 1, 0, 1]
    assert request_starts(pos, np.array([2, 6])).tolist() == [1, 0, 1, 0, 0, 0, 0, 0]
    assert request_starts(np.array([4, 5, 6]), None, DECODE).tolist() == [1, 1, 1]
    assert request_starts(np.array([], np.int64)).tolist() == []


def test_options_and_overrides(dumps, tmp_path):
    paths, truth, _ = dumps
    out = tmp_path / "o.parquet"
    import_sglang(paths, out, model="ds-tiny", num_experts=12, top_k=2, vocab_size=1000)
    tr = read_trace(out)
    assert (tr.meta.model, tr.meta.num_experts, tr.meta.vocab_size) == ("ds-tiny", 12, 1000)
    np.testing.assert_array_equal(tr.experts, truth)
    for kw, msg in ((dict(num_experts=5), "num-experts"), (dict(vocab_size=46), "vocab-size 46"),
                    (dict(top_k=1), "top-k 1"), (dict(on_incomplete="skip"), "on_incomplete")):
        with pytest.raises(InputError, match=msg):
            import_sglang(paths, tmp_path / "bad.parquet", **kw)
    with pytest.raises(InputError, match="top-k 3: the MoE layers of the dumps use 2"):
        import_sglang(paths, tmp_path / "bad.parquet", top_k=3)  # slot 3 is -1 everywhere
    assert not (tmp_path / "bad.parquet").exists()


def test_attention_tp_duplicates(tmp_path):
    """Every TP rank records the same pass: kept once unless dedup=False."""
    d = Dumper(make_map(3), seed=5)
    recs = [d.record(0, i, [1 + i, 2, 3], [0, 1, 2])[0] for i in range(3)]
    p0 = d.save(tmp_path / "x_0.pt", recs)
    p1 = d.save(tmp_path / "x_1.pt", [dict(r, rank=1) for r in recs])
    s = import_sglang([p0, p1], tmp_path / "a.parquet")
    assert (s["tokens"], s["requests"], s["duplicate_records_dropped"]) == (9, 3, 3)
    s = import_sglang([p0, p1], tmp_path / "b.parquet", dedup=False)
    assert (s["tokens"], s["requests"]) == (18, 6)
    a, b = read_trace(tmp_path / "a.parquet"), read_trace(tmp_path / "b.parquet")
    np.testing.assert_array_equal(np.concatenate([a.experts, a.experts]), b.experts)


def _bad(tmp_path, d, mutate=None, records=None, obj=None, name="bad_0.pt") -> Path:
    p = tmp_path / name
    if obj is not None:
        torch.save(obj, p)
        return p
    recs = records if records is not None else [d.record(0, 0, [1, 2, 3], [0, 1, 2])[0]]
    if mutate:
        mutate(recs[0])
    return d.save(p, recs)


def test_incomplete_rows(tmp_path):
    d = Dumper(make_map())
    rec = d.record(0, 0, [1, 2, 3], [0, 1, 2])[0]
    rec["topk_ids_of_layer"][2, 1, 1] = -1
    p = d.save(tmp_path / "inc_0.pt", [rec])
    with pytest.raises(InputError, match=r"record 0: topk_ids_of_layer: layer 2 token 1: -1"):
        import_sglang([p], tmp_path / "x.parquet")
    s = import_sglang([p], tmp_path / "x.parquet", on_incomplete="drop")
    tr = read_trace(tmp_path / "x.parquet")
    assert s["dropped_tokens"] == 1 and tr.token_id.tolist() == [1, 3]
    assert tr.position.tolist() == [0, 2] and tr.request_id.tolist() == [0, 0]


@pytest.mark.parametrize("case, pattern", [
    ("no_records", r"missing key 'records'"),
    ("no_map", r"missing key 'last_physical_to_logical_map'"),
    ("not_dict", r"top level is list"),
    ("garbage", r"not a readable SGLang dump"),
    ("unsafe_object", r"not a readable SGLang dump \(torch.load with weights_only"),
    ("missing_positions", r"record 0: missing field 'positions'"),
    ("positions_len", r"record 0: positions: 2 values for 3 input_ids"),
    ("topk_tokens", r"record 0: topk_ids_of_layer: shape \(4, 2, 8\)"),
    ("topk_layers", r"record 0: topk_ids_of_layer: shape \(3, 3, 8\)"),
    ("topk_2d", r"record 0: topk_ids_of_layer: shape \(4, 24\) is not 3-D"),
    ("topk_float", r"topk_ids_of_layer: dtype torch.float32 is not an integer"),
    ("phys_range", r"record 0: topk_ids_of_layer: layer 1 token 0 slot 0: physical id 8 out of range"),
    ("neg_token", r"record 0: input_ids: token 2: id -4 is negative"),
    ("seq_lens", r"record 0: extend_seq_lens: \[1, 1\] does not sum"),
    ("replica_dup", r"record 0: topk_ids_of_layer: layer 1 token 0: physical ids .* repeated logical"),
    ("map_neg", r"last_physical_to_logical_map: layer 0 physical 0: logical id -1"),
    ("missing_file", r"no such file"),
    ("two_ranks", r"records of several ranks \[0, 1\]"),
])
def test_bad_dumps(case, pattern, tmp_path):
    pmap = make_map()
    d = Dumper(pmap)
    if case == "no_records":
        p = _bad(tmp_path, d, obj={"last_physical_to_logical_map": torch.tensor(pmap)})
    elif case == "no_map":
        p = _bad(tmp_path, d, obj={"records": []})
    elif case == "not_dict":
        p = _bad(tmp_path, d, obj=[1, 2])
    elif case == "garbage":
        p = tmp_path / "g_0.pt"
        p.write_bytes(b"not a zip")
    elif case == "unsafe_object":
        p = _bad(tmp_path, d, obj={"records": [], "when": datetime.date(2020, 1, 1),
                                   "last_physical_to_logical_map": torch.tensor(pmap)})
    elif case == "missing_positions":
        p = _bad(tmp_path, d, lambda r: r.pop("positions"))
    elif case == "positions_len":
        p = _bad(tmp_path, d, lambda r: r.update(positions=[0, 1]))
    elif case == "topk_tokens":
        p = _bad(tmp_path, d, lambda r: r.update(topk_ids_of_layer=r["topk_ids_of_layer"][:, :2]))
    elif case == "topk_layers":
        p = _bad(tmp_path, d, lambda r: r.update(topk_ids_of_layer=r["topk_ids_of_layer"][:3]))
    elif case == "topk_2d":
        p = _bad(tmp_path, d, lambda r: r.update(topk_ids_of_layer=r["topk_ids_of_layer"].reshape(4, -1)))
    elif case == "topk_float":
        p = _bad(tmp_path, d, lambda r: r.update(topk_ids_of_layer=r["topk_ids_of_layer"].float()))
    elif case == "phys_range":
        p = _bad(tmp_path, d, lambda r: r["topk_ids_of_layer"].__setitem__((1, 0, 0), P))
    elif case == "neg_token":
        p = _bad(tmp_path, d, lambda r: r.update(input_ids=[1, 2, -4]))
    elif case == "seq_lens":
        p = _bad(tmp_path, d, lambda r: r.update(extend_seq_lens=[1, 1]))
    elif case == "replica_dup":
        e = int(pmap[1][np.bincount(pmap[1]).argmax() == pmap[1]][0])
        phys = np.flatnonzero(pmap[1] == e)[:2]  # both replicas of one logical expert

        def dup(r):
            r["topk_ids_of_layer"][1, 0, :2] = torch.tensor(phys)
        p = _bad(tmp_path, d, dup)
    elif case == "map_neg":
        bad = pmap.copy()
        bad[0, 0] = -1
        p = d.save(tmp_path / "m_0.pt", [d.record(0, 0, [1], [0])[0]], pmap=bad)
    elif case == "missing_file":
        p = tmp_path / "nope_0.pt"
    elif case == "two_ranks":
        p = _bad(tmp_path, d, records=[d.record(0, 0, [1], [0])[0], d.record(1, 0, [1], [0])[0]])
    with pytest.raises(InputError, match=pattern) as e:
        import_sglang([p], tmp_path / "out.parquet")
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400
    if case not in ("missing_file",):
        assert str(p) in msg  # names the file
    assert not (tmp_path / "out.parquet").exists()


def test_rank_given_twice(tmp_path):
    d = Dumper(make_map())
    a = d.save(tmp_path / "a_0.pt", [d.record(0, 0, [1], [0])[0]])
    b = d.save(tmp_path / "b_0.pt", [d.record(0, 0, [2], [0])[0]])
    with pytest.raises(InputError, match="rank 0: given twice"):
        import_sglang([a, b], tmp_path / "o.parquet")
    with pytest.raises(InputError, match="no SGLang dump"):
        import_sglang([], tmp_path / "o.parquet")


def test_rank_from_file_name_and_layers_mismatch(tmp_path):
    d = Dumper(make_map())
    rec = d.record(0, 0, [1, 2], [0, 1])[0]
    rec.pop("rank")
    a = d.save(tmp_path / "expert_distribution_recorder_1.5_3.pt", [rec])
    s = import_sglang([a], tmp_path / "o.parquet")
    assert s["ranks"] == [3]
    b = tmp_path / "other_0.pt"
    torch.save({"records": [], "last_physical_to_logical_map": torch.zeros(2, P, dtype=torch.int64)}, b)
    with pytest.raises(InputError, match="has 2 layers"):
        import_sglang([a, b], tmp_path / "o2.parquet")
