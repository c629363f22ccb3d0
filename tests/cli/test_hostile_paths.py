"""Hostile paths and names (issue 27, kinds 2, 8, 9 and 13a): what the output rule and the console
layer guarantee, tested as properties where they fit.

- any byte string is a file name sempar reads and writes (kind 2);
- a write that fails (a full disk) leaves no output, no temporary and no folder it made (kind 8);
- every output verb x {symlink to an input, symlink loop, inside an input folder, forged
  marker} is one line, exit 2, and the user's tree is byte-for-byte and inode-for-inode as
  before (kind 9); a forged marker never gets a file deleted, even with --force;
- nothing read from a file reaches the terminal with raw control characters (kind 13a).

The first-pass cases (FIFOs, devices, --out = input, signals) are in test_output_safety.py and
test_bad_input.py. CLI cases run in-process through `sempar.cli.main` (refused before work)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import build_trace, run_cli
from sempar.atomic import MARKER, atomic_folder, atomic_path, write_text_atomic
from sempar.cli import main
from sempar.console import printable
from sempar.errors import InputError
from sempar.paths import assets_dir
from sempar.trace import read_trace, write_trace

TRACE = assets_dir() / "traces" / "tiny-moe64.parquet"
MODEL = assets_dir() / "models" / "tiny-moe64"
FAST = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# What a terminal would act on: C0 controls but tab and newline, DEL, C1, lone surrogates.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def cli(*args: object) -> tuple[int, str, str]:
    """Run `sempar ARGS` in this process: (exit code, stdout, stderr)."""
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            main([os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args])
            code = 0
        except SystemExit as ex:
            code = ex.code if isinstance(ex.code, int) else 1
    return code, o.getvalue(), e.getvalue()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (links not followed): kind, inode, mode, and content or target."""
    snap = {}
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if os.path.islink(p):
                what = ("link", os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    what = ("file", hashlib.sha256(f.read()).hexdigest())
            else:
                what = ("dir", None)
            snap[os.path.relpath(p, root)] = (*what, st.st_ino, st.st_mode, st.st_mtime_ns)
    return snap


# ---- kind 13a: one escaping function, applied by the console layer ---------------------------

@given(st.text())
def test_printable_leaves_no_control_character(s):
    assert not RAW_CONTROL.search(printable(s)) and "\n" not in printable(s)
    assert not RAW_CONTROL.search(printable(s, lines=True))


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cf"))))
def test_printable_keeps_ordinary_text(s):
    assert printable(s) == s


def test_printable_shows_the_bytes_of_a_non_utf8_name():
    assert printable(os.fsdecode(b"a\xff\x1b[2J.parquet")) == "a\\xff\\x1b[2J.parquet"


HOSTILE_NAMES = st.lists(st.sampled_from(
    ["a", "[", "]", "/", "=", "\x1b", "\x07", "\x9b", "\r", "\n", "\x00", "\u202e", "\x7f", "link",
     "[/]", "\x1b]8;;http://x\x07"]), min_size=1, max_size=12).map("".join) | st.text(max_size=20)


@FAST
@given(model=HOSTILE_NAMES, domain=HOSTILE_NAMES)
def test_trace_info_prints_no_raw_control_bytes(tmp_path, model, domain):
    assume(model.strip() and domain != "code")
    path = tmp_path / "t.parquet"
    write_trace(build_trace(T=40, R=4, model="m" + model, domains=("code", domain)), path)
    for args in (["trace", "info", path], ["trace", "info", path, "--json"],
                 ["trace", "validate", path]):
        code, out, err = cli(*args)
        assert code == 0, err
        assert not RAW_CONTROL.search(out) and not RAW_CONTROL.search(err), (out, err)
    code, out, _ = cli("trace", "info", path, "--json")
    assert json.loads(out)["model"] == "m" + model          # --json is exact, and valid JSON


def test_markup_in_a_model_name_is_printed_as_written(tmp_path):
    path = tmp_path / "t.parquet"
    write_trace(build_trace(T=40, R=4, model="[/][link=http://x]evil[/link]"), path)
    code, out, err = cli("trace", "info", path)
    assert code == 0, err                    # rich would raise MarkupError on "[/]"
    assert "[/][link=http://x]evil[/link]" in out and "\x1b]8" not in out


def test_no_console_bypasses_the_escaping():
    """Consoles are made only in sempar.console (SafeConsole), so no verb can print raw."""
    src = Path(__file__).parents[2] / "src" / "sempar"
    bad = [str(p.relative_to(src)) for p in src.rglob("*.py") if p.name != "console.py"
           and re.search(r"\bConsole\(", p.read_text()) and "SafeConsole(" not in p.read_text()]
    assert bad == []


# ---- kind 2: any byte string is a file name ------------------------------------------------

NAMES = st.binary(min_size=1, max_size=80).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b".."))


