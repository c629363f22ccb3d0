"""Testbed safety: exact-name matching, `down` keeps testbeds in use, ranks die with their
launcher, an overrun is not blamed on a rank, and racing `up --name X` (root + netns only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sempar.testbed import netns
from sempar.testbed.launch import LaunchError, launch


def test_namespaces_match_exact_names_not_prefixes():
    present = ["sempar-a-br", "sempar-a-h0", "sempar-a-h1", "sempar-a-b-br", "sempar-a-b-h0",
               "sempar-ab-h0", "sempar-a-hx", "other-a-h0"]
    assert netns.namespaces_of("a", present) == ["sempar-a-br", "sempar-a-h0", "sempar-a-h1"]
    assert netns.namespaces_of("a-b", present) == ["sempar-a-b-br", "sempar-a-b-h0"]


def _fake_world(monkeypatch, tmp_path, present):
    monkeypatch.setenv("SEMPAR_TESTBED_DIR", str(tmp_path / "state"))
    deleted: list[str] = []
    monkeypatch.setattr(netns, "existing_namespaces", lambda: [n for n in present if n not in deleted])

    def run(cmd, check=True, input=None):
        if cmd[:3] == ["ip", "netns", "delete"]:
            deleted.append(cmd[3])
        return ""
    monkeypatch.setattr(netns, "_run", run)
    return deleted


def _state(name, hosts, owner):
    tb = netns.Testbed(name, hosts, "x", 1.0, [], [], expires=time.time() - 10, owner_pid=owner)
    tb.state_file.parent.mkdir(parents=True, exist_ok=True)
    tb.state_file.write_text(json.dumps(tb.to_json()))
    return tb


def test_destroy_a_does_not_touch_a_b(monkeypatch, tmp_path):
    deleted = _fake_world(monkeypatch, tmp_path, ["sempar-a-br", "sempar-a-h0", "sempar-a-h1",
                                                  "sempar-a-b-br", "sempar-a-b-h0", "sempar-a-b-h1"])
    netns.destroy("a")
    assert sorted(deleted) == ["sempar-a-br", "sempar-a-h0", "sempar-a-h1"]


def test_down_without_name_keeps_testbeds_whose_owner_is_alive(monkeypatch, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deleted = _fake_world(monkeypatch, tmp_path, ["sempar-busy-br", "sempar-busy-h0",
                                                      "sempar-busy-h1", "sempar-gone-br",
                                                      "sempar-gone-h0", "sempar-gone-h1",
                                                      "sempar-stray-h0"])
        _state("busy", 2, sleeper.pid)
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        _state("gone", 2, dead.pid)
        assert netns.reap_expired() == ["sempar-gone-br", "sempar-gone-h0", "sempar-gone-h1"]
        removed, kept = netns.down_all()
        assert [tb.name for tb in kept] == ["busy"]
        assert not [n for n in deleted if n.startswith("sempar-busy")]
        assert "sempar-stray-h0" in removed
        assert netns.load_state("busy") is not None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_overrun_is_not_blamed_on_a_killed_rank():
    with pytest.raises(LaunchError) as e:
        launch("sempar.testbed.profiler:profile_rank", 2, {"sizes": [1024, 2048]},
               timeout_s=3, op_timeout_s=60, fault="1:hang")
    msg = str(e.value)
    assert "exceeded its 3 s limit" in msg and "killed ranks still running: [0, 1]" in msg
    assert "failed first" not in msg and "SIGKILL" not in msg


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_ranks_die_when_the_launcher_is_killed():
    code = ("from sempar.testbed.launch import launch\n"
            "launch('sempar.testbed.profiler:profile_rank', 2, {'sizes': [1024, 2048]},"
            " timeout_s=120, op_timeout_s=100, fault='1:hang:3')\n")
    launcher = subprocess.Popen([sys.executable, "-c", code])
    ranks: list[int] = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(ranks) < 2:
            ranks = _children(launcher.pid)
            time.sleep(0.2)
        assert len(ranks) == 2, "the ranks never started"
        time.sleep(1.0)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(r) for r in ranks):
            time.sleep(0.2)
        assert not [r for r in ranks if _alive(r)], "ranks outlived their launcher"
    finally:
        for r in ranks:
            try:
                os.kill(r, signal.SIGKILL)
            except OSError:
                pass


OK, WHY = netns.netns_available()


@pytest.mark.skipif(not OK, reason=f"namespace testbed unavailable: {WHY}")
def test_racing_up_with_one_name_leaves_the_winner_intact(tmp_path):
    name = f"rc{os.getpid() % 100000}"
    env = dict(os.environ, SEMPAR_TESTBED_DIR=str(tmp_path / "state"))
    cmd = [sys.executable, "-m", "sempar.cli", "testbed", "up", "--hosts", "3", "--preset",
           "pcie-upi8", "--name", name, "--json"]
    try:
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for _ in range(3)]
        results = [(p.wait(timeout=180), p.stdout.read(), p.stderr.read()) for p in procs]
        ok = [r for r in results if r[0] == 0]
        assert len(ok) == 1, results
        assert all(r[0] == 2 and "already exists" in r[2] for r in results if r[0] != 0), results
        expected = json.loads(ok[0][1])["namespaces"]
        assert sorted(netns.namespaces_of(name, netns.existing_namespaces())) == sorted(expected)
    finally:
        subprocess.run([sys.executable, "-m", "sempar.cli", "testbed", "down", name], env=env,
                       capture_output=True, timeout=120)
    assert netns.namespaces_of(name, netns.existing_namespaces()) == []
