"""`--ray` addresses are checked for their form before any work, and joining a cluster is
bounded: an address where nothing listens is one line and exit 2 at once (not Ray's 826 s of
retries), loopback only."""

from __future__ import annotations

import socket

import pytest

from conftest import build_trace
from hostile import refused
from sempar.trace.io import write_trace


@pytest.fixture
def shard(tmp_path):
    write_trace(build_trace(T=120, R=12), tmp_path / "t.parquet")
    return tmp_path / "t.parquet"


@pytest.mark.parametrize("address", ["garbage:::", "\x1b[31mred\x1b[0m:1", "host:0", "host:70000",
                                     "[nonsense]:1", "a b:6379", ":6379"])
def test_malformed_addresses_are_one_line(tmp_path, shard, address):
    out = tmp_path / "x.stats"
    line = refused(["stats", "build", "--trace", shard, "--ray", address, "--out", out],
                   tmp_path, "not local, auto or a cluster address", out)
    assert "\x1b" not in line
    refused(["place", "--stats", tmp_path / "absent.stats", "--ep", "2", "--ray", address,
             "--out", tmp_path / "p.json"], tmp_path, "--ray", tmp_path / "p.json")


def test_an_address_where_nothing_listens_is_one_line(tmp_path, shard):
    pytest.importorskip("ray")
    with socket.socket() as s:          # a loopback port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "x.stats"
    refused(["stats", "build", "--trace", shard, "--ray", f"127.0.0.1:{port}",
             "--ray-timeout", "5", "--out", out], tmp_path, "cannot reach a Ray cluster", out)


def test_auto_leads_where_ray_address_says_and_is_checked_alike(tmp_path, shard, monkeypatch):
    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "x.stats"
    monkeypatch.setenv("RAY_ADDRESS", "garbage:::")
    refused(["stats", "build", "--trace", shard, "--ray", "auto", "--out", out], tmp_path,
            "RAY_ADDRESS", out)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    refused(["stats", "build", "--trace", shard, "--ray", "auto", "--ray-timeout", "5",
             "--out", out], tmp_path, "cannot reach a Ray cluster", out)