@FAST
@given(name=NAMES)
def test_any_byte_name_reads_writes_and_prints(tmp_path_factory, name):
    d = os.fsencode(tmp_path_factory.mktemp("names"))
    path = os.fsdecode(os.path.join(d, name))
    t = build_trace(T=40, R=4)
    write_trace(t, path)
    assert os.listdir(d) == [name]                       # the very bytes, no temporary left
    assert (read_trace(path).experts == t.experts).all()
    code, out, err = cli("trace", "info", path)
    assert code == 0, err
    shown = "".join(printable(os.fsdecode(name), lines=True).split())
    assert not RAW_CONTROL.search(out) and shown in "".join(out.split())    # the title
    code, out, err = cli("place", "--trace", path, "--method", "vanilla", "--ep", "4",
                         "--out", path + ".json")
    assert code == 0 and not RAW_CONTROL.search(err), err
    assert sorted(os.listdir(d)) == sorted([name, name + b".json"])


def test_non_utf8_name_in_a_subprocess(tmp_path):
    """The same through a real process: argv and stderr as the OS gives them."""
    name = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"\xff\x1b[31m.parquet"))
    shutil.copyfile(TRACE, name)
    r = run_cli("trace", "validate", name)
    assert r.returncode == 0 and "\\xff\\x1b[31m.parquet: valid trace" in r.stderr, r.stderr
    r = run_cli("trace", "validate", name + "missing")
    assert r.returncode == 2 and "\x1b" not in r.stderr and len(r.stderr.splitlines()) == 1


# ---- kind 8: a failed write leaves nothing -------------------------------------------------

def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_folder_output_failing_after_two_files_leaves_nothing(tmp_path):
    out = tmp_path / "new" / "deeper" / "plots"
    with pytest.raises(OSError, match="No space left"):
        with atomic_folder(out, "test") as b:
            (b / "fig1.png").write_bytes(b"1")
            (b / "fig2.png").write_bytes(b"2")
            _enospc()
    assert list(tmp_path.iterdir()) == []                 # not even the folders it made


def test_file_output_failing_removes_the_folders_it_made(tmp_path):
    with pytest.raises(OSError):
        with atomic_path(tmp_path / "a" / "b" / "x.png") as tmp:
            tmp.write_bytes(b"half")
            _enospc()
    assert list(tmp_path.iterdir()) == []


