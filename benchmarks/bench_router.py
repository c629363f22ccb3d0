"""Benchmark: `sempar router` (issue 29). Reports figures; asserts nothing.

(a) quality: GPT-OSS-20B's real routing (shared/data/real/full-traces/gpt-oss-20b-mmlu.npz,
    imported with `import_arrays`), split 20/80 by request as `evaluate --split` does (seed 0),
    `sempar` placement solved on the fit part in dp mode at EP 4, the held-out requests replayed
    in arrival order through each policy's streaming form (`submit` / `complete`, the router's
    code path; completions FIFO after 8 G requests in flight). Per policy: dp LAR, its share of
    the balanced request-level ceiling (`oracle_home_dp`: each round of G requests matched to
    the ranks knowing the real routing), its ratio to round-robin, per-rank requests and tokens
    max / mean and min / mean, and the prefix-cache hit share (each rank an LRU of 32-token
    block prefixes, 8,192 blocks, as `PrefixCache`). Then K routers side by side behind a
    round-robin balancer (each its own policy state, seeing every K-th request): the same. Then
    `expert` and `expert-idf` on the fit split's state-confidence table (`evaluate --online`'s).
(b) overhead, on loopback: an upstream answering at once (this file, `--serve-upstream`, a raw
    ASGI app under uvicorn in its own process), the router as `sempar router` in its own
    process (tiny-moe64's tokenizer, a random token table of 8,000 tokens), prompts of 512
    tokens as text: closed-loop requests/s through the router and direct; open-loop latency at
    a fixed rate (router minus direct, p50 / p99); time to the first streamed byte (router minus
    direct, median); and the upstream clients (aiohttp, httpx) forwarding alone.
(c) ttfb (issue 37's target, added <= 1 ms p50 at 200 req/s): the same two processes, open
    loop at --rate, time to the first body byte direct and through the router side by side,
    streamed and non-streamed answers, in --rounds alternating phases of --requests each;
    p50 / p99 and the per-phase added p50. `--save RUN.json`, then `--from RUN.json ...
    --save docs/results/router-ttfb.json --table docs/results/router-ttfb.md` keeps the runs
    in one JSON and writes the results page from them.

(d) splits (issue 37): the single-router policies of (a) on the held-out parts of several
    splits (`--seeds`, placement re-solved per split), their share of each split's ceiling and
    its mean, and the balance contract's figures from 20 x G requests on (schedule/balance.py):
    the largest per-rank |requests - mean| / mean and |tokens - mean| / mean at any request, and
    the tokens' once the longest request so far is allowed on top. `--out-json` / `--table`
    write docs/results/router-splits.{json,md} (`--from JSON --table MD` regenerates the table).

    python benchmarks/bench_router.py [--part quality|overhead|ttfb|splits|all]
        [--routers 1,2,4] [--seed 0] [--seeds 0,1,2] [--rate 200] [--seconds 5]
        [--requests 400] [--rounds 3] [--label L] [--save RUN.json] [--json]
        [--out-json F] [--table F] [--from F ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
MODEL = Path(__file__).resolve().parents[1] / "src/sempar/assets/models/tiny-moe64"
POLICIES = ("round-robin", "least-inflight", "alg2", "balanced", "expert", "expert+prefix",
            "expert-idf")


# -- (a) quality ------------------------------------------------------------------------------

def replay(pol, tok, off, window, routers: int = 1, make=None) -> np.ndarray:
    """int32[R]: ranks from the streaming form; with `routers` K > 1, request i goes to router
    i mod K, each with its own state (`make()` builds one) and its own FIFO window."""
    pols = [pol] + [make() for _ in range(routers - 1)]
    mine: list[list[int]] = [[] for _ in pols]
    out = np.empty(off.size - 1, np.int32)
    for i in range(off.size - 1):
        k = i % len(pols)
        p, own = pols[k], mine[k]
        if len(own) >= window:
            j = own[-window]
            p.complete(int(out[j]), int(off[j + 1] - off[j]))
        out[i] = p.submit(tok[off[i]:off[i + 1]])
        own.append(i)
    return out


def prefix_hits(tok, off, ranks, G) -> float:
    from sempar.schedule.load_policies import PrefixCache

    cache, hit, tot = PrefixCache(G), 0, 0
    for i in range(off.size - 1):
        h = cache.hashes(tok[off[i]:off[i + 1]])
        hit += cache.match(int(ranks[i]), h) * cache.block
        tot += int(off[i + 1] - off[i])
        cache.insert(int(ranks[i]), h)
    return hit / max(tot, 1)


def quality(routers: list[int], ep: int = 4, seed: int = 0) -> dict:
    from bench_placement_real import load_real
    from sempar.placement import solve
    from sempar.placement.metrics import placement_figures
    from sempar.schedule.homes import home_from_ranks, oracle_home_dp
    from sempar.schedule.requests import make_policy, request_arrays
    from sempar.trace import split_by_request

    with tempfile.TemporaryDirectory() as d:
        traces = load_real(["gpt-oss-20b-mmlu"], d)
    if not traces:
        return {"skipped": "gpt-oss-20b-mmlu.npz is absent"}
    fit, ev = split_by_request(traces["gpt-oss-20b-mmlu"], seed=seed)
    p = solve("sempar", fit, num_devices=ep, mode="dp")
    L, G = ev.meta.num_layers, ep
    tok, off, _ = request_arrays(ev.request_id, ev.token_id)
    lens = np.diff(off)
    lar = lambda r: placement_figures(p, ev.experts, home_from_ranks(ev.request_id, r, L))["lar_mean"]  # noqa: E731
    ceiling = placement_figures(p, ev.experts, oracle_home_dp(p, ev))["lar_mean"]

    def figures(r: np.ndarray) -> dict:
        """LAR, its share of the ceiling, per-rank request / token spread, prefix hits of the
        request -> rank assignment `r` (int[R])."""
        cnt, tk = np.bincount(r, minlength=G), np.bincount(r, weights=lens, minlength=G)
        x = lar(r)
        return {"lar": x, "share_of_ceiling": x / ceiling,
                "requests_max_mean": cnt.max() / cnt.mean(), "requests_min_mean": cnt.min() / cnt.mean(),
                "tokens_max_mean": tk.max() / tk.mean(), "tokens_min_mean": tk.min() / tk.mean(),
                "prefix_hit_share": prefix_hits(tok, off, r, G)}

    out = {"requests": int(lens.size), "tokens": int(lens.sum()), "ceiling": ceiling, "policies": {}}
    for k in routers:
        for name in POLICIES:
            make = lambda: make_policy(name, G, p.token_table)   # noqa: E731
            pol = make()
            r = replay(pol, tok, off, pol.window, k, make)
            if k == 1:
                assert np.array_equal(r, pol.assign(tok, off)), name      # = evaluate's form
            out["policies"][f"{name} x{k}"] = figures(r)
    # The same classes on the table `evaluate --online` fits on the fit split (state
    # confidences, predict.TokenDevice) instead of the placement's own.
    from sempar.schedule.online import OnlineScheduler

    fit_table = OnlineScheduler().fit(fit, p).token_device_.table_
    for name in ("expert", "expert-idf"):
        pol = make_policy(name, G, fit_table)
        r = replay(pol, tok, off, pol.window)
        out["policies"][f"{name} fit-table"] = figures(r)
    # Shared prefixes, as system prompts give: request i starts with system prompt i mod 8 of
    # 256 ids the table does not know (so the experts' scores are unchanged, only the prefix
    # term can act).
    rng = np.random.default_rng(0)
    sys_prompts = [rng.integers(1 << 30, (1 << 30) + 1000, 256) for _ in range(8)]
    ptok = np.concatenate([np.concatenate([sys_prompts[i % 8], tok[off[i]:off[i + 1]]])
                           for i in range(lens.size)])
    poff = np.concatenate([[0], np.cumsum(lens + 256)])
    for name in ("round-robin", "least-inflight", "expert", "expert+prefix", "expert-idf"):
        pol = make_policy(name, G, p.token_table)
        r = replay(pol, ptok, poff, pol.window)
        cnt, tk = np.bincount(r, minlength=G), np.bincount(r, weights=lens + 256, minlength=G)
        out["policies"][f"{name} +sys"] = {
            "lar": lar(r), "share_of_ceiling": lar(r) / ceiling,
            "requests_max_mean": cnt.max() / cnt.mean(), "requests_min_mean": cnt.min() / cnt.mean(),
            "tokens_max_mean": tk.max() / tk.mean(), "tokens_min_mean": tk.min() / tk.mean(),
            "prefix_hit_share": prefix_hits(ptok, poff, r, G)}
    base = out["policies"]["round-robin x1"]["lar"]
    for v in out["policies"].values():
        v["ratio_to_round_robin"] = v["lar"] / base
    return out


def contract_figures(r: np.ndarray, lens: np.ndarray, G: int) -> dict:
    """The balance contract's figures of ranks int[R] (arrival order) with lengths int[R]: the
    largest deviations from the per-rank mean, over every prefix of >= 20 x G requests."""
    from sempar.schedule.requests import BALANCE_FROM

    R = r.size
    K, C = np.zeros((R, G)), np.zeros((R, G))
    K[np.arange(R), r] = 1
    C[np.arange(R), r] = lens
    K, C = K.cumsum(0)[BALANCE_FROM * G - 1:], C.cumsum(0)[BALANCE_FROM * G - 1:]
    km, cm = K.mean(1, keepdims=True), C.mean(1, keepdims=True)
    n_max = np.maximum.accumulate(lens)[BALANCE_FROM * G - 1:]
    return {"requests_dev": float((np.abs(K - km) / km).max()),
            "tokens_dev": float((np.abs(C - cm) / cm).max()),
            "tokens_dev_less_longest": float(((np.abs(C - cm).max(1) - n_max) / cm[:, 0]).max())}


def splits(seeds: list[int], ep: int = 4) -> dict:
    """{seed: {ceiling, policies: {name: figures}}} and the mean share per policy (module doc, c)."""
    from bench_placement_real import load_real
    from sempar.placement import solve
    from sempar.placement.metrics import placement_figures
    from sempar.schedule.homes import home_from_ranks, oracle_home_dp
    from sempar.schedule.requests import make_policy, request_arrays
    from sempar.trace import split_by_request

    with tempfile.TemporaryDirectory() as d:
        traces = load_real(["gpt-oss-20b-mmlu"], d)
    if not traces:
        return {"skipped": "gpt-oss-20b-mmlu.npz is absent"}
    out: dict = {"ep": ep, "seeds": {}}
    for seed in seeds:
        fit, ev = split_by_request(traces["gpt-oss-20b-mmlu"], seed=seed)
        p = solve("sempar", fit, num_devices=ep, mode="dp")
        L, G = ev.meta.num_layers, ep
        tok, off, _ = request_arrays(ev.request_id, ev.token_id)
        lens = np.diff(off)
        ceiling = placement_figures(p, ev.experts, oracle_home_dp(p, ev))["lar_mean"]
        res = {"requests": int(lens.size), "tokens": int(lens.sum()), "ceiling": ceiling,
               "policies": {}}
        for name in POLICIES:
            pol = make_policy(name, G, p.token_table)
            r = replay(pol, tok, off, pol.window)
            x = placement_figures(p, ev.experts, home_from_ranks(ev.request_id, r, L))["lar_mean"]
            res["policies"][name] = {"lar": x, "share_of_ceiling": x / ceiling,
                                     **contract_figures(r, lens, G)}
        out["seeds"][str(seed)] = res
    out["mean_share"] = {name: float(np.mean([v["policies"][name]["share_of_ceiling"]
                                              for v in out["seeds"].values()]))
                         for name in POLICIES}
    return out


def splits_table(res: dict, meta: str) -> str:
    """docs/results/router-splits.md from `splits`' result."""
    seeds = list(res["seeds"])
    head = ("| policy | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | requests dev "
            "| tokens dev | tokens dev less the longest |")
    rows = [head, "| --- |" + " ---: |" * (len(seeds) + 4)]
    for name in POLICIES:
        f = [res["seeds"][s]["policies"][name] for s in seeds]
        rows.append(f"| {name} | " + " | ".join(f"{v['share_of_ceiling']:.3f}" for v in f)
                    + f" | **{res['mean_share'][name]:.3f}** | "
                    + " | ".join(f"{max(v[k] for v in f):.3f}" for k in
                                 ("requests_dev", "tokens_dev", "tokens_dev_less_longest")) + " |")
    ceil = ", ".join(f"{res['seeds'][s]['ceiling']:.4f} ({res['seeds'][s]['requests']} requests)"
                     for s in seeds)
    from results_stamp import stamp

    return ("# `sempar router` policies over splits\n\n"
            + stamp("benchmarks/bench_router.py", "benchmarks/bench_router.py --part splits",
                    rows=[("measured", meta)] if meta else ()) + "\n"
            f"GPT-OSS-20B (MMLU), EP {res['ep']}: per split (20/80 by request, seed s) the `sempar` "
            "dp placement solved on the fit part and the held-out requests replayed in arrival "
            "order through each policy's streaming form (completions FIFO after 8 G in flight). "
            "Share of the balanced request-level ceiling (each round of G requests matched to "
            f"the ranks knowing the real routing; LAR {ceil}); the balance contract's figures "
            "are the worst over the splits and over every prefix of >= 20 x G requests "
            "(contract: requests <= 0.05, tokens less the longest request so far <= 0.05; "
            "`round-robin`, `alg2` claim requests only, `least-inflight`, `balanced` nothing).\n\n"
            + "\n".join(rows) + "\n")


