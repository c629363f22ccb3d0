"""The `sempar trace validate|info` commands: through a real `python -m sempar.cli` process, and
the full matrix of defective files through `sempar.cli.main` in this process (for speed)."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pytest

from bad_traces import BAD_ROW, FILE_CASES
from conftest import build_trace, replace_column, rewrite, run_cli, write_unchecked
from sempar.cli import main
from sempar.trace import write_trace


@pytest.fixture
def good_file(tmp_path):
    p = tmp_path / "good.parquet"
    write_trace(build_trace(), p, row_group_size=16)
    return p


def one_error_line(proc, pattern: str) -> str:
    """Exit 2, nothing on stdout, exactly one stderr line 'error: <message matching pattern>'."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.endswith("\n")
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    message = lines[0][len("error: "):]
    assert re.fullmatch(pattern, message), message
    return message


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_main(capsys, *args) -> Result:
    """Run the console-script entry point in this process (fast; same code path as `sempar`)."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return Result(e.value.code, out, err)


def test_validate_good_file(tmp_path, good_file):
    proc = run_cli("trace", "validate", good_file, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == (f"{good_file}: valid trace: 200 tokens, 20 requests, "
                           "3 layers x 8 experts, top-2\n")


def test_info_json_good_file(tmp_path, good_file):
    proc = run_cli("trace", "info", good_file, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)  # the whole of stdout is one JSON object
    assert isinstance(info, dict)
    assert info == {"tokens": 200, "requests": 20, "layers": 3, "experts": 8, "top_k": 2,
                    "domains": {"code": 100, "math": 90}, "model": "toy-moe",
                    "shared_experts": 0, "vocab_size": 1000, "has_weights": True,
                    "has_token_ids": True, "slots_sorted": True}
    # Nothing else on stdout: a decoder stops exactly at the end of the object.
    obj, end = json.JSONDecoder().raw_decode(proc.stdout)
    assert proc.stdout[end:].strip() == ""


def test_info_json_without_domains_or_weights(tmp_path, capsys):
    p = tmp_path / "plain.parquet"
    write_trace(build_trace(T=210, R=7, weights=False, domains=None, model="other"), p,
                row_group_size=16)
    proc = run_main(capsys, "trace", "info", "--json", p)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["tokens"] == 210 and info["requests"] == 7
    assert info["domains"] == {} and info["has_weights"] is False
    assert info["model"] == "other"


def test_info_table_good_file(tmp_path, good_file):
    proc = run_cli("trace", "info", good_file, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for key, value in (("model", "toy-moe"), ("tokens", "200"), ("requests", "20"),
                       ("layers", "3"), ("experts", "8"), ("top_k", "2")):
        assert re.search(rf"\b{key}\b\W+{value}\b", out), (key, out)
    assert re.search(r"domain code\W+100 tokens", out)
    assert re.search(r"domain math\W+90 tokens", out)


def test_validate_bad_file_in_process(bad_file, capsys):
    """Every defective file of conftest.FILE_CASES, through the CLI's main()."""
    path, pattern = bad_file
    one_error_line(run_main(capsys, "trace", "validate", path), pattern)


def test_info_json_bad_file_in_process(bad_file, capsys):
    path, pattern = bad_file
    one_error_line(run_main(capsys, "trace", "info", "--json", path), pattern)


def test_main_good_file_in_process(good_file, capsys):
    res = run_main(capsys, "trace", "info", "--json", good_file)
    assert res.returncode == 0
    assert json.loads(res.stdout)["domains"] == {"code": 100, "math": 90}


# A representative subset of the defective files, through a real `python -m sempar.cli` process.
# (expert id >= N at row 37 is covered by test_validate_error_names_row_37.)
SUBPROCESS_CASES = ["duplicate_expert", "group_limit_violated", "ragged_experts",
                    "format_version_unknown", "domain_not_in_metadata", "truncated"]


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_validate_bad_file(tmp_path, case):
    path, pattern = FILE_CASES[case](tmp_path)
    one_error_line(run_cli("trace", "validate", path, cwd=tmp_path), pattern)


def test_info_bad_file(tmp_path):
    path, pattern = FILE_CASES["weight_nan"](tmp_path)
    one_error_line(run_cli("trace", "info", path, "--json", cwd=tmp_path), pattern)


def test_validate_error_names_row_37(tmp_path):
    t = build_trace()
    t.experts[BAD_ROW, 0, 1] = 11
    p = write_unchecked(t, tmp_path / "bad.parquet", row_group_size=16)
    msg = one_error_line(run_cli("trace", "validate", p, cwd=tmp_path), r".*")
    assert msg == "experts: row 37 layer 0 slot 1: expert id 11 out of range [0, 8)"


def test_validate_num_requests_wrong(tmp_path, good_file):
    p = rewrite(good_file, tmp_path / "bad.parquet", block_edit=lambda b: b.update(num_requests=21))
    one_error_line(run_cli("trace", "validate", p, cwd=tmp_path),
                   re.escape("metadata.num_requests: 21 but the file holds 20 distinct request ids"))


def test_validate_weights_width_mismatch(tmp_path, good_file):
    def narrow(table):   # format 2: 4 of the 6 float32 weights per row
        w = table.column("weights").combine_chunks()
        rows = np.frombuffer(w.buffers()[1], np.uint8).reshape(len(w), 24)[:, :16].copy()
        return replace_column(table, "weights", pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16), len(w), [None, pa.py_buffer(rows)]))
    p = rewrite(good_file, tmp_path / "bad.parquet", table_edit=narrow)
    one_error_line(run_cli("trace", "validate", p, cwd=tmp_path), r"weights: .*")


@pytest.mark.parametrize("args, pattern", [
    (("trace", "info", "--bogus", "X"), r"No such option: --bogus"),
    (("trace", "validate"), r"Missing argument 'FILE'\.|Missing argument 'file'\."),
    (("trace", "frobnicate", "x"), r"No such command 'frobnicate'\.?"),
])
def test_usage_errors(tmp_path, args, pattern):
    one_error_line(run_cli(*args, cwd=tmp_path), pattern)


def test_unknown_option_on_good_file(tmp_path, good_file):
    one_error_line(run_cli("trace", "info", good_file, "--bogus", cwd=tmp_path),
                   r"No such option: --bogus")


def test_help_exits_zero(capsys):
    proc = run_main(capsys, "trace", "--help")
    assert proc.returncode == 0
    assert "validate" in proc.stdout and "info" in proc.stdout


def test_no_arguments_prints_help(tmp_path):
    proc = run_cli(cwd=tmp_path)
    assert proc.returncode == 2          # usage error, though the help is printed
    assert "Usage" in proc.stdout
