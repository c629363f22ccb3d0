"""Recorder: exact router capture from tiny random HF MoE models of every supported family."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sempar import models as loading  # noqa: E402
from sempar.errors import InputError  # noqa: E402
from sempar.models import load_model, load_tokenizer, resolve_model  # noqa: E402
from sempar.trace import read_trace  # noqa: E402
from sempar.trace import record as rec  # noqa: E402
from sempar.trace.record import (DOC_MARKER, RecordJob, find_routers, parse_text_arg,  # noqa: E402
                                 record, split_requests)

V = 300
COMMON = dict(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _configs() -> dict:
    from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, GptOssConfig,
                              GptOssForCausalLM, MixtralConfig, MixtralForCausalLM, OlmoeConfig,
                              OlmoeForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM)

    return {
        "mixtral": (MixtralForCausalLM, MixtralConfig(**COMMON, num_local_experts=8,
                                                      num_experts_per_tok=2)),
        # layer 1 dense (mlp_only_layers): the trace has model layers (0, 2)
        "qwen2_moe": (Qwen2MoeForCausalLM, Qwen2MoeConfig(
            **COMMON, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[1])),
        "qwen3_moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(
            **COMMON, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
            head_dim=8, norm_topk_prob=True)),
        "olmoe": (OlmoeForCausalLM, OlmoeConfig(**COMMON, num_experts=16, num_experts_per_tok=3)),
        # MLA attention needs as many key/value heads as query heads
        "deepseek_v3": (DeepseekV3ForCausalLM, DeepseekV3Config(
            **{**COMMON, "num_key_value_heads": 4}, n_routed_experts=16, num_experts_per_tok=4,
            n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1,
            moe_intermediate_size=32, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=8, routed_scaling_factor=2.5, norm_topk_prob=True)),
        # GPT-OSS alternates sliding/full attention; the default YaRN rope wants a long context
        "gpt_oss": (GptOssForCausalLM, GptOssConfig(
            **COMMON, num_local_experts=8, num_experts_per_tok=2, head_dim=8, sliding_window=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    }


FAMILIES = list(_configs())
EXPECTED = {  # model layers with a router, experts, top-k, shared experts, groups
    "mixtral": ((0, 1, 2), 8, 2, 0, (1, 1)),
    "qwen2_moe": ((0, 2), 8, 2, 1, (1, 1)),
    "qwen3_moe": ((0, 1, 2), 16, 4, 0, (1, 1)),
    "olmoe": ((0, 1, 2), 16, 3, 0, (1, 1)),
    "deepseek_v3": ((1, 2), 16, 4, 1, (4, 2)),
    "gpt_oss": ((0, 1, 2), 8, 2, 0, (1, 1)),
}


def _build(family: str):
    cls, config = _configs()[family]
    torch.manual_seed(1234)
    model = cls(config).eval()
    g = torch.Generator().manual_seed(99)
    for site in find_routers(model):
        # decisive routers (logit std ~ 3) so that float noise cannot flip a near tie
        with torch.no_grad():
            site.module.weight.copy_(torch.randn(site.module.weight.shape, generator=g) * 0.5)
            if hasattr(site.module, "e_score_correction_bias"):
                site.module.e_score_correction_bias.copy_(
                    (torch.rand(site.module.num_experts, generator=g) - 0.5) * 0.6)
    return model


@pytest.fixture(scope="module")
def models() -> dict:
    return {f: _build(f) for f in FAMILIES}


class ByteTok:
    """Trivial tokenizer: UTF-8 bytes (all < V)."""

    def encode(self, text: str) -> list[int]:
        return [b % V for b in text.encode("utf-8")]


CODE = ("def f(x):\n    return x + 1\n\n\n"
        "class A:\n    pass\n" + DOC_MARKER + "\nimport os\nprint(os.getcwd())\n   \n"
        "for i in range(3):\n    print(i)\n")
PROSE = ("The cat sat on the mat. It was a sunny day and the birds were singing.\n\n"
         "Expert parallelism moves tokens between devices.\n" + DOC_MARKER + "\n" + DOC_MARKER
         + "\nShort one.\nWith a second line that is rather long, long, long, long, long indeed.\n")


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("texts")
    (d / "code.txt").write_text(CODE, encoding="utf-8")
    (d / "prose.txt").write_text(PROSE, encoding="utf-8")
    return d / "code.txt", d / "prose.txt"


PAIRS = [(CODE, "code"), (PROSE, "prose")]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (ByteLevel pre-tokenizer alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _write_byte_tokenizer(path: Path) -> None:
    """A tokenizer.json whose ids are the UTF-8 bytes (same as ByteTok)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))