# -- (b) overhead -----------------------------------------------------------------------------

def random_placement(G: int, L: int = 6, U: int = 8000, seed: int = 0):
    """A dp placement for the overhead runs: tiny-moe64's shape, a random token table of U ids."""
    from sempar.placement.placement import Placement
    from sempar.predict.token_table import TokenTable

    rng = np.random.default_rng(seed)
    table = TokenTable(np.sort(rng.choice(16384, U, replace=False)), rng.integers(0, G, (L, U)),
                       rng.random((L, U)).astype(np.float32))
    return Placement(np.tile(np.arange(64), (L, 1)), 64, G, method="random", token_table=table)


def upstream_app():
    """A raw ASGI app answering at once: JSON, or 3 SSE events when the body says stream."""
    body = json.dumps({"id": "x", "object": "text_completion", "choices": [{"text": "ok"}]}).encode()
    events = [b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'] * 2 + [b"data: [DONE]\n\n"]

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            m = await receive()
            raw += m.get("body", b"")
            if not m.get("more_body"):
                break
        if b'"stream": true' in raw:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for e in events:
                await send({"type": "http.response.body", "body": e, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
    return app


def wait_port(port: int, proc, timeout: float = 60.0) -> None:
    import socket

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited: {proc.args}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"port {port} did not open")


async def closed_loop(url: str, payload: bytes, n: int, conc: int) -> float:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        left = iter(range(n))

        async def worker():
            for _ in left:
                async with s.post(url, data=payload, headers={"content-type": "application/json"}) as r:
                    await r.read()
        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(conc)])
        return n / (time.perf_counter() - t0)


