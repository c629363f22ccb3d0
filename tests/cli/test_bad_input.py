"""Every bad input to every verb is one line `error: ...` on stderr, exit code 2, no traceback and
no file written (design.md, Command-line contract). One case per class of issue 13 and verb.

Cases run in-process through `sempar.cli.main` (fast); those that on a broken build would start
real work (a benchmark, a testbed, training) run in a subprocess with a time limit instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import build_trace, rewrite
from sempar.cli import main
from sempar.paths import assets_dir
from sempar.trace import write_trace

MODELS = assets_dir() / "models"
NUMBERS = [
    # finite and bounded numbers, one bound per option, named in the message
    ("synth --preset olmoe-1b-7b --tokens 100 --seed -1 --out o.parquet", "--seed: -1"),
    ("synth --preset olmoe-1b-7b --tokens 0 --out o.parquet", "--tokens: 0"),
    ("synth --preset olmoe-1b-7b --tokens 99999999999 --out o.parquet", "--tokens: 99999999999"),
    ("place --trace {good} --method vanilla --ep 4 --seed -1 --out o.json", "--seed: -1"),
    ("place --trace {good} --method eplb --ep 4 --redundant 80000000 --out o.json",
     "--redundant: 80000000 is above the limit"),
    ("place --trace {good} --method vanilla --ep 0 --out o.json", "--ep: 0"),
    ("place --trace {good} --method vanilla --ep 4 --fit-fraction 1 --out o.json",
     "--fit-fraction: 1"),
    ("evaluate --fit {good} --split --ep 4 --seed -3", "--seed: -3"),
    ("evaluate --fit {good} --split --ep 100000", "--ep: 100000 is above the limit"),
    ("evaluate --fit {good} --split --ep 4 --chunk-slack 1", "--chunk-slack: 1.0 must be below 1"),
    ("analyze {good} --seed -1", "--seed: -1"),
    ("analyze {good} --devices 0", "--devices: 0"),
    ("analyze {good} --ep 0", "--ep: 0"),
    ("analyze {good} --ep 2 --devices 2", "--devices: the old spelling of --ep; give one of them"),
    ("analyze {good} --ep 100", "--ep: 100 is not between 1 and the 16 experts"),
    ("simulate --trace {good} --hidden 64 --seed -1", "--seed: -1"),
    ("simulate --trace {good} --hidden 64 --batch 0", "--batch: 0"),
    ("evaluate --fit {good} --split --ep 4 --chunk-slack -0.1", "--chunk-slack: -0.1 must be at least 0"),
    ("simulate --trace {good} --hidden 64 --topology a100x4-ib:100000", "nodes: 100000 is above the limit"),
    ("export --placement {placement} --to sglang --out o.json --num-hidden-layers 100000000",
     "--num-hidden-layers: 100000000 is above the limit"),
    ("cost-route sweep --max-acc-loss nan", "--max-acc-loss: nan is not a finite number"),
    ("cost-route tables --ep 0 --out o.json", "--ep: 0"),
    ("import sglang {placement} --out o.parquet --top-k 0", "--top-k: 0"),
    ("import arrays {placement} --out o.parquet --num-experts 0", "--num-experts: 0"),
    ("record --model tiny-moe64 --text {good} --out o.parquet --max-tokens 0", "--max-tokens: 0"),
]
SLOW_IF_BROKEN = [
    ("bench --preset none --timeout nan", "--timeout: nan is not a finite number"),
    ("bench --preset none --timeout inf", "--timeout: inf is not a finite number"),
    ("profile --hosts 2 --timeout nan --out o.json", "--timeout: nan is not a finite number"),
    ("profile --ep 2 --hosts 2 --out o.json", "--hosts: the old spelling of --ep; give one of them"),
    ("profile --out o.json", "missing option '--ep'"),
    ("testbed up --hosts 2 --ttl nan", "--ttl: nan is not a finite number"),
    ("train-tiny --model tiny-moe64 --corpus {tmp} --minutes nan", "--minutes: nan"),
    # --seed / --ep / --nodes: one declaration and bound each (commands/_options.py)
    ("serve-sim --trace {good} --seed -1", "--seed: -1 must be at least 0"),
    ("plan --trace {good} --seed 1099511627776", "--seed: 1099511627776 is above the limit"),
    ("serve-sim --trace {good} --nodes 0", "--nodes: 0 must be at least 1"),
    ("plan --trace {good} --ep 4,100000", "--ep: 100000 is above the limit"),
    ("stream --seed -1", "--seed: -1 must be at least 0"),
    ("stream --buffer-mb nan", "--buffer-mb: nan is not a finite number"),
    ("stream --micro-slices 100000000", "--micro-slices: 100000000 is above the limit"),
    ("stream --tokens-per-iter 1000000 --iterations 100000",
     "--tokens-per-iter x --iterations: 100000000000 is above the limit"),
]
FILES = [
    # traces: empty, bad layer_ids, absurd shapes, model null
    ("place --trace {empty} --method vanilla --ep 4 --out o.json", "holds no tokens"),
    ("evaluate --fit {empty} --split --ep 4", "holds no tokens"),
    ("trace validate {empty}", "holds no tokens"),
    ("trace validate {dup_layers}", "metadata.layer_ids: layer 1 is listed twice"),
    ("trace validate {neg_layers}", "metadata.layer_ids: -1 is not a layer number"),
    ("trace validate {float_layers}", "metadata.layer_ids: 0.5 is not a layer number"),
    ("trace validate {model_null}", "metadata.model: None is not a model name"),
    ("trace info {huge_experts}", "metadata.num_experts: 2147483648 is above the limit"),
    # placement JSON
    ("export --placement {p_dev0} --to sglang --out o.json", "placement.num_devices: 0"),
    ("export --placement {p_scalar_node} --to sglang --out o.json", "placement.node_of"),
    ("export --placement {p_wrap} --to sglang --out o.json", "beyond 32 bits"),
    # topology JSON
    ("simulate --trace {good} --hidden 64 --topology {t_nokey}", "links\\[0\\] lacks 'beta'"),
    ("simulate --trace {good} --hidden 64 --topology {t_node}", "node_of\\[1\\] = 'a': node ids are integers"),
    ("simulate --trace {good} --hidden 64 --topology {t_dir}", "is a folder"),
    # FIFO inputs would hang
    ("trace info {fifo}", "not a regular file"),
    ("place --trace {fifo} --method vanilla --ep 4 --out o.json", "not a regular file"),
    ("export --placement {fifo} --to sglang --out o.json", "not a regular file"),
    ("simulate --trace {good} --hidden 64 --topology {fifo_json}", "not a regular file"),
    ("record --model tiny-moe64 --text {fifo} --out o.parquet", "not a regular file"),
    # no progress line before the error line
    ("import sglang {bad_dump} --out o.parquet", "not a readable SGLang dump"),
    ("import arrays {bad_dump} --out o.parquet", "not a readable .npz / .npy file"),
    ("import arrays {fifo} --out o.parquet", "not a regular file"),
    # a model folder that cannot be loaded
    ("record --model {bad_model} --text {text} --out o.parquet", "cannot be loaded"),
    # outputs the environment refuses: OSError is one line too
    ("synth --preset olmoe-1b-7b --tokens 100 --out {long_name}", "File name too long"),
    ("synth --preset olmoe-1b-7b --tokens 100 --out {a_file}/o.parquet", "is not a folder"),
    ("place --trace {good} --method vanilla --ep 4 --out {dev_link}", "not a regular file"),
    ("place --trace {good} --method vanilla --ep 4 --out .", "is a folder"),
    ("corpus fetch --out {a_file}", "exists and is not a folder"),
    ("demo --out {a_file}", "exists and is not a folder"),
    ("corpus heldout --corpus {tmp}/none --out h", "no manifest.json"),
    ("testbed down ../x", "testbed name '../x' must be"),
    ("train-tiny --model tiny-moe64 --corpus {tmp} --max-steps 0", "--max-steps: 0"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    good = d / "good.parquet"
    write_trace(build_trace(T=400, R=20, L=3, N=16, k=2), good)
    f = {"good": good, "tmp": d}

    def meta(name, **kv):
        f[name] = rewrite(good, d / f"{name}.parquet", block_edit=lambda b: b["meta"].update(kv))

    meta("dup_layers", layer_ids=[1, 1, 2])
    meta("neg_layers", layer_ids=[0, -1, 2])
    meta("float_layers", layer_ids=[0.5, 1, 2])
    meta("model_null", model=None)
    meta("huge_experts", num_experts=2**31)
    f["empty"] = rewrite(good, d / "empty.parquet", table_edit=lambda t: t.slice(0, 0),
                         block_edit=lambda b: b.update(num_tokens=0, num_requests=0))
    p = {"format_version": 1, "method": "x", "num_experts": 16, "num_devices": 4,
         "node_of": [0, 0, 0, 0], "phy2log": [list(range(16))] * 3}
    for name, edit in (("placement", {}), ("p_dev0", {"num_devices": 0}),
                       ("p_scalar_node", {"node_of": 0}),
                       ("p_wrap", {"phy2log": [[2**32 + i for i in range(16)]] * 3})):
        f[name] = d / f"{name}.json"
        f[name].write_text(json.dumps({**p, **edit}))
    link = {"src": 0, "dst": 1, "alpha": 1e-6, "beta": 1e-9}
    f["t_nokey"] = d / "t_nokey.json"
    f["t_nokey"].write_text(json.dumps({"name": "x", "node_of": [0, 0],
                                        "links": [{"src": 0, "dst": 1, "alpha": 1e-6}]}))
    f["t_node"] = d / "t_node.json"
    f["t_node"].write_text(json.dumps({"name": "x", "node_of": [0, "a"], "links": [link]}))
    f["t_dir"] = d / "t_dir.json"
    f["t_dir"].mkdir()
    f["fifo"] = d / "fifo"
    os.mkfifo(f["fifo"])
    f["fifo_json"] = d / "fifo.json"
    os.mkfifo(f["fifo_json"])
    f["long_name"] = d / ("x" * 300 + ".parquet")
    f["a_file"] = d / "a_file"
    f["a_file"].write_text("")
    f["bad_dump"] = d / "dump_0.pt"
    f["bad_dump"].write_text("not a torch file")
    f["text"] = d / "text.txt"
    f["text"].write_text("a few words of text for the model\n")
    f["bad_model"] = d / "model"
    f["bad_model"].mkdir()
    (f["bad_model"] / "config.json").write_text((MODELS / "tiny-moe64" / "config.json").read_text())
    (f["bad_model"] / "model.safetensors").write_bytes(b"\xff" * 64)
    f["dev_link"] = d / "dev.json"
    f["dev_link"].symlink_to("/dev/null")
    return f


def _check(rc: int, err: str, expected: str, cwd: Path) -> None:
    assert rc == 2, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert "Traceback" not in err
    import re
    assert re.search(expected, lines[0]), lines[0]
    assert sorted(p.name for p in cwd.iterdir()) == [], "a refused run wrote a file"


def _args(template: str, files: dict[str, Path]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in template.split()]


@pytest.mark.parametrize("template,expected", NUMBERS + FILES,
                         ids=[f"{t.split()[0]}:{e[:40]}" for t, e in NUMBERS + FILES])
def test_bad_input_is_one_line_exit_2(template, expected, files, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ex:
        main(_args(template, files))
    _check(ex.value.code, capsys.readouterr().err, expected, tmp_path)


@pytest.mark.parametrize("template,expected", SLOW_IF_BROKEN,
                         ids=[f"{t.split()[0]}:{e[:40]}" for t, e in SLOW_IF_BROKEN])
def test_bad_number_refused_before_any_work(template, expected, files, tmp_path):
    r = subprocess.run([sys.executable, "-m", "sempar.cli", *_args(template, files)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    _check(r.returncode, r.stderr, expected, tmp_path)


def test_no_arguments_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as ex:
        main([])
    assert ex.value.code == 2


SHARED = ("seed", "ep", "nodes", "json", "rates", "duration", "input-len", "output-len",
          "token-budget", "max-running", "slo", "slo-scale")


def test_shared_options_are_declared_once():
    """`--seed`, `--ep`, `--nodes`, `--json` and the serving workload's options come from
    commands/_options.py, so one bound holds for every verb."""
    import re

    commands = Path(__file__).parents[2] / "src" / "sempar" / "commands"
    declared = re.compile(r'typer\.Option\([^()]*"--(' + "|".join(SHARED) + ')"')
    stray = [f"{p.name}: --{m.group(1)}" for p in commands.rglob("*.py") if p.name != "_options.py"
             for m in declared.finditer(p.read_text())]
    assert stray == []
    shared = {m.group(1) for m in declared.finditer((commands / "_options.py").read_text())}
    assert shared == set(SHARED)


def test_check_bound_messages():
    from sempar.bounds import check_bound
    from sempar.errors import InputError

    assert check_bound("--x", 3, 1, 5) == 3
    for value, msg in ((float("nan"), "not a finite"), (0, "at least 1"), (9, "above the limit 5")):
        with pytest.raises(InputError, match=f"--x: .*{msg}"):
            check_bound("--x", value, 1, 5)
    with pytest.raises(InputError, match="must be above 0"):
        check_bound("--t", 0.0, 0, None, lo_open=True)
    assert np.isfinite(check_bound("--t", 1e-9, 0, None, lo_open=True))
    with pytest.raises(InputError, match="--e: 1.0 must be below 1"):
        check_bound("--e", 1.0, 0.0, 1.0, hi_open=True)
    assert check_bound("--e", 0.999, 0.0, 1.0, hi_open=True) == 0.999