def test_folder_rerun_failing_keeps_the_previous_output(tmp_path):
    out = tmp_path / "plots"
    with atomic_folder(out, "test") as b:
        (b / "fig1.png").write_bytes(b"old")
    before = snapshot(tmp_path)
    with pytest.raises(OSError):
        with atomic_folder(out, "test") as b:
            (b / "fig1.png").write_bytes(b"new")
            _enospc()
    assert snapshot(tmp_path) == before


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (root only; skipped where mounting is not permitted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_trace_write_leaves_nothing(small_disk):
    code, _, err = cli("synth", "--preset", "olmoe-1b-7b", "--tokens", "20000",
                       "--out", small_disk / "sub" / "t.parquet")
    assert code == 2 and len(err.splitlines()) == 1 and "No space left" in err, err
    assert list(small_disk.iterdir()) == []


def test_full_disk_folder_write_leaves_nothing(small_disk):
    with pytest.raises(OSError, match="No space left"):
        with atomic_folder(small_disk / "plots", "test") as b:
            for i in range(4):
                (b / f"fig{i}.png").write_bytes(os.urandom(100_000))
    assert list(small_disk.iterdir()) == []


# ---- kind 9: the output rule, verb by verb --------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A user's tree: a trace, a placement, a model folder and a corpus folder (inputs)."""
    w = tmp_path_factory.mktemp("user")
    shutil.copyfile(TRACE, w / "t.parquet")
    code, _, err = cli("place", "--trace", w / "t.parquet", "--method", "vanilla", "--ep", "4",
                       "--out", w / "p.json")
    assert code == 0, err
    if MODEL.is_dir():
        shutil.copytree(MODEL, w / "model", ignore=shutil.ignore_patterns("*.png"))
    (w / "corpus").mkdir()
    (w / "corpus" / "code.txt").write_text("def f(): pass\n")
    (w / "cases").mkdir()
    return w


# verb -> (command with {out}, the input a symlink points at, the input folder or None)
VERBS = {
    "place": ("place --trace {w}/t.parquet --method vanilla --ep 4 --out {out}", "t.parquet", None),
    "export-sglang": ("export --placement {w}/p.json --to sglang --num-hidden-layers 6 --out {out}",
                      "p.json", None),
    "simulate-png": ("simulate --trace {w}/t.parquet --compare --png {out}", "t.parquet", None),
    "synth": ("synth --preset olmoe-1b-7b --tokens 100 --out {out}", None, None),
    "analyze": ("analyze {w}/t.parquet --out {out}", "t.parquet", None),
    "demo": ("demo --out {out}", None, None),
    "corpus-heldout": ("corpus heldout --corpus {w}/corpus --out {out}", "corpus", "corpus"),
    "export-hf": ("export --placement {w}/p.json --to hf-checkpoint --model {w}/model --out {out}",
                  "model", "model"),
    "record": ("record --model {w}/model --text {w}/corpus/code.txt --out {out}", "corpus/code.txt",
               "model"),
}
FOLDER_VERBS = {"analyze", "demo", "corpus-heldout", "export-hf"}


def _forge(folder: Path, how: str) -> None:
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    files = {"thesis.tex": hashlib.sha256(b"years of work").hexdigest()}
    block = {"old-format": {"files": ["thesis.tex"]},
             "bad-mac": {"written_by": "sempar", "format": 2, "kind": "analyze", "files": files,
                         "mac": "0" * 64},
             "no-mac": {"written_by": "sempar", "format": 2, "kind": "analyze", "files": files,
                        "mac": None}}[how]
    (folder / MARKER).write_text(json.dumps(block))


def _case(world: Path, verb: str, hostile: str) -> Path:
    _, target, inside = VERBS[verb]
    case = world / "cases" / f"{verb}-{hostile}"
    if hostile == "link-to-input":
        case.symlink_to(world / target)
    elif hostile == "loop":
        case.symlink_to(case.name)                      # ln -s x x
    elif hostile == "inside-input":
        return world / inside / "out"
    else:
        _forge(case, hostile.removeprefix("forged-"))
    return case


def _applies(verb: str, hostile: str) -> bool:
    _, target, inside = VERBS[verb]
    return {"link-to-input": target is not None, "inside-input": inside is not None,
            "loop": True}.get(hostile, verb in FOLDER_VERBS)


@pytest.mark.parametrize("verb,hostile", [
    (v, h) for v in VERBS for h in ("link-to-input", "loop", "inside-input", "forged-old-format",
                                    "forged-bad-mac", "forged-no-mac") if _applies(v, h)])
def test_hostile_output_is_refused_and_nothing_changes(world, verb, hostile):
    if verb in ("export-hf", "record") and not MODEL.is_dir():
        pytest.skip("tiny models not built")
    out = _case(world, verb, hostile)
    before = snapshot(world)
    code, stdout, err = cli(*VERBS[verb][0].format(w=world, out=out).split())
    assert code == 2, (code, err[-800:])
    lines = err.splitlines()
    # record loads its model before it checks --out (issue 27 kind 10, fixed with the early
    # checks of every verb): until then only its last line is held to the rule here.
    assert lines[-1].startswith("error: ") and (len(lines) == 1 or verb == "record"), err
    assert "--out" in lines[-1] or "--png" in lines[-1], err
    assert snapshot(world) == before


@pytest.mark.parametrize("how", ["old-format", "bad-mac", "no-mac", "copied"])
def test_forced_forged_marker_deletes_nothing(tmp_path, how):
    """--force moves a foreign folder aside whole; its files are all still there."""
    out = tmp_path / "out"
    if how == "copied":             # a real marker, moved with its files, listing a user's file
        with atomic_folder(out, "test") as b:
            (b / "thesis.tex").write_text("years of work")
        (out / "thesis.tex").write_text("edited by the user since")
    else:
        _forge(out, how)
    keep = (out / "thesis.tex").read_text()
    with atomic_folder(out, "test", force=True) as b:
        (b / "a.txt").write_text("new")
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("out.sempar-old-")]
    assert len(aside) == 1 and (aside[0] / "thesis.tex").read_text() == keep
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "a.txt"]