async def open_loop(url: str, payload: bytes, rate: float, seconds: float) -> np.ndarray:
    import aiohttp

    lat = []
    async with aiohttp.ClientSession() as s:
        async def one(t_sched):
            await asyncio.sleep(max(0.0, t_sched - time.perf_counter()))
            t = time.perf_counter()
            async with s.post(url, data=payload, headers={"content-type": "application/json"}) as r:
                await r.read()
            lat.append(time.perf_counter() - t)
        t0 = time.perf_counter() + 0.2
        await asyncio.gather(*[one(t0 + i / rate) for i in range(int(rate * seconds))])
    return np.array(lat)


async def ttfb(url: str, payload: bytes, n: int) -> np.ndarray:
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            t = time.perf_counter()
            async with s.post(url, data=payload, headers={"content-type": "application/json"}) as r:
                await r.content.readany()
                out.append(time.perf_counter() - t)
                await r.read()
    return np.array(out)


async def open_loop_ttfb(url: str, payload: bytes, rate: float, n: int) -> np.ndarray:
    """float[n, 2] seconds: (time to the first body byte, time to the end) of n requests sent
    open-loop at `rate` per second (request i at i / rate whatever the answers do)."""
    import aiohttp

    out = np.full((n, 2), np.nan)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
        async def one(i: int, t_sched: float) -> None:
            await asyncio.sleep(max(0.0, t_sched - time.perf_counter()))
            t = time.perf_counter()
            async with s.post(url, data=payload, headers={"content-type": "application/json"}) as r:
                await r.content.readany()
                out[i, 0] = time.perf_counter() - t
                await r.read()
                out[i, 1] = time.perf_counter() - t
        # warm the pool (keep-alive connections), then the timed stream
        await asyncio.gather(*[one(0, 0.0) for _ in range(8)])
        t0 = time.perf_counter() + 0.05
        await asyncio.gather(*[one(i, t0 + i / rate) for i in range(n)])
    return out


