"""`sempar router` on loopback against the `FakeEngine` fixture (tests/router_upstream.py): the
rank in the engine's field or header, streams byte-identical and chunk by chunk, every fault of
issue 29 (502, 504, 429, 4xx, client gone -> upstream cancelled), security (Authorization passed
through, never logged; --api-key; body limit), metrics, the routing log, start-up refusals."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from router_upstream import FakeEngine, free_port, serve_in_thread, sse_events
from sempar.errors import InputError
from sempar.placement.placement import Placement
from sempar.predict.token_table import TokenTable
from sempar.router.config import RouterConfig
from sempar.prompt import PromptTokenizer
from sempar.router.serve import load_router

MODEL = Path(__file__).resolve().parents[2] / "src/sempar/assets/models/tiny-moe64"
G = 4


def words_table(tok: PromptTokenizer) -> TokenTable:
    """Token table: the tokens of 'cat dog' vote rank 2 at every layer, those of 'sun moon' rank 1."""
    a, b = tok.encode(" cat dog cat dog"), tok.encode(" sun moon sun moon")
    ids = sorted(set(a) | set(b))
    dev = np.array([[2 if i in a else 1 for i in ids]] * 3)
    return TokenTable(np.array(ids), dev, np.full(dev.shape, 0.9, np.float32))


@pytest.fixture(scope="module")
def placement_file(tmp_path_factory) -> Path:
    tok = PromptTokenizer(MODEL)
    p = Placement(np.tile(np.arange(8), (3, 1)), 8, G, method="test", token_table=words_table(tok))
    path = tmp_path_factory.mktemp("router") / "p.json"
    p.save(path)
    return path


@pytest.fixture
def stack(placement_file, tmp_path, request):
    """(router URL, FakeEngine, RouterState, routing-log path); knobs via indirect params."""
    opts = dict(getattr(request, "param", {}))
    engine = opts.pop("engine", "sglang")
    fake = FakeEngine(gated=opts.pop("gated", False), delay=opts.pop("delay", 2.0))
    up_url, up_stop = serve_in_thread(fake.app) if not opts.pop("down", False) else (
        f"http://127.0.0.1:{free_port()}", lambda: None)
    log = tmp_path / "routing.jsonl"
    cfg = RouterConfig(upstream=up_url, engine=engine, dp_size=G, log_routing=log, **opts)
    app = load_router(cfg, str(placement_file), str(MODEL))
    url, stop = serve_in_thread(app)
    yield url, fake, app.state.router, log
    stop()
    up_stop()


def settled(st, timeout: float = 2.0) -> bool:
    """True once every rank is released (the release runs just after the last byte is sent)."""
    t0 = time.monotonic()
    while any(st.inflight) or any(st.policy.queued):
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.01)
    return True


def open_gate(fake) -> None:
    """Let the fixture send its stream's second event (it may not be waiting on `go` yet: its
    loop is known once it waits)."""
    t0 = time.monotonic()
    while fake.go._loop is None and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    fake.go._loop.call_soon_threadsafe(fake.go.set)


def chat(text: str, stream: bool = False) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}


def test_chat_goes_to_the_rank_of_its_experts_with_the_sglang_header(stack):
    url, fake, st, log = stack
    r = httpx.post(url + "/v1/chat/completions", json=chat("cat dog cat dog cat"), timeout=10,
                   headers={"Authorization": "Bearer client-secret"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
    assert r.headers["x-fake"] == "1"
    got = fake.received[-1]
    assert got["headers"]["x-data-parallel-rank"] == "2"
    assert got["headers"]["authorization"] == "Bearer client-secret"     # passed through
    assert json.loads(got["body"]) == chat("cat dog cat dog cat")          # body untouched
    httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "sun moon sun"}, timeout=10)
    assert fake.received[-1]["headers"]["x-data-parallel-rank"] == "1"
    assert settled(st)                                                     # all released
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["rank"] for r in rows] == [2, 1] and all(r["tokens"] for r in rows)


def test_encode_gives_the_plain_encode_ids():
    """The fast path (`encode_batch_fast`, no offsets) yields what `Tokenizer.encode` does."""
    tok = PromptTokenizer(MODEL)
    assert tok._fast is not None
    for text in ("", " sun moon sun moon", "Ünïcode — 漢字 🙂\n\ttabs  and   spaces",
                 " ".join(f"w{i} the {i % 97}" for i in range(300))):
        assert tok.encode(text) == tok.tok.encode(text, add_special_tokens=False).ids


def test_generate_gets_routed_dp_rank_in_its_body(stack):
    url, fake, _, _ = stack
    ids = PromptTokenizer(MODEL).encode(" sun moon sun moon")
    r = httpx.post(url + "/generate", json={"input_ids": ids, "sampling_params": {}}, timeout=10)
    assert r.status_code == 200
    body = json.loads(fake.received[-1]["body"])
    assert body["routed_dp_rank"] == 1 and body["input_ids"] == ids


@pytest.mark.parametrize("stack", [{"engine": "vllm"}], indirect=True)
def test_vllm_gets_its_header_and_no_generate_route(stack):
    url, fake, _, _ = stack
    httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "cat dog cat"}, timeout=10)
    assert fake.received[-1]["headers"]["x-data-parallel-rank"] == "2"
    r = httpx.post(url + "/generate", json={"text": "x"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"


@pytest.mark.parametrize("stack", [{"gated": True}], indirect=True)
def test_stream_is_byte_identical_and_chunk_by_chunk(stack):
    url, fake, st, _ = stack
    with httpx.stream("POST", url + "/v1/chat/completions", json=chat("cat dog", stream=True),
                      timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        it = r.iter_raw()
        first = next(it)                    # arrives while the fixture holds back event 2
        assert first == sse_events(3)[0]
        open_gate(fake)
        rest = b"".join(it)
    assert first + rest == b"".join(sse_events(3))
    assert settled(st)


def test_models_health_metrics(stack):
    url, fake, _, _ = stack
    assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == "fake"
    h = httpx.get(url + "/health", timeout=10).json()
    assert h["status"] == "ok" and h["dp_size"] == G and h["policy"] == "expert-idf"
    httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "cat dog"}, timeout=10)
    m = httpx.get(url + "/metrics", timeout=10).text
    assert 'sempar_router_requests_total{rank="2"} 1.0' in m
    assert "sempar_router_predicted_local_share_count 1.0" in m
    assert 'sempar_router_upstream_seconds_count{stage="total"} 1.0' in m


def test_bad_input_is_4xx_in_one_line(stack):
    url, fake, st, _ = stack
    cases = [(b"{not json", 400, "bad_json"), (b"[1, 2]", 400, "bad_json"),
             (json.dumps({"model": "m"}).encode(), 400, "no_prompt"),
             (json.dumps({"messages": "hi"}).encode(), 400, "no_prompt"),
             (b"[" * 100000, 400, "bad_json"),
             (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400,
              "no_prompt")]
    for body, code, kind in cases:
        r = httpx.post(url + "/v1/chat/completions", content=body, timeout=10)
        assert r.status_code == code and r.json()["error"]["type"] == kind
        assert "\n" not in r.text
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2**70]}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "no_prompt"
    r = httpx.post(url + "/v1/nope", json={}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    assert httpx.get(url + "/v1/chat/completions", timeout=10).status_code == 405
    assert fake.received == [] and st.inflight == [0] * G                    # nothing forwarded


@pytest.mark.parametrize("stack", [{"max_body_bytes": 1000}], indirect=True)
def test_body_over_the_limit_is_413(stack):
    url, fake, _, _ = stack
    r = httpx.post(url + "/v1/completions", json={"prompt": "x" * 2000}, timeout=10)
    assert r.status_code == 413 and fake.received == []

    def chunked():                                     # no Content-Length: counted as it comes
        yield b'{"prompt": "'
        yield b"y" * 2000
        yield b'"}'
    r = httpx.post(url + "/v1/completions", content=chunked(), timeout=10)
    assert r.status_code == 413 and fake.received == []


@pytest.mark.parametrize("stack", [{"api_key": "router-key"}], indirect=True)
def test_api_key_guards_the_router(stack, caplog):
    url, fake, _, _ = stack
    with caplog.at_level(logging.INFO, logger="sempar.router"):
        r = httpx.post(url + "/v1/completions", json={"prompt": "cat"}, timeout=10)
        assert r.status_code == 401 and fake.received == []
        r = httpx.post(url + "/v1/completions", json={"prompt": "cat"}, timeout=10,
                       headers={"Authorization": "Bearer router-key"})
        assert r.status_code == 200
    assert fake.received[-1]["headers"]["authorization"] == "Bearer router-key"
    assert "router-key" not in caplog.text and caplog.records          # logged, key never


@pytest.mark.parametrize("stack", [{"down": True}], indirect=True)
def test_upstream_down_is_502(stack):
    url, _, st, _ = stack
    r = httpx.post(url + "/v1/completions", json={"prompt": "cat"}, timeout=10)
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_down"
    assert settled(st)


@pytest.mark.parametrize("stack", [{"read_timeout_s": 0.3, "delay": 2.0}], indirect=True)
def test_upstream_timeout_is_504(stack):
    url, fake, st, _ = stack
    fake.mode = "slow"
    r = httpx.post(url + "/v1/completions", json={"prompt": "cat"}, timeout=10)
    assert r.status_code == 504 and r.json()["error"]["type"] == "upstream_timeout"
    assert settled(st)


@pytest.mark.parametrize("stack", [{"max_inflight_per_rank": 1, "delay": 3.0}], indirect=True)
def test_all_ranks_full_is_429_with_retry_after_and_gone_client_cancels_upstream(stack):
    url, fake, st, _ = stack
    fake.mode = "hang"
    streams = []
    with httpx.Client(timeout=10) as c:
        for _ in range(G):                              # one hanging stream per rank
            s = c.stream("POST", url + "/v1/completions", json={"prompt": "cat", "stream": True})
            r = s.__enter__()
            it = r.iter_raw()                           # kept: dropping it closes the stream
            next(it)
            streams.append((s, r, it))
        assert sorted(st.inflight) == [1] * G           # the bound steered them apart
        r = httpx.post(url + "/v1/completions", json={"prompt": "cat"}, timeout=10)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        for s, r, _ in streams:                         # clients go away mid-stream
            r.close()
            s.__exit__(None, None, None)
    assert fake.cancelled.wait(2.0)                      # the upstream saw the cancel
    assert settled(st)


def test_start_up_refusals(placement_file, tmp_path):
    cfg = RouterConfig(upstream="http://127.0.0.1:1", engine="sglang", dp_size=G)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    no_tok = tmp_path / "m"
    no_tok.mkdir()
    broken = tmp_path / "b"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{}")
    for args, what in [((str(bad), str(MODEL)), "not JSON"),
                       ((str(placement_file), str(no_tok)), "no tokenizer.json"),
                       ((str(placement_file), str(broken)), "not a readable tokenizer.json")]:
        with pytest.raises(InputError, match=what):
            load_router(cfg, *args)
    with pytest.raises(InputError, match="placement is for 4 ranks"):
        load_router(RouterConfig(upstream="http://127.0.0.1:1", engine="sglang", dp_size=2),
                    str(placement_file), str(MODEL))
    for kw in ({"upstream": "ftp://x"}, {"upstream": "http://h:1/v1"}, {"dp_size": 0}):
        with pytest.raises(InputError):
            RouterConfig(**{"upstream": "http://127.0.0.1:1", "engine": "sglang", "dp_size": G, **kw})


def test_cli_refuses_bad_start_up_in_one_line_exit_2(placement_file, tmp_path):
    from conftest import run_cli

    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    base = ["router", "--upstream", "http://127.0.0.1:1", "--engine", "sglang", "--dp-size", "4",
            "--model-dir", str(MODEL)]
    for extra, what in [(["--placement", str(bad)], "not a placement"),
                        (["--placement", str(placement_file), "--policy", "nope"], "request policy"),
                        (["--placement", str(placement_file), "--engine", "tgi"], "engine")]:
        r = run_cli(*base, *extra)
        assert r.returncode == 2 and what in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert r.stdout == ""


def test_graceful_shutdown_finishes_the_stream_in_flight(placement_file):
    import threading

    fake = FakeEngine(gated=True)
    up_url, up_stop = serve_in_thread(fake.app)
    cfg = RouterConfig(upstream=up_url, engine="sglang", dp_size=G)
    url, stop = serve_in_thread(load_router(cfg, str(placement_file), str(MODEL)), graceful_s=5)
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=chat("cat", stream=True),
                          timeout=10) as r:
            it = r.iter_raw()
            first = next(it)
            stopper = threading.Thread(target=stop)
            stopper.start()                               # shutdown begins mid-stream
            time.sleep(0.3)
            with pytest.raises(httpx.TransportError):     # no new requests meanwhile
                httpx.post(url + "/v1/completions", json={"prompt": "cat"}, timeout=2)
            open_gate(fake)
            rest = b"".join(it)
        assert first + rest == b"".join(sse_events(3))   # the stream ran to its end
        stopper.join(10)
        assert not stopper.is_alive()
    finally:
        up_stop()


@pytest.mark.slow                                      # ~10 s on the loaded 2-core machine
@pytest.mark.parametrize("stack", [{"max_inflight_per_rank": 3}], indirect=True)
def test_load_bounded_count_every_request_answered_and_counters_back_to_zero(stack):
    import asyncio

    url, fake, st, log = stack
    N, C = 200, 24                                       # bounded: 200 requests, 24 at a time
    prompts = ["cat dog cat", "sun moon sun", "hello there", "cat sun"]

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=20) as c:
            sem = asyncio.Semaphore(C)

            async def one(i: int) -> int:
                async with sem:
                    body = {"model": "m", "prompt": prompts[i % 4], "stream": i % 3 == 0}
                    r = await c.post(url + "/v1/completions", json=body)
                    return r.status_code
            return await asyncio.gather(*[one(i) for i in range(N)])
    codes = asyncio.run(asyncio.wait_for(run(), 60))
    assert set(codes) <= {200, 429} and codes.count(200) == len(fake.received)
    assert settled(st)
    m = httpx.get(url + "/metrics", timeout=10).text
    routed = sum(float(x.split()[-1]) for x in m.splitlines()
                 if x.startswith("sempar_router_requests_total{"))
    assert routed == codes.count(200) == len(log.read_text().splitlines())