def test_force_never_moves_a_symlinks_target(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    link = tmp_path / "out"
    link.symlink_to(user)
    before = snapshot(tmp_path)
    code, _, err = cli("analyze", TRACE, "--out", link, "--force")
    assert code == 2 and "symlink" in err and len(err.splitlines()) == 1, err
    assert snapshot(tmp_path) == before


def test_own_output_through_a_symlink_is_rewritten_in_place(tmp_path):
    real = tmp_path / "real"
    with atomic_folder(real, "test") as b:
        (b / "a.txt").write_text("1")
    (tmp_path / "link").symlink_to(real)
    with atomic_folder(tmp_path / "link", "test") as b:
        (b / "a.txt").write_text("2")
    assert (real / "a.txt").read_text() == "2" and (tmp_path / "link").is_symlink()


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_file_output_through_a_broken_link_is_refused(tmp_path, kind):
    link = tmp_path / "o.json"
    link.symlink_to("o.json" if kind == "loop" else tmp_path / "nowhere" / "o.json")
    with pytest.raises(InputError, match="symlink"):
        write_text_atomic(link, "x")
    assert os.readlink(link) and sorted(os.listdir(tmp_path)) == ["o.json"]


# ---- kind 2 for the native readers (safetensors, tokenizers, HF): utf8_path ------------------

def test_non_utf8_model_folder_exports_and_tokenizes(tmp_path):
    if not (MODEL / "model.safetensors").is_file():
        pytest.skip("tiny models not built")
    from sempar.models import FileTokenizer

    base = os.fsencode(tmp_path)
    model = os.fsdecode(os.path.join(base, b"m\xff\x1b"))
    shutil.copytree(MODEL, model, ignore=shutil.ignore_patterns("*.png"))
    assert FileTokenizer(os.path.join(model, "tokenizer.json")).tokenizer.get_vocab_size() > 0
    code, _, err = cli("place", "--trace", TRACE, "--method", "vanilla", "--ep", "4",
                       "--out", tmp_path / "p.json")
    assert code == 0, err
    out = os.fsdecode(os.path.join(base, b"ck\xfe"))
    code, _, err = cli("export", "--placement", tmp_path / "p.json", "--to", "hf-checkpoint",
                       "--model", model, "--out", out)
    assert code == 0, err
    assert not RAW_CONTROL.search(err) and "ck\\xfe" in err
    assert (Path(out) / "model.safetensors").is_file()


def test_text_output_quoting_a_non_utf8_name_stays_utf8(tmp_path):
    target = tmp_path / "report.html"
    write_text_atomic(target, "trace: " + os.fsdecode(b"\xff.parquet"))
    assert target.read_bytes().decode("utf-8") == "trace: \\udcff.parquet"