def ttfb_side_by_side(direct: str, routed: str, payloads: dict[str, bytes], rate: float,
                      n: int, rounds: int) -> dict:
    """Open-loop time to first byte at `rate`, direct and through the router, per payload kind
    ("stream", "json"), in `rounds` alternating phases of n requests each (so load drift on
    the shared machine falls on both alike). Percentiles over every round's requests."""
    got = {(k, w): [] for k in payloads for w in ("direct", "router")}
    for _ in range(rounds):
        for k, body in payloads.items():
            for w, url in (("direct", direct), ("router", routed)):
                got[k, w].append(asyncio.run(open_loop_ttfb(url, body, rate, n)))
    out = {"rate": rate, "requests_each": n * rounds, "rounds": rounds}
    for k in payloads:
        d, r = np.concatenate(got[k, "direct"]), np.concatenate(got[k, "router"])
        for q in (50, 99):
            for w, a in (("direct", d), ("router", r)):
                out[f"{k}_ttfb_p{q}_{w}_ms"] = float(np.nanpercentile(a[:, 0], q) * 1e3)
                out[f"{k}_total_p{q}_{w}_ms"] = float(np.nanpercentile(a[:, 1], q) * 1e3)
            out[f"{k}_ttfb_added_p{q}_ms"] = (out[f"{k}_ttfb_p{q}_router_ms"]
                                              - out[f"{k}_ttfb_p{q}_direct_ms"])
        # the per-round added p50 (its spread says how far to trust the pooled figure)
        out[f"{k}_ttfb_added_p50_by_round_ms"] = [
            float((np.percentile(b[:, 0], 50) - np.percentile(a[:, 0], 50)) * 1e3)
            for a, b in zip(got[k, "direct"], got[k, "router"])]
    return out


