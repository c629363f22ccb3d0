"""Attention-TP token re-batching (Sem-MoE Alg. 3): properties of the align plan and resume."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sempar.errors import InputError
from sempar.schedule.rebatch import (
    REBATCHERS,
    choose_devices,
    equal_chunks,
    local_fraction,
    rebatch,
    resume_tokens,
)

SETTINGS = settings(max_examples=200, deadline=None)


@st.composite
def batches(draw):
    """(hidden float32[T, H], target int64[T] in -1..G-1, G)."""
    T = draw(st.integers(0, 300))
    G = draw(st.integers(1, 9))
    H = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    # A skewed draw half of the time, so that devices overflow and others go short.
    if draw(st.booleans()):
        target = torch.randint(-1, G, (T,), generator=gen)
    else:
        w = torch.rand(G + 1, generator=gen) ** 4 + 1e-3
        target = torch.multinomial(w, T, replacement=True, generator=gen) - 1 if T else \
            torch.zeros(0, dtype=torch.int64)
    return torch.randn(T, H, generator=gen), target, G


def reference_plan(target: list[int], G: int) -> list[int]:
    """Python loop for the align step as design.md states it: perm, new position -> token."""
    T = len(target)
    cap = [T // G + (g < T % G) for g in range(G)]
    chunks: list[list[int]] = [[] for _ in range(G)]
    leftover = []
    for g in list(range(G)) + [-1]:              # sorted by device, no preference last
        for t in (t for t in range(T) if (target[t] == g if g >= 0 else target[t] < 0)):
            if g >= 0 and len(chunks[g]) < cap[g]:
                chunks[g].append(t)
            else:
                leftover.append(t)
    for g in range(G):
        while len(chunks[g]) < cap[g]:
            chunks[g].append(leftover.pop(0))
    return [t for c in chunks for t in c]


@SETTINGS
@given(batches())
def test_resume_inverts_rebatch(batch):
    hidden, target, G = batch
    for name in REBATCHERS:
        out, plan = rebatch(hidden, target, G, strategy=name)
        assert torch.equal(resume_tokens(out, plan), hidden)
        assert torch.equal(out, hidden[plan.perm])
        assert torch.equal(torch.sort(plan.perm).values, torch.arange(len(target)))
        assert torch.equal(plan.perm[plan.inverse], torch.arange(len(target)))


@SETTINGS
@given(batches())
def test_chunks_equal_and_preferences_met_up_to_capacity(batch):
    hidden, target, G = batch
    T = len(target)
    _, plan = rebatch(hidden, target, G)
    sizes = plan.chunk_sizes
    assert sizes.shape == (G,) and int(sizes.sum()) == T
    assert int(sizes.max() - sizes.min()) <= 1
    assert sizes.tolist() == sorted(sizes.tolist(), reverse=True)    # the first T % G get one more
    home = plan.home_device()
    for g in range(G):
        wanted = int((target == g).sum())
        placed = int(((target == g) & (home == g)).sum())
        assert placed == min(wanted, int(sizes[g]))
        assert int((home == g).sum()) == int(sizes[g])
    assert plan.perm.tolist() == reference_plan(target.tolist(), G)


@SETTINGS
@given(batches())
def test_none_strategy_is_contiguous(batch):
    hidden, target, G = batch
    T = len(target)
    out, plan = rebatch(hidden, target, G, strategy="none")
    assert torch.equal(out, hidden)
    assert torch.equal(plan.perm, torch.arange(T))
    offs = plan.offsets.tolist()
    home = plan.home_device().tolist()
    assert home == [g for g in range(G) for _ in range(offs[g], offs[g + 1])]


def test_align_worked_example():
    # Device 0 wants 4 tokens but holds 3; device 2 is exactly full; device 1 takes the overflow
    # (token 7) and then the token without a preference (4), in that order.
    target = torch.tensor([0, 0, 0, 1, -1, 2, 2, 0])
    _, plan = rebatch(torch.arange(8.0)[:, None], target, 3)
    assert plan.perm.tolist() == [0, 1, 2, 3, 7, 4, 5, 6]
    assert plan.chunk_sizes.tolist() == [3, 3, 2]
    assert plan.home_device().tolist() == [0, 0, 0, 1, 1, 2, 2, 1]
    assert local_fraction(plan, target) == pytest.approx(6 / 7)
    _, vanilla = rebatch(torch.zeros(8, 1), target, 3, strategy="none")
    assert local_fraction(vanilla, target) == pytest.approx(5 / 7)   # tokens 0, 1, 2, 3, 6


def test_choose_devices_by_confidence():
    t_dev = torch.tensor([0, 1, 2, -1, 3, -1, 2], dtype=torch.int16)
    t_conf = torch.tensor([0.9, 0.2, 0.5, 0.99, 0.7, 0.0, 0.4])
    a_dev = torch.tensor([3, 2, 1, 0, -1, -1, 1], dtype=torch.int32)
    a_conf = torch.tensor([0.1, 0.8, 0.5, 0.1, 0.95, 0.9, 0.4])
    got = choose_devices(t_dev, t_conf, a_dev, a_conf)
    # higher wins; tie -> A (paper: T_p > A_p); unknown loses; both unknown -> -1
    assert got.tolist() == [0, 2, 1, 0, 3, -1, 1]
    assert got.dtype == torch.int64
    with pytest.raises(InputError):
        choose_devices(t_dev, t_conf, a_dev[:3], a_conf)


@SETTINGS
@given(st.integers(0, 200), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_choose_devices_matches_rule(T, G, seed):
    gen = torch.Generator().manual_seed(seed)
    t_dev, a_dev = torch.randint(-1, G, (T,), generator=gen), torch.randint(-1, G, (T,), generator=gen)
    t_conf, a_conf = torch.rand(T, generator=gen), torch.rand(T, generator=gen)
    got = choose_devices(t_dev, t_conf, a_dev, a_conf).tolist()
    for i in range(T):
        td, ad, tc, ac = int(t_dev[i]), int(a_dev[i]), float(t_conf[i]), float(a_conf[i])
        want = td if td >= 0 and (ad < 0 or tc > ac) else ad
        assert got[i] == want


def test_edge_cases():
    out, plan = rebatch(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), 4)
    assert out.shape == (0, 4) and plan.chunk_sizes.tolist() == [0, 0, 0, 0]
    assert resume_tokens(out, plan).shape == (0, 4)
    assert math.isnan(local_fraction(plan, torch.zeros(0, dtype=torch.int64)))
    # G = 1: everything on device 0; the tokens with a preference come first.
    target = torch.tensor([0, -1, 0, -1, 0])
    _, plan = rebatch(torch.arange(5.0)[:, None], target, 1)
    assert plan.perm.tolist() == [0, 2, 4, 1, 3] and plan.chunk_sizes.tolist() == [5]
    assert local_fraction(plan, target) == 1.0
    # All -1: no preference means contiguous chunks, same as vanilla TP.
    _, plan = rebatch(torch.zeros(10, 2), torch.full((10,), -1), 4)
    assert plan.perm.tolist() == list(range(10)) and plan.chunk_sizes.tolist() == [3, 3, 2, 2]
    # Fewer tokens than devices: the first T devices get one token each.
    assert equal_chunks(2, 4).tolist() == [1, 1, 0, 0]
    _, plan = rebatch(torch.zeros(2, 1), torch.tensor([3, 3]), 4)
    assert plan.home_device().tolist() == [0, 1]
    # Out-of-range targets count as no preference.
    _, plan = rebatch(torch.zeros(4, 1), torch.tensor([7, 1, 1, -5]), 2)
    assert plan.perm.tolist() == [0, 3, 1, 2]


def test_bad_input():
    with pytest.raises(InputError):
        rebatch(torch.zeros(3, 2), torch.zeros(4, dtype=torch.int64), 2)
    with pytest.raises(InputError):
        rebatch(torch.zeros(3, 2), torch.zeros(3), 2)                  # float targets
    with pytest.raises(InputError):
        rebatch(torch.zeros(3, 2), torch.zeros(3, dtype=torch.int64), 0)
    with pytest.raises(InputError, match="rebatch strategy"):
        rebatch(torch.zeros(3, 2), torch.zeros(3, dtype=torch.int64), 2, strategy="nope")
    assert {"align", "none"} <= set(REBATCHERS.names())


def test_bfloat16_hidden_states():
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(257, 64, generator=gen).to(torch.bfloat16)
    target = torch.randint(-1, 8, (257,), generator=gen)
    out, plan = rebatch(hidden, target, 8)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, hidden[plan.perm])
    assert torch.equal(resume_tokens(out, plan), hidden)
    assert plan.chunk_sizes.tolist() == [33] + [32] * 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(1000, 16, generator=gen)
    target = torch.randint(-1, 8, (1000,), generator=gen)
    _, plan_c = rebatch(hidden, target, 8)
    out_g, plan_g = rebatch(hidden.cuda(), target.cuda(), 8)
    assert out_g.device.type == "cuda" and plan_g.perm.device.type == "cuda"
    assert torch.equal(plan_g.perm.cpu(), plan_c.perm)
    assert torch.equal(resume_tokens(out_g, plan_g).cpu(), hidden)
