"""Issue 47's router kinds, on loopback against the `FakeEngine` stand-in: big prompts are
tokenized within a byte bound (429 + Retry-After beyond it, small prompts unaffected, the bound
freed after); --log-routing under a missing folder is one line at start-up; uvicorn's own
warnings are JSON lines like the router's."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest

from sempar.errors import InputError
from sempar.router.config import RouterConfig
from sempar.router.request import THREAD_BYTES
from sempar.router.serve import json_logs, load_router, uvicorn_config
from test_router import MODEL, chat, placement_file, settled, stack  # noqa: F401  (fixtures)
from test_router_hardened import random_words


def _wait_for(cond, limit: float = 30.0) -> bool:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("stack", [{"tokenize_bytes": THREAD_BYTES * 3 // 2}], indirect=True)
def test_big_prompts_beyond_the_tokenizing_bound_get_429(stack):
    url, fake, st, _ = stack
    release = threading.Event()
    plain = st.tokenizer.tokens

    def held(route, body):                  # the first big prompt holds its bytes until told
        if len(json.dumps(body)) > THREAD_BYTES:
            release.wait(30)
        return plain(route, body)

    st.tokenizer.tokens = held
    big = chat(random_words(THREAD_BYTES + 4096, seed=1))
    first = {}
    t = threading.Thread(target=lambda: first.update(
        r=httpx.post(url + "/v1/chat/completions", json=big, timeout=60)))
    t.start()
    try:
        assert _wait_for(lambda: st.tokenizing > 0)
        r = httpx.post(url + "/v1/chat/completions", json=chat(random_words(THREAD_BYTES + 64)),
                       timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "tokenizer_busy"
        small = httpx.post(url + "/v1/chat/completions", json=chat("cat dog"), timeout=30)
        assert small.status_code == 200          # small prompts stay on the loop, unbounded
    finally:
        release.set()
        t.join(60)
    assert first["r"].status_code == 200 and st.tokenizing == 0
    again = httpx.post(url + "/v1/chat/completions", json=big, timeout=60)
    assert again.status_code == 200 and settled(st)


def test_log_routing_under_a_missing_folder_is_one_line(placement_file, tmp_path):  # noqa: F811
    cfg = RouterConfig(upstream="http://127.0.0.1:1", engine="sglang", dp_size=4,
                       log_routing=tmp_path / "missing" / "routing.jsonl")
    with pytest.raises(InputError, match="--log-routing") as e:
        load_router(cfg, str(placement_file), str(MODEL))
    assert "\n" not in str(e.value) and not (tmp_path / "missing").exists()


def test_uvicorn_warnings_are_json_lines(capsys):
    cfg = RouterConfig(upstream="http://127.0.0.1:1", engine="sglang", dp_size=4)
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate,
                 logging.getLogger(n).level)
             for n in ("sempar.router", "uvicorn", "uvicorn.error", "uvicorn.access")}
    try:
        json_logs()
        uvicorn_config(cfg, lambda *a: None)      # uvicorn configures logging here
        try:
            raise ValueError("bad request line")
        except ValueError as err:
            logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.",
                                                       exc_info=err)
    finally:
        for n, (handlers, propagate, level) in saved.items():
            lg = logging.getLogger(n)
            lg.handlers[:], lg.propagate = handlers, propagate
            lg.setLevel(level)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    rec = json.loads(lines[0])
    assert rec["message"] == "Invalid HTTP request received." and rec["level"] == "warning"
