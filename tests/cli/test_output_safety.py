"""The output rule (sempar.atomic): no run ever modifies or deletes a user's file, folder, device
node or symlink, nor one of its own inputs, and a killed run leaves no temporary behind."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from sempar.atomic import MARKER, atomic_folder, atomic_path, check_folder_output, write_text_atomic
from sempar.errors import InputError
from sempar.paths import assets_dir

TRACE = assets_dir() / "traces" / "tiny-moe64.parquet"
MODELS = assets_dir() / "models"


def _tmp_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*") if ".tmp" in p.name)


# ---- files ---------------------------------------------------------------------------------

def test_symlink_target_is_written_and_link_kept(tmp_path):
    real = tmp_path / "shared" / "real.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"


def test_fifo_and_device_targets_are_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    targets = [fifo, tmp_path]
    if os.geteuid() == 0:        # a private copy of /dev/null: the real one is never risked
        dev = tmp_path / "null"
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append(dev)
    for t in targets:
        before = os.lstat(t)
        with pytest.raises(InputError, match="not a regular file|is a folder"):
            write_text_atomic(t, "x")
        after = os.lstat(t)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert _tmp_leftovers(tmp_path) == []


def test_symlink_to_a_device_is_refused(tmp_path):
    link = tmp_path / "out.json"
    link.symlink_to("/dev/null")
    with pytest.raises(InputError, match="not a regular file"):
        write_text_atomic(link, "x")
    assert link.is_symlink() and os.readlink(link) == "/dev/null"


def test_failure_leaves_target_and_no_temporary(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("keep")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("boom")
    assert target.read_text() == "keep" and _tmp_leftovers(tmp_path) == []


def test_existing_mode_is_kept(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("a")
    target.chmod(0o640)
    write_text_atomic(target, "b")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


# ---- folders -------------------------------------------------------------------------------

def _build(target, text="r", **kw):
    with atomic_folder(target, "test", **kw) as b:
        (b / "sub").mkdir()
        (b / "sub" / "r.txt").write_text(text)
        (b / "a.txt").write_text(text)


def test_folder_new_rerun_and_marker(tmp_path):
    out = tmp_path / "out"
    _build(out, "1")
    assert sorted(json.loads((out / MARKER).read_text())["files"]) == ["a.txt", "sub/r.txt"]
    ino = out.stat().st_ino
    _build(out, "2")                       # sempar's own output: replaced, folder kept
    assert (out / "sub" / "r.txt").read_text() == "2" and out.stat().st_ino == ino
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_foreign_folder_refused_then_force_moves_it_aside(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(InputError, match="non-empty folder sempar did not write.*thesis.tex"):
        _build(out)
    assert (out / "thesis.tex").read_text() == "years of work"
    _build(out, force=True)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("out.sempar-old-")]
    assert len(aside) == 1 and (aside[0] / "thesis.tex").read_text() == "years of work"
    assert (out / "a.txt").is_file()


def test_file_added_to_sempar_folder_is_protected(tmp_path):
    out = tmp_path / "out"
    _build(out)
    (out / "sub" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="notes.txt"):
        _build(out)
    assert (out / "sub" / "notes.txt").read_text() == "mine"


def test_empty_folder_is_filled_in_place(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ino = out.stat().st_ino
    _build(out)
    assert out.stat().st_ino == ino and (out / "a.txt").is_file()


def test_failed_folder_build_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_folder(out, "test") as b:
            (b / "x").write_text("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_folder_holding_an_input_is_refused(tmp_path):
    inp = tmp_path / "out" / "t.parquet"
    inp.parent.mkdir()
    inp.write_bytes(b"x")
    (inp.parent / MARKER).write_text(json.dumps({"files": ["t.parquet"]}))
    with pytest.raises(InputError, match="holds an input"):
        check_folder_output(inp.parent, inp)


def test_legacy_model_folder_is_recognised(tmp_path):
    from sempar.tiny.train import _model_files

    out = tmp_path / "m"
    out.mkdir()
    for f in ("config.json", "train.json", "model.safetensors"):
        (out / f).write_text("{}")
    check_folder_output(out, legacy=_model_files)
    (out / "extra.bin").write_text("user's")
    with pytest.raises(InputError, match="extra.bin"):
        check_folder_output(out, legacy=_model_files)


# ---- commands ------------------------------------------------------------------------------

@pytest.mark.parametrize("verb", ["demo", "analyze"])
def test_cli_never_deletes_a_foreign_out_folder(verb, tmp_path):
    (tmp_path / "keep.txt").write_text("precious")
    args = ["demo", "--out", "."] if verb == "demo" else ["analyze", str(TRACE), "--out", "."]
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: --out:") and len(r.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert (tmp_path / "keep.txt").read_text() == "precious"


def test_export_checkpoint_refuses_a_foreign_folder(tmp_path):
    from sempar.export.checkpoint import permute_checkpoint
    from sempar.placement import Placement

    if not (MODELS / "tiny-moe64" / "config.json").is_file():
        pytest.skip("tiny models not built")
    cfg = json.loads((MODELS / "tiny-moe64" / "config.json").read_text())
    N = cfg.get("num_experts") or cfg["num_local_experts"]
    p = Placement(np.tile(np.arange(N), (cfg["num_hidden_layers"], 1)), N, 4)
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(InputError, match="did not write"):
        permute_checkpoint(MODELS / "tiny-moe64", p, out)
    assert [f.name for f in out.iterdir()] == ["keep.txt"]


@pytest.fixture(scope="module")
def placement_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("p")
    r = run_cli("place", "--trace", TRACE, "--method", "vanilla", "--ep", "4", "--out", d / "p.json")
    assert r.returncode == 0, r.stderr
    return d / "p.json"


def _same_bytes_after(path: Path, *args: str) -> subprocess.CompletedProcess:
    before = path.read_bytes()
    r = run_cli(*args)
    assert path.read_bytes() == before
    return r


def test_output_equal_to_input_is_refused(tmp_path, placement_file):
    trace = tmp_path / "t.parquet"
    trace.write_bytes(TRACE.read_bytes())
    link = tmp_path / "link.parquet"
    link.symlink_to(trace)
    cases = [
        (trace, ["place", "--trace", trace, "--method", "vanilla", "--ep", "4", "--out", trace]),
        (trace, ["place", "--trace", trace, "--method", "vanilla", "--ep", "4", "--out", link]),
        (placement_file, ["export", "--placement", placement_file, "--to", "sglang",
                          "--num-hidden-layers", "6", "--out", placement_file]),
        (trace, ["simulate", "--trace", trace, "--compare", "--png", trace]),
        (placement_file, ["simulate", "--trace", trace, "--compare", "--placement",
                          f"vanilla,{placement_file}", "--png", placement_file]),
    ]
    for path, args in cases:
        r = _same_bytes_after(path, *map(str, args))
        assert r.returncode == 2 and "is an input of this run" in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


def test_import_sglang_refuses_its_dump_as_output(tmp_path):
    torch = pytest.importorskip("torch")
    dump = tmp_path / "dump_0.pt"
    torch.save({"records": [], "last_physical_to_logical_map": torch.zeros(2, 4, dtype=torch.int64)},
               dump)
    r = _same_bytes_after(dump, "import", "sglang", str(dump), "--out", str(dump))
    assert r.returncode == 2 and "is an input of this run" in r.stderr


def test_device_out_refused_by_cli(tmp_path):
    link = tmp_path / "p.json"
    link.symlink_to("/dev/null")
    r = run_cli("place", "--trace", TRACE, "--method", "vanilla", "--ep", "4", "--out", link)
    assert r.returncode == 2 and "not a regular file" in r.stderr
    assert link.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)


# ---- signals -------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_to_synth_leaves_no_temporary(sig, tmp_path):
    out = tmp_path / "big.parquet"
    # The signal's default disposition in the child: a test run under `nohup` would pass on
    # SIGHUP ignored, and sempar rightly leaves a disposition someone else chose in place.
    proc = subprocess.Popen([sys.executable, "-m", "sempar.cli", "synth", "--preset", "deepseek-v3",
                             "--tokens", "3000000", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    try:
        deadline = time.time() + 60
        while not _tmp_leftovers(tmp_path) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert _tmp_leftovers(tmp_path), "synth never started writing"
        proc.send_signal(sig)
        rc = proc.wait(timeout=120)     # generous: the shared test machine may be loaded
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 128 + sig
    assert list(tmp_path.iterdir()) == []


def test_analyze_builds_beside_the_target_not_in_tmpdir(tmp_path):
    """Old analyze built in $TMPDIR and os.replace'd: EXDEV across filesystems."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs $TMPDIR on another filesystem than the output")
    tmpdir = shm / f"sempar-test-{os.getpid()}"
    tmpdir.mkdir(exist_ok=True)
    try:
        env = dict(os.environ, TMPDIR=str(tmpdir))
        r = subprocess.run([sys.executable, "-m", "sempar.cli", "analyze", str(TRACE), "--out",
                            str(tmp_path / "a"), "--max-tokens", "2000"],
                           capture_output=True, text=True, env=env, timeout=300)
    finally:
        import shutil
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-500:]
    assert (tmp_path / "a" / "analysis.json").is_file()


def test_sigterm_during_a_folder_output_leaves_nothing(tmp_path):
    out = tmp_path / "a"
    proc = subprocess.Popen([sys.executable, "-m", "sempar.cli", "analyze", str(TRACE), "--out",
                             str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not _tmp_leftovers(tmp_path) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert _tmp_leftovers(tmp_path), "analyze never started its folder"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_signal_whose_exit_is_lost_never_commits(tmp_path):
    """C code can swallow the handler's SystemExit (seen once in CI: synth went on to the end,
    recreated its temporary and exited 0). The run must still neither swap in its output nor
    exit 0, and must leave no temporary."""
    out = tmp_path / "o.txt"
    code = f"""
import signal
from pathlib import Path
from sempar import atomic
with atomic.atomic_path({str(out)!r}) as tmp:
    tmp.write_text("half")
    try:
        atomic._on_signal(signal.SIGTERM, None)     # the exit the C code swallows
    except SystemExit:
        pass
    signal.alarm(0)
    Path(tmp).write_text("whole")                   # the writer reopens its path
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert list(tmp_path.iterdir()) == []
