"""Time the operator blocks of cases.py on the local device with PyTorch.

Each block is built from the model's dimensions (serving/dims.py) with random weights (bf16 on
CUDA, fp32 on CPU) and timed as an engine's decode runs it: on CUDA captured once in a CUDA graph
(after `warmup` eager runs on a side stream) and replayed `reps` times, each replay timed by CUDA
events, the median kept; on CPU the median of `reps` eager calls after `warmup`. A case the
device refuses (out of memory, an op it lacks) is recorded with its error and skipped.

Blocks (the work roof_parts.py prices, so a measured time and its roofline are of the same work):
- moe_block: router GEMM [n, h] x [h, N] and top-k over n = T / top_k tokens; the shared experts
  (SwiGLU [h, 2 I_s], [I_s, h]); the routed experts of one rank: T copies spread evenly over its E
  experts, SwiGLU by `torch._grouped_mm` (a per-expert loop where grouped_mm is refused);
- attention: the projections as GEMMs (GQA: q, k, v, o; MLA: q or q_a / q_b, kv_a, kv_b, o) and
  the core: GQA through scaled_dot_product_attention (enable_gqa); MLA absorbed (DeepSeek-V2
  §2.1) as batched matmuls over the kv_lora + rope latents (a plain stand-in for FlashMLA);
  decode: `tokens` requests of `context` cached tokens; prefill: one chunk of `tokens`
  attending to `context` (non-causal);
- lm_head: [n, h] x [h, V]; dense_mlp: SwiGLU [h, 2 I_d], [I_d, h].
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from sempar.serving.dims import ModelDims


class Bench:
    def __init__(self, device: str, warmup: int = 3, reps: int = 20):
        self.dev = torch.device(device)
        self.cuda = self.dev.type == "cuda"
        self.dt = torch.bfloat16 if self.cuda else torch.float32
        self.warmup, self.reps = warmup, reps
        self._gen = torch.Generator(device=self.dev).manual_seed(0)

    def w(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, device=self.dev, dtype=self.dt, generator=self._gen) * 0.02

    # ---- timing -----------------------------------------------------------------------------
    def time_us(self, fn: Callable[[], object]) -> tuple[float, bool]:
        """(median microseconds, whether a CUDA graph was replayed)."""
        if not self.cuda:
            for _ in range(self.warmup):
                fn()
            ts = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(ts), False
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run, graphed = g.replay, True
        except RuntimeError:            # an op that cannot be captured: time it eagerly
            torch.cuda.synchronize()
            run, graphed = fn, False
        for _ in range(2):
            run()
        torch.cuda.synchronize()
        ts = []
        for _ in range(self.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        return statistics.median(ts), graphed

    def release(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()

    # ---- blocks -------------------------------------------------------------------------------
    def moe_block(self, d: ModelDims, E: int, T: int) -> Callable:
        h, I, N, k = d.hidden, d.moe_intermediate, d.num_experts, d.top_k
        n = max(1, T // k)
        shI = (d.shared_intermediate or I) * d.shared_experts
        x, xr, wr = self.w(n, h), self.w(T, h), self.w(h, N)
        w13, w2 = self.w(E, h, 2 * I), self.w(E, I, h)
        ws13, ws2 = (self.w(h, 2 * shI), self.w(shI, h)) if shI else (None, None)
        counts = [T // E + (1 if e < T % E else 0) for e in range(E)]
        ends = torch.tensor(counts, dtype=torch.int64).cumsum(0)
        offs = ends.to(device=self.dev, dtype=torch.int32)
        bounds = [0] + ends.tolist()

        def shared_and_router():
            torch.topk(x @ wr, k, dim=-1)
            if shI:
                g = x @ ws13
                (F.silu(g[:, :shI]) * g[:, shI:]) @ ws2

        def grouped():
            shared_and_router()
            g = torch._grouped_mm(xr, w13, offs=offs)
            return torch._grouped_mm(F.silu(g[:, :I]) * g[:, I:], w2, offs=offs)

        def loop():
            shared_and_router()
            for e in range(E):
                s, t = bounds[e], bounds[e + 1]
                if t > s:
                    g = xr[s:t] @ w13[e]
                    (F.silu(g[:, :I]) * g[:, I:]) @ w2[e]

        try:
            grouped()
            return grouped
        except (RuntimeError, NotImplementedError, AttributeError):
            return loop

    def attention(self, d: ModelDims, phase: str, tokens: int, context: int) -> Callable:
        h, nh, hd = d.hidden, d.heads, d.head_dim
        decode = phase == "decode"
        B, q_len = (tokens, 1) if decode else (1, tokens)
        x = self.w(tokens, h)
        if d.mla is None:
            nk = d.kv_heads
            wq, wk, wv, wo = self.w(h, nh * hd), self.w(h, nk * hd), self.w(h, nk * hd), self.w(nh * hd, h)
            xo = self.w(tokens, nh * hd)
            q = self.w(B, nh, q_len, hd)
            kc, vc = self.w(B, nk, context, hd), self.w(B, nk, context, hd)

            def gqa():
                x @ wq
                x @ wk
                x @ wv
                xo @ wo
                return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=nk != nh)
            return gqa
        q_lora, kv_lora, rope, nope = d.mla
        lat = kv_lora + rope
        wqa, wq = (self.w(h, q_lora), self.w(q_lora, nh * (nope + rope))) if q_lora else \
            (None, self.w(h, nh * (nope + rope)))
        wkva, wkvb, wo = self.w(h, lat), self.w(kv_lora, nh * (nope + hd)), self.w(nh * hd, h)
        xl, xo = self.w(tokens, kv_lora), self.w(tokens, nh * hd)
        ql = self.w(B, nh * q_len, lat)
        kv = self.w(B, context, lat)
        scale = lat ** -0.5

        def mla():
            (x @ wqa) @ wq if q_lora else x @ wq
            x @ wkva
            xl @ wkvb
            xo @ wo
            p = torch.softmax(torch.bmm(ql, kv.transpose(1, 2)) * scale, dim=-1)
            return torch.bmm(p, kv[..., :kv_lora])
        return mla

    def lm_head(self, d: ModelDims, tokens: int) -> Callable:
        x, w = self.w(tokens, d.hidden), self.w(d.hidden, d.vocab)
        return lambda: x @ w

    def dense_mlp(self, d: ModelDims, tokens: int) -> Callable:
        I = d.dense_intermediate
        x, w13, w2 = self.w(tokens, d.hidden), self.w(d.hidden, 2 * I), self.w(I, d.hidden)

        def mlp():
            g = x @ w13
            return (F.silu(g[:, :I]) * g[:, I:]) @ w2
        return mlp

    def build(self, case: dict) -> Callable:
        d, op, t = case["dims"], case["op"], int(case["tokens"])
        if op == "moe_block":
            return self.moe_block(d, case["experts_per_rank"], t)
        if op == "attention":
            return self.attention(d, case["phase"], t, case["context"])
        if op == "lm_head":
            return self.lm_head(d, t)
        return self.dense_mlp(d, t)

    def measure(self, case: dict) -> dict:
        """{measured_us, graph} or {error} for one case."""
        try:
            with torch.inference_mode():
                fn = self.build(case)
                us, graphed = self.time_us(fn)
            return {"measured_us": us, "graph": graphed}
        except (RuntimeError, MemoryError) as e:   # torch.OutOfMemoryError is a RuntimeError
            return {"error": " ".join(str(e).split())[:160]}
        finally:
            self.release()


def device_info(device: str) -> dict:
    """What the profile's source records about the device."""
    info = {"torch": torch.__version__}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        info.update(device=p.name, sms=str(p.multi_processor_count),
                    cuda=str(torch.version.cuda), memory_gb=f"{p.total_memory / 1e9:.0f}")
    else:
        import platform
        info["device"] = f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"
    return info


def cuda_available() -> bool:
    return torch.cuda.is_available()