# ----------------------------------------------------------------------------- requests

def test_split_requests_at_blank_lines_and_doc_marker():
    assert split_requests(CODE) == ["def f(x):\n    return x + 1", "class A:\n    pass",
                                    "import os\nprint(os.getcwd())",
                                    "for i in range(3):\n    print(i)"]
    assert split_requests(PROSE)[1:] == ["Expert parallelism moves tokens between devices.",
                                         "Short one.\nWith a second line that is rather long, "
                                         "long, long, long, long indeed."]
    # the marker must be the whole line; \r\n line ends; no empty requests
    assert split_requests("a <|doc|>\r\nb\r\n\r\n\r\n<|doc|>\n\n") == ["a <|doc|>\nb"]
    assert split_requests("\n\n  \n") == []


# ----------------------------------------------------------------------------- every family

def _router_probe(model):
    """Second hooks (test-owned): each router's input rows and its raw returned indices."""
    store: dict[str, list] = {}
    handles = []
    for site in find_routers(model):
        store[site.name] = []

        def hook(module, args, output, name=site.name):
            h = args[0].reshape(-1, args[0].shape[-1]).detach().float()
            store[name].append((h, output[2].reshape(-1, output[2].shape[-1]).detach()))

        handles.append(site.module.register_forward_hook(hook))
    return store, handles


def _recompute(family: str, module, h: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Independent top-k selection from a router's input rows: (ids, weights) sorted by weight."""
    with torch.no_grad():
        logits = torch.nn.functional.linear(h, module.weight.float(),
                                            getattr(module, "bias", None)).double().numpy()
    k = module.top_k
    if family == "gpt_oss":
        ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(logits, ids, 1)
        w = np.exp(top - top.max(1, keepdims=True))
        return ids, w / w.sum(1, keepdims=True)
    if family == "deepseek_v3":
        ids = _deepseek_select(logits, module.e_score_correction_bias.double().numpy(),
                               module.num_group, module.topk_group, k)
        s = 1 / (1 + np.exp(-logits))
        w = np.take_along_axis(s, ids, 1)
        w = w / w.sum(1, keepdims=True) * module.routed_scaling_factor
        order = np.argsort(-w, axis=1, kind="stable")
        return np.take_along_axis(ids, order, 1), np.take_along_axis(w, order, 1)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, 1)
    if family == "mixtral" or getattr(module, "norm_topk_prob", False):
        w = w / w.sum(1, keepdims=True)
    return ids, w