async def client_rate(kind: str, url: str, payload: bytes, n: int, conc: int = 16) -> float:
    """Requests/s of one upstream client library forwarding alone (what the router spends)."""
    if kind == "httpx":
        import httpx

        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=conc)) as c:
            async def go():
                r = await c.post(url, content=payload, headers={"content-type": "application/json"})
                await r.aread()
            return await _rate(go, n, conc)
    return await closed_loop(url, payload, n, conc)


async def _rate(go, n: int, conc: int) -> float:
    left = iter(range(n))

    async def worker():
        for _ in left:
            await go()
    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(conc)])
    return n / (time.perf_counter() - t0)


def prompt_payloads() -> tuple[int, dict[str, bytes]]:
    """(prompt tokens, {"json": a non-streamed completion body, "stream": a streamed one}):
    a 512-token text prompt in tiny-moe64's tokenizer."""
    from sempar.prompt import PromptTokenizer

    tok = PromptTokenizer(MODEL)
    words = " ".join(f"w{i} the {i % 97}" for i in range(400))
    text = tok.tok.decode(tok.encode(words)[:512])
    return len(tok.encode(text)), {
        "json": json.dumps({"model": "m", "prompt": text, "max_tokens": 1}).encode(),
        "stream": json.dumps({"model": "m", "prompt": text, "stream": True}).encode()}


