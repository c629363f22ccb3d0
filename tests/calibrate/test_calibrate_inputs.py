"""`calibrate check` reads measurement lines through the safe JSON reader (size and nesting
checked before parsing) and checks their fields; `calibrate --model-dir` bounds the model's
sizes before measuring. Each hostile input is one line and exit 2; every mutation of a valid
line is refused in one line or priced into finite, non-negative figures."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hostile import refused
from sempar.errors import InputError
from sempar.serving.dims import model_dims


def good_lines() -> list[dict]:
    dims = asdict(model_dims("tiny-moe64"))
    return [{"device": "cpu", "torch": "2"},
            {"model": "tiny-moe64", "part": "moe block", "ep": 1, "E": 64, "T": 256,
             "tokens": 128, "measured_us": 80.0, "dims": dims},
            {"model": "tiny-moe64", "part": "attention layer", "phase": "decode", "tokens": 8,
             "context": 512, "measured_us": 20.0},
            {"model": "tiny-moe64", "part": "lm head", "tokens": 16, "measured_us": 30.0,
             "dims": dims}]


def write(path, lines) -> None:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")


def _with(i: int, **fields) -> list:
    lines = good_lines()
    lines[i] = {**lines[i], **fields}
    return lines


def _with_dims(**fields) -> list:
    lines = good_lines()
    lines[1]["dims"] = {**lines[1]["dims"], **fields}
    return lines


HOSTILE = {
    "nested 100,000 deep": lambda: [good_lines()[1], "[" * 100_000 + "]" * 100_000],
    "a string for E": lambda: _with(1, E="8"),
    "a string for the hidden size": lambda: _with_dims(hidden="4096"),
    "hidden size 0": lambda: _with_dims(hidden=0),
    "0 experts": lambda: _with_dims(num_experts=0),
    "negative intermediate size": lambda: _with_dims(moe_intermediate=-64),
    "top-k 100 of 64": lambda: _with_dims(top_k=100),
    "E above the experts": lambda: _with(1, E=1000),
    "a line of 100 KB": lambda: [good_lines()[1], json.dumps({"pad": "x" * 100_000})],
    "a list for mla": lambda: _with_dims(mla=[0, 0, 0]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_measurement_lines_are_one_line(tmp_path, case):
    write(tmp_path / "m.jsonl", HOSTILE[case]())
    refused(["calibrate", "check", "--measurements", tmp_path / "m.jsonl"], tmp_path)


def test_the_good_lines_are_priced(tmp_path):
    from hostile import run

    write(tmp_path / "m.jsonl", good_lines())
    code, out, err = run(["calibrate", "check", "--measurements", tmp_path / "m.jsonl",
                          "--json"], tmp_path)
    assert code == 0, err
    assert len(json.loads(out)["lines"]) == 3


CONFIG = {"hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 2,
          "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 512,
          "vocab_size": 1000}


@pytest.mark.parametrize("field, value", [("hidden_size", 0), ("hidden_size", -1024),
                                          ("num_experts_per_tok", 100), ("vocab_size", 0),
                                          ("intermediate_size", 1 << 30)])
def test_model_dir_sizes_are_bounded_before_measuring(tmp_path, field, value):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**CONFIG, field: value}))
    out = tmp_path / "p.json"
    line = refused(["calibrate", "--device", "cpu", "--model-dir", folder, "--out", out],
                   tmp_path, "config.json", out)
    assert "measured" not in line


# ---- property: every mutation refused in one line, or finite non-negative figures ----------

JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                        st.lists(st.integers(-3, 3), max_size=4), st.just({}))


@settings(max_examples=100, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_mutation_of_a_line_is_refused_or_priced(tmp_path, data):
    from sempar.calibrate.check import check
    from sempar.calibrate.lines import read_lines
    from sempar.serving.hardware import ACCELERATORS

    lines = good_lines()
    i = data.draw(st.integers(1, len(lines) - 1))
    target = lines[i]
    if "dims" in target and data.draw(st.booleans()):
        target = target["dims"]
    key = data.draw(st.sampled_from(sorted(target)))
    if data.draw(st.integers(0, 4)) == 0:
        del target[key]
    else:
        target[key] = data.draw(JSON_VALUES)
    write(tmp_path / "m.jsonl", lines)
    try:
        _, points = read_lines(tmp_path / "m.jsonl")
        res = check(points, ACCELERATORS.get("h100"))
    except InputError as err:
        assert str(err) and "\n" not in str(err)
        return
    for ln in res["lines"]:
        for k in ("measured_us", "predicted_us", "roofline_us"):
            assert math.isfinite(ln[k]) and ln[k] >= 0, (k, ln)
    for k in ("median_abs_error", "p90_abs_error", "max_abs_error"):
        assert math.isfinite(res[k]) and res[k] >= 0


@pytest.mark.parametrize("field, value", [("hidden", 0), ("num_experts", 0), ("top_k", 999),
                                          ("moe_intermediate", -8)])
def test_profile_dims_are_checked_alike(tmp_path, field, value):
    from sempar.serving.accel_profile import shipped_profile

    raw = shipped_profile("h100").to_json()
    raw["entries"][0]["dims"][field] = value
    (tmp_path / "p.json").write_text(json.dumps(raw))
    write(tmp_path / "m.jsonl", good_lines())
    refused(["calibrate", "check", "--accelerator-profile", tmp_path / "p.json",
             "--measurements", tmp_path / "m.jsonl"], tmp_path, field)