def _deepseek_select(logits, bias, n_group, topk_group, k):
    """DeepSeek-V3 group-limited choice: sigmoid + bias, best groups by top-2 sum, top-k."""
    s = 1 / (1 + np.exp(-logits)) + bias
    T, N = s.shape
    grouped = s.reshape(T, n_group, N // n_group)
    gscore = np.sort(grouped, axis=2)[:, :, -2:].sum(2)
    best = np.argsort(-gscore, axis=1, kind="stable")[:, :topk_group]
    allowed = np.zeros((T, n_group), bool)
    np.put_along_axis(allowed, best, True, 1)
    masked = np.where(np.repeat(allowed, N // n_group, axis=1), s, -np.inf)
    return np.argsort(-masked, axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("family", FAMILIES)
def test_record_family_exact(family, models, texts, tmp_path):
    model = models[family]
    layers, N, k, shared, groups = EXPECTED[family]
    store, handles = _router_probe(model)
    try:
        out = tmp_path / "t.parquet"
        seen = []
        summary = record(model, ByteTok(), PAIRS, out, max_tokens=40, batch_size=1,
                         progress=seen.append, model_name=family)
    finally:
        for h in handles:
            h.remove()
    tr = read_trace(out)
    m = tr.meta
    assert (m.layers, m.num_experts, m.top_k, m.shared_experts) == (layers, N, k, shared)
    assert (m.num_expert_groups, m.topk_groups) == groups
    assert m.num_layers == len(layers) and m.vocab_size == V and m.model == family
    assert m.extra["recorder"] == "sempar.record" and m.extra["dtype"] == "float32"
    assert m.extra["max_tokens"] == 40
    assert summary["tokens"] == tr.num_tokens == sum(seen)
    assert len(seen) == tr.num_requests  # one progress call per batch of 1

    # requests, positions, tokens, domains, truncation
    pieces = [(p, d) for text, d in PAIRS for p in split_requests(text)]
    assert tr.num_requests == len(pieces) == 7
    tok = ByteTok()
    for r, (piece, d) in enumerate(pieces):
        rows = tr.request_id == r
        want = tok.encode(piece)[:40]
        assert tr.token_id[rows].tolist() == want
        assert tr.position[rows].tolist() == list(range(len(want)))
        assert set(tr.domain_names()[rows]) == {d}
    assert tr.position.max() == 39 and summary["truncated_requests"] >= 1
    assert list(tr.domains) == ["code", "prose"]

    # weights sorted decreasing, slot 0 = highest
    assert (np.diff(tr.weights, axis=2) <= 0).all()

    # every captured row equals an independent recomputation from the router's input, and the
    # set the router itself returned
    for li, site in enumerate(find_routers(model)):
        h = torch.cat([x for x, _ in store[site.name]])
        raw = torch.cat([i for _, i in store[site.name]]).numpy()
        assert h.shape[0] == tr.num_tokens  # batch 1: router rows = tokens, in order
        ids, w = _recompute(family, site.module, h)
        np.testing.assert_array_equal(tr.experts[:, li, :], ids)
        np.testing.assert_allclose(tr.weights[:, li, :], w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.sort(tr.experts[:, li, :], 1), np.sort(raw, 1))


def test_deepseek_group_limit_and_bias(models, tmp_path):
    """Captured = the router's own bias-corrected, group-limited choice, not the bias-free one."""
    model = models["deepseek_v3"]
    store, handles = _router_probe(model)
    try:
        record(model, ByteTok(), PAIRS, tmp_path / "d.parquet", batch_size=1)
    finally:
        for h in handles:
            h.remove()
    tr = read_trace(tmp_path / "d.parquet")
    groups = tr.experts // (16 // 4)
    n_groups = np.array([[len(set(row)) for row in layer] for layer in groups.transpose(1, 0, 2)])
    assert n_groups.max() <= 2 and (n_groups == 2).any()
    differ = 0
    for li, site in enumerate(find_routers(model)):
        h = torch.cat([x for x, _ in store[site.name]])
        with torch.no_grad():
            logits = torch.nn.functional.linear(h, site.module.weight.float()).double().numpy()
        no_bias = _deepseek_select(logits, np.zeros(16), 4, 2, 4)
        got = np.sort(tr.experts[:, li, :], 1)
        differ += int((np.sort(no_bias, 1) != got).any(1).sum())
        raw = torch.cat([i for _, i in store[site.name]]).numpy()
        np.testing.assert_array_equal(np.sort(raw, 1), got)  # the router's own set
        assert (raw != tr.experts[:, li, :]).any()  # topk(sorted=False): re-sorting mattered
    assert differ > 0, "the random bias should change some tokens' experts"
    # DeepSeek's topk(sorted=False) order differs from weight order; the trace is re-sorted
    assert (np.diff(tr.weights, axis=2) <= 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_batching_does_not_change_routing(family, models, tmp_path):
    model = models[family]
    a, b = tmp_path / "b1.parquet", tmp_path / "b4.parquet"
    record(model, ByteTok(), PAIRS, a, max_tokens=64, batch_size=1)
    record(model, ByteTok(), PAIRS, b, max_tokens=64, batch_size=4)
    ta, tb = read_trace(a), read_trace(b)
    for col in ("token_id", "request_id", "position", "domain"):
        np.testing.assert_array_equal(getattr(ta, col), getattr(tb, col))
    np.testing.assert_array_equal(ta.experts, tb.experts)  # right padding is invisible
    np.testing.assert_allclose(ta.weights, tb.weights, rtol=1e-4, atol=1e-5)


def test_deterministic_bytes(models, tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    record(models["qwen3_moe"], ByteTok(), PAIRS, a, batch_size=3)
    record(models["qwen3_moe"], ByteTok(), PAIRS, b, batch_size=3)
    assert a.read_bytes() == b.read_bytes()


def test_without_weights_same_experts(models, tmp_path):
    from sempar.trace import read_trace

    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    record(models["qwen3_moe"], ByteTok(), PAIRS, a, batch_size=3)
    record(models["qwen3_moe"], ByteTok(), PAIRS, b, batch_size=3, weights=False)
    ta, tb = read_trace(a), read_trace(b)
    assert ta.weights is not None and tb.weights is None
    assert (ta.experts == tb.experts).all()
    assert b.stat().st_size < a.stat().st_size


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3", "gpt_oss"])
def test_cli_level_job_matches_record(family, models, texts, tmp_path):
    """Saved model + tokenizer.json through RecordJob == record() on the in-memory model."""
    model_dir = tmp_path / f"tiny-{family}"
    models[family].save_pretrained(model_dir)
    _write_byte_tokenizer(model_dir / "tokenizer.json")
    assert load_tokenizer(model_dir).encode(CODE + PROSE) == ByteTok().encode(CODE + PROSE)
    code, prose = texts
    job = RecordJob.prepare(str(model_dir), [str(code), f"{prose}:prose"], max_tokens=32)
    assert job.total_tokens == sum(min(len(ByteTok().encode(p)), 32)
                                   for t, _ in PAIRS for p in split_requests(t))
    calls = []
    summary = job.run(tmp_path / "job.parquet", batch_size=2, progress=calls.append)
    assert sum(calls) == summary["tokens"] == job.total_tokens
    record(models[family], ByteTok(), PAIRS, tmp_path / "direct.parquet", max_tokens=32,
           batch_size=2, model_name=model_dir.name)
    assert (tmp_path / "job.parquet").read_bytes() == (tmp_path / "direct.parquet").read_bytes()
    assert read_trace(tmp_path / "job.parquet").domain_counts() == summary["domains"]


def test_hooks_removed_after_error(models, tmp_path):
    model = models["mixtral"]
    routers = [s.module for s in find_routers(model)]

    def boom(module, args):
        raise RuntimeError("boom in layer 1")

    h = model.model.layers[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            record(model, ByteTok(), PAIRS, tmp_path / "x.parquet")
    finally:
        h.remove()
    assert all(len(r._forward_hooks) == 0 for r in routers)
    assert list(tmp_path.iterdir()) == []  # no trace, no temporary file
    record(model, ByteTok(), PAIRS, tmp_path / "ok.parquet")  # the model still works
    assert all(len(r._forward_hooks) == 0 for r in routers)


def test_bad_inputs(models, tmp_path):
    with pytest.raises(InputError, match="vocabulary"):
        record(models["olmoe"], type("T", (), {"encode": lambda self, t: [V + 5]})(), PAIRS,
               tmp_path / "x.parquet")
    with pytest.raises(InputError, match="no tokens"):
        record(models["olmoe"], ByteTok(), [("\n\n" + DOC_MARKER + "\n", "a")], tmp_path / "x.parquet")
    with pytest.raises(InputError, match="batch-size"):
        record(models["olmoe"], ByteTok(), PAIRS, tmp_path / "x.parquet", batch_size=0)
    assert not (tmp_path / "x.parquet").exists()


def test_generic_router_with_dense_weights(tmp_path):
    """An unregistered model type: routers found by class name; a dense [T, N] 2nd output
    is gathered at the indices; layers without a router are left out of layer_ids."""

    class ToyTopKRouter(torch.nn.Module):
        def __init__(self, n, k, h, seed):
            super().__init__()
            self.num_experts, self.top_k = n, k
            self.weight = torch.nn.Parameter(torch.randn(n, h, generator=torch.Generator().manual_seed(seed)))

        def forward(self, x):
            logits = x.reshape(-1, x.shape[-1]) @ self.weight.T
            probs = logits.softmax(-1)
            idx = probs.topk(self.top_k, dim=-1, sorted=False).indices.flip(-1)
            return logits, probs, idx  # dense scores, ascending order

    class Block(torch.nn.Module):
        def __init__(self, moe, seed):
            super().__init__()
            if moe:
                self.gate = ToyTopKRouter(6, 3, 8, seed)

        def forward(self, x):
            if hasattr(self, "gate"):
                self.gate(x)
            return torch.tanh(x)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = transformers.PretrainedConfig(vocab_size=V)
            self.config.model_type = "toy"
            self.emb = torch.nn.Embedding(V, 8)
            self.layers = torch.nn.ModuleList([Block(i != 1, i) for i in range(3)])

        def forward(self, input_ids, attention_mask=None):
            x = self.emb(input_ids)
            for layer in self.layers:
                x = layer(x)
            return x

    toy = Toy()
    record(toy, ByteTok(), PAIRS[:1], tmp_path / "toy.parquet", batch_size=2, model_name="toy")
    tr = read_trace(tmp_path / "toy.parquet")
    assert tr.meta.layers == (0, 2) and tr.meta.num_experts == 6 and tr.meta.top_k == 3
    x = toy.emb(torch.tensor(tr.token_id, dtype=torch.long))
    with torch.no_grad():
        p0 = (x @ toy.layers[0].gate.weight.T).softmax(-1)
    top = p0.topk(3, dim=-1)
    np.testing.assert_array_equal(tr.experts[:, 0, :], top.indices.numpy())
    np.testing.assert_allclose(tr.weights[:, 0, :], top.values.numpy(), rtol=1e-6)


# ----------------------------------------------------------------------------- resolution

def test_resolve_names_dirs_and_text_args(tmp_path, monkeypatch):
    assets = tmp_path / "assets"
    (assets / "models" / "tiny-moe64").mkdir(parents=True)
    (assets / "models" / "tiny-moe64" / "config.json").write_text("{}")
    (assets / "models" / "tiny-own").mkdir()
    (assets / "models" / "tiny-own" / "config.json").write_text("{}")
    (assets / "models" / "tiny-own" / "tokenizer.json").write_text("{}")
    (assets / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(loading, "ASSETS_DIR", assets)
    monkeypatch.setattr(loading, "MODELS_DIR", assets / "models")
    monkeypatch.chdir(tmp_path)

    src = resolve_model("tiny-moe64")
    assert (src.name, src.model_dir, src.tokenizer_path) == (
        "tiny-moe64", assets / "models" / "tiny-moe64", assets / "tokenizer.json")
    assert resolve_model("tiny-own").tokenizer_path == assets / "models" / "tiny-own" / "tokenizer.json"
    assert loading.known_models() == ["tiny-moe64", "tiny-own"]
    direct = resolve_model(str(assets / "models" / "tiny-own"))
    assert direct.name == "tiny-own"
    with pytest.raises(InputError, match=r"known: tiny-moe64, tiny-own") as e:
        resolve_model("tiny-mixtral")
    assert "\n" not in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json"):
        resolve_model(str(tmp_path / "empty"))
    with pytest.raises(InputError, match="safetensors"):
        load_model("tiny-moe64")
    monkeypatch.setattr(loading, "MODELS_DIR", tmp_path / "nowhere")
    with pytest.raises(InputError, match="none installed"):
        resolve_model("tiny-moe64")

    (tmp_path / "code.txt").write_text("x")
    (tmp_path / "a:b.txt").write_text("y")
    (tmp_path / "sub").mkdir()
    assert parse_text_arg("code.txt") == (Path("code.txt"), "code")
    assert parse_text_arg("code.txt:python") == (Path("code.txt"), "python")
    assert parse_text_arg("a:b.txt") == (Path("a:b.txt"), "a:b")
    with pytest.raises(InputError, match="no such file"):
        parse_text_arg("missing.txt:dom")
    with pytest.raises(InputError, match="no such file"):
        parse_text_arg("sub:x/code.txt")  # ':' followed by a path is not a domain
    with pytest.raises(InputError, match="folder"):
        parse_text_arg("sub")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="UTF-8"):
        rec.read_texts(["bad.txt"])
    with pytest.raises(InputError, match="at least one"):
        RecordJob.prepare("tiny-moe64", [])


def test_meta_json_has_no_timestamp(models, tmp_path):
    import pyarrow.parquet as pq

    record(models["mixtral"], ByteTok(), PAIRS[:1], tmp_path / "m.parquet", model_name="m")
    md = pq.ParquetFile(tmp_path / "m.parquet").metadata
    block = json.loads(md.metadata[b"sempar.trace"])
    assert set(block["meta"]["extra"]) >= {"recorder", "dtype", "max_tokens", "batch_size"}
    text = json.dumps(block) + md.created_by
    assert "time" not in text.lower()


def test_domains_optional(models, tmp_path):
    record(models["olmoe"], ByteTok(), [(CODE, None), (PROSE, "prose")], tmp_path / "a.parquet")
    tr = read_trace(tmp_path / "a.parquet")
    names = tr.domain_names()
    assert tr.domains == ["prose"] and names[tr.request_id < 4].tolist() == [None] * int((tr.request_id < 4).sum())
    assert set(names[tr.request_id >= 4]) == {"prose"}
    record(models["olmoe"], ByteTok(), [(CODE, None)], tmp_path / "b.parquet")
    assert read_trace(tmp_path / "b.parquet").domain is None