@contextlib.contextmanager
def servers(up_port: int = 31811, r_port: int = 31812):
    """(direct URL, routed URL): the stand-in upstream and `sempar router` (4 ranks, a random
    table, tiny-moe64's tokenizer), each its own process on loopback, stopped on exit."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    procs = []
    with tempfile.TemporaryDirectory() as d:
        pl = Path(d) / "p.json"
        random_placement(4).save(pl)
        try:
            procs.append(subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port)],
                                          env=env))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "sempar.cli", "router", "--placement", str(pl), "--upstream",
                 f"http://127.0.0.1:{up_port}", "--engine", "sglang", "--dp-size", "4",
                 "--model-dir", str(MODEL), "--port", str(r_port)], env=env,
                stderr=subprocess.DEVNULL))
            wait_port(up_port, procs[0])
            wait_port(r_port, procs[1])
            yield (f"http://127.0.0.1:{up_port}/v1/completions",
                   f"http://127.0.0.1:{r_port}/v1/completions")
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)


def overhead(rate: float, seconds: float) -> dict:
    ntok, pay = prompt_payloads()
    payload, stream_payload = pay["json"], pay["stream"]
    with servers() as (direct, routed):
        run = asyncio.run
        run(closed_loop(routed, payload, 200, 8))                      # warm both
        out = {"prompt_tokens": ntok}
        out["req_per_s_direct"] = run(closed_loop(direct, payload, 3000, 32))
        out["req_per_s_router"] = run(closed_loop(routed, payload, 3000, 32))
        ld, lr = run(open_loop(direct, payload, rate, seconds)), run(open_loop(routed, payload, rate, seconds))
        for q in (50, 99):
            out[f"latency_p{q}_direct_ms"] = float(np.percentile(ld, q) * 1e3)
            out[f"latency_p{q}_router_ms"] = float(np.percentile(lr, q) * 1e3)
            out[f"added_p{q}_ms"] = out[f"latency_p{q}_router_ms"] - out[f"latency_p{q}_direct_ms"]
        fd, fr = run(ttfb(direct, stream_payload, 300)), run(ttfb(routed, stream_payload, 300))
        out["ttfb_median_direct_ms"] = float(np.median(fd) * 1e3)
        out["ttfb_median_router_ms"] = float(np.median(fr) * 1e3)
        out["ttfb_added_ms"] = out["ttfb_median_router_ms"] - out["ttfb_median_direct_ms"]
        for kind in ("aiohttp", "httpx"):
            out[f"client_{kind}_req_per_s"] = run(client_rate(kind, direct, payload, 2000))
    return out


def first_byte(rate: float, n: int, rounds: int) -> dict:
    """Part `ttfb` (issue 37's target: added <= 1 ms p50 at 200 req/s): `ttfb_side_by_side`."""
    ntok, pay = prompt_payloads()
    with servers() as (direct, routed):
        asyncio.run(closed_loop(routed, pay["json"], 200, 8))          # warm both
        return {"prompt_tokens": ntok, **ttfb_side_by_side(direct, routed, pay, rate, n, rounds)}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def ttfb_page(runs: list[dict], path: Path | None) -> None:
    """docs/results/router-ttfb.md from the `ttfb` part's JSON of one or more runs (each with
    its `label`: the code and how it was scheduled); printed when path is None."""
    t0 = runs[0]["ttfb"]
    from results_stamp import stamp

    lines = ["# `sempar router`: time to first byte", "",
             stamp("benchmarks/bench_router.py --from RUN.json ... --table",
                   "benchmarks/bench_router.py --part ttfb --label L --save RUN.json",
                   note="runs on a 2-CPU machine shared with other work: the load average of "
                        "each run is given; the load generator, the router and the upstream "
                        "share the 2 CPUs with it"),
             f"Open loop at {t0['rate']:.0f} requests/s on loopback, {t0['prompt_tokens']}-token "
             f"text prompts, {t0['requests_each']} requests per row ({t0['rounds']} alternating "
             "phases, direct and routed in turn); the upstream a stand-in answering at once "
             "(JSON, or three server-sent events), `sempar router` in its own process with the "
             "default policy (4 ranks, a random token table of 8,000 ids, tiny-moe64's "
             "tokenizer). Time to first byte: from sending the request to the first body byte "
             "the client reads. Target (issue 37): the router adds <= 1 ms at p50. "
             "\"real-time priority\": the benchmark ran under `chrt -f 10`, so its three "
             "processes preempt the machine's other work (a stand-in for a dedicated core); "
             "\"shared\": ordinary priority, queueing behind that work.", "",
             "| run | commit | load | answer | p50 direct | p50 router | added p50 | added p50 "
             "per phase | p99 direct | p99 router | added p99 | target |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for res in runs:
        t, la = res["ttfb"], res["load_average"][0]
        lb = res.get("load_average_after", res["load_average"])[0]
        for k, name in (("stream", "streamed"), ("json", "not streamed")):
            add = t[f"{k}_ttfb_added_p50_ms"]
            per = " / ".join(f"{x:.2f}" for x in t[f"{k}_ttfb_added_p50_by_round_ms"])
            lines.append(
                f"| {res.get('label', '')} | `{res['commit']}` | {la:.1f} -> {lb:.1f} | {name} "
                f"| {t[f'{k}_ttfb_p50_direct_ms']:.2f} ms | {t[f'{k}_ttfb_p50_router_ms']:.2f} ms "
                f"| **{add:.2f} ms** | {per} | {t[f'{k}_ttfb_p99_direct_ms']:.2f} ms "
                f"| {t[f'{k}_ttfb_p99_router_ms']:.2f} ms | {t[f'{k}_ttfb_added_p99_ms']:.2f} ms "
                f"| {'met' if add <= 1.0 else 'missed'} |")
    text = "\n".join(lines) + "\n"
    if path is None:
        print(text)
    else:
        path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="all",
                    choices=("quality", "overhead", "ttfb", "splits", "all"))
    ap.add_argument("--seeds", default="0,1,2", help="the splits' seeds (--part splits)")
    ap.add_argument("--out-json", default=None, help="splits: write the result's JSON here")
    ap.add_argument("--routers", default="1,2,4")
    ap.add_argument("--seed", type=int, default=0, help="the fit/held-out split's seed")
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--requests", type=int, default=400, help="ttfb: requests per phase")
    ap.add_argument("--rounds", type=int, default=3, help="ttfb: alternating phases per target")
    ap.add_argument("--save", type=Path, help="write the results' JSON here")
    ap.add_argument("--table", type=Path,
                    help="ttfb / splits: write the results page here (markdown)")
    ap.add_argument("--from", dest="from_", type=Path, nargs="+",
                    help="ttfb: the runs' JSON to tabulate; with --part splits: its one JSON")
    ap.add_argument("--label", default="", help="ttfb: what this run is (kept in its JSON)")
    ap.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_upstream:
        import uvicorn

        uvicorn.run(upstream_app(), host="127.0.0.1", port=a.serve_upstream, log_level="error",
                    access_log=False)
        return
    if a.part == "splits":
        write_splits(a)
        return
    if a.from_ is not None:
        runs = []
        for f in a.from_:                           # a run, or a list of runs (the page's JSON)
            got = json.loads(f.read_text())
            runs += got if isinstance(got, list) else [got]
        if a.save is not None:
            a.save.write_text(json.dumps(runs, indent=1) + "\n")
        ttfb_page(runs, a.table)
        return
    res = {"label": a.label, "load_average": os.getloadavg(), "cpus": os.cpu_count(),
           "commit": _commit(),
           "time_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if a.part in ("quality", "all"):
        res["quality"] = quality([int(k) for k in a.routers.split(",")], seed=a.seed)
    if a.part in ("overhead", "all"):
        res["overhead"] = overhead(a.rate, a.seconds)
    if a.part in ("ttfb", "all"):
        res["ttfb"] = first_byte(a.rate, a.requests, a.rounds)
        res["load_average_after"] = os.getloadavg()
    if a.save is not None:
        a.save.write_text(json.dumps(res, indent=1) + "\n")
    if a.table is not None and "ttfb" in res:
        ttfb_page([res], a.table)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"load average {res['load_average']}")
    q = res.get("quality", {})
    if "policies" in q:
        print(f"GPT-OSS-20B held out, EP 4: {q['requests']} requests, {q['tokens']} tokens, "
              f"balanced request-level ceiling {q['ceiling']:.4f}")
        print(f"{'policy':<22}{'LAR':>8}{'/ceil':>8}{'/rr':>7}{'req max':>9}{'req min':>9}"
              f"{'tok max':>9}{'tok min':>9}{'prefix':>8}")
        for k, v in q["policies"].items():
            print(f"{k:<22}{v['lar']:>8.4f}{v['share_of_ceiling']:>8.3f}{v['ratio_to_round_robin']:>7.3f}"
                  f"{v['requests_max_mean']:>9.3f}{v['requests_min_mean']:>9.3f}"
                  f"{v['tokens_max_mean']:>9.3f}{v['tokens_min_mean']:>9.3f}{v['prefix_hit_share']:>8.4f}")
    for k, v in res.get("overhead", {}).items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")


def write_splits(a) -> None:
    """--part splits, or --from JSON: print the table, write --out-json / --table."""
    import platform

    if a.from_:
        res = json.loads(Path(a.from_[0]).read_text())
    else:
        load = os.getloadavg()
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent).stdout.strip()
        res = splits([int(s) for s in a.seeds.split(",")])
        res["meta"] = (f"at commit `{commit}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
                       f", {os.cpu_count()} CPUs ({platform.machine()}), load "
                       + " / ".join(f"{x:.1f}" for x in load))
        if a.out_json:
            Path(a.out_json).write_text(json.dumps(res, indent=1) + "\n")
    if "skipped" in res:
        print(res["skipped"])
        return
    md = splits_table(res, res.get("meta", ""))
    print(md)
    if a.table:
        Path(a.table).write_text(md)


if __name__ == "__main__":
    main()
