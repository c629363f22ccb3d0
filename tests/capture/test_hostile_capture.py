"""Hostile input to `sempar capture`, the routed-response importers, `import arrays` and the
router's prompt reader, by kind (issue 37): outputs onto files sempar did not write (kind 5),
text and files that crashed (kind 6), values silently narrowed (kind 7). Each refusal is one
line, exit 2, nothing written."""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[0]))
from test_capture_cli import cli, one_line, saved_lines, serve  # noqa: E402

from engine_fixture_server import Faults, needs_vllm  # noqa: E402
from sempar.errors import InputError  # noqa: E402


def capture(capsys, url, prompts, out, engine="sglang", *extra):
    return cli(capsys, "capture", "--url", url, "--engine", engine, "--prompts", str(prompts),
               "--out", str(out), "--model-dir", "tiny-moe64", "--max-new-tokens", "2",
               "--tries", "1", *extra)


def prompts_file(tmp_path, *lines: str) -> Path:
    p = tmp_path / "p.jsonl"
    p.write_bytes(b"".join(x.encode("utf-8", "surrogatepass") + b"\n" for x in lines))
    return p


# ---- kind 5: never replace a file sempar did not write -----------------------------------

@pytest.mark.parametrize("how", ["file", "symlink", "trace-like"])
def test_outputs_never_replace_a_foreign_file(capsys, tmp_path, how):
    victim = tmp_path / "thesis.parquet"
    victim.write_bytes(b"PAR1 years of work" if how == "trace-like" else b"years of work")
    out = victim
    if how == "symlink":
        out = tmp_path / "link.parquet"
        out.symlink_to(victim)
    p = prompts_file(tmp_path, json.dumps({"input_ids": [1, 2, 3]}))
    np.savez(tmp_path / "a.npz", experts=np.zeros((2, 6, 8), np.int32) + np.arange(8))
    lines, _ = saved_lines("sglang", 1)
    (tmp_path / "r.jsonl").write_text(lines[0] + "\n")
    with serve(Faults()) as url:
        runs = [capture(capsys, url, p, out),
                cli(capsys, "import", "arrays", str(tmp_path / "a.npz"), "--out", str(out)),
                cli(capsys, "import", "sglang-routed", str(tmp_path / "r.jsonl"), "--out",
                    str(out), "--model-dir", "tiny-moe64"),
                cli(capsys, "synth", "--preset", "mixtral-8x7b", "--tokens", "10", "--out", str(out))]
    for code, err in runs:
        assert code == 2 and "sempar did not write" in one_line(err), err
    assert victim.read_bytes().endswith(b"years of work")


def test_sempar_replaces_its_own_output_until_someone_edits_it(capsys, tmp_path):
    out = tmp_path / "t.parquet"
    args = ("synth", "--preset", "mixtral-8x7b", "--tokens", "10", "--out", str(out))
    assert cli(capsys, *args)[0] == 0
    assert cli(capsys, *args)[0] == 0                  # its own: replaced
    with open(out, "ab") as f:
        f.write(b"x")                                  # changed since: foreign now
    code, err = cli(capsys, *args)
    assert code == 2 and "changed since" in one_line(err)


def test_package_files_are_never_outputs(capsys, tmp_path, monkeypatch):
    import sempar
    from sempar.output_rule import PACKAGE_ASSETS_ENV, check_output

    asset = Path(sempar.__file__).parent / "assets" / "traces" / "tiny-moe64.parquet"
    before = asset.read_bytes() if asset.exists() else None
    code, err = cli(capsys, "synth", "--preset", "mixtral-8x7b", "--tokens", "10", "--out", str(asset))
    assert code == 2 and "package folder" in one_line(err)
    assert (asset.read_bytes() if asset.exists() else None) == before
    with pytest.raises(InputError, match="package folder"):
        check_output(Path(sempar.__file__).parent / "new.json")
    monkeypatch.setenv(PACKAGE_ASSETS_ENV, "1")         # sempar's own build tooling
    check_output(Path(sempar.__file__).parent / "new.json")


# ---- kind 6: hostile text and files --------------------------------------------------------

@pytest.mark.parametrize("line, match", [
    ('{"text": "a\\ud800b"}', "lone surrogate"),
    ('{"input_ids": [1], "domain": "x\\udcff"}', "lone surrogate"),
    ("[" * 5000 + "]" * 5000, "nested 5000 levels"),
    ('{"input_ids": [1], "id": true}', "id is not a string"),
])
def test_hostile_prompt_lines(capsys, tmp_path, line, match):
    p = prompts_file(tmp_path, line)
    with serve(Faults()) as url:
        code, err = capture(capsys, url, p, tmp_path / "t.parquet")
    assert code == 2 and match in one_line(err), err
    assert not (tmp_path / "t.parquet").exists()


def test_a_huge_prompt_line_is_refused_by_its_bytes(capsys, tmp_path, monkeypatch):
    from sempar.capture import prompts

    monkeypatch.setattr(prompts, "PROMPT_LINE_BYTES_MAX", 1000)
    p = prompts_file(tmp_path, json.dumps({"text": "word " * 10_000}))

    def no_tokenising(*a):
        raise AssertionError("tokenised before the line's size was checked")

    monkeypatch.setattr("sempar.trace.record.encode", no_tokenising)
    with pytest.raises(InputError, match="longer than 1000 bytes"):
        prompts.read_prompts(p, object())


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999", "http://", "ftp://x"])
def test_bad_urls(capsys, tmp_path, url):
    p = prompts_file(tmp_path, json.dumps({"input_ids": [1, 2]}))
    code, err = capture(capsys, url, p, tmp_path / "t.parquet")
    assert code == 2 and "--url" in one_line(err)


def test_deeply_nested_saved_response(capsys, tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"response": ' + "[" * 5000 + "]" * 5000 + "}\n")
    code, err = cli(capsys, "import", "sglang-routed", str(f), "--out", str(tmp_path / "t.parquet"),
                    "--model-dir", "tiny-moe64")
    assert code == 2 and "nested" in one_line(err)


def _member(shape, dtype="<i4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue() + b"\0" * 64


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_npz_member_claiming_more_than_it_holds(capsys, tmp_path, compression):
    f = tmp_path / "a.npz"
    with zipfile.ZipFile(f, "w", compression) as z:
        z.writestr("experts.npy", _member((4_000_000, 6, 8)))     # 768 MB claimed in 200 bytes
    code, err = cli(capsys, "import", "arrays", str(f), "--out", str(tmp_path / "t.parquet"))
    assert code == 2 and "header claims" in one_line(err)


@pytest.mark.parametrize("arrays, match", [
    ({"domain": np.array([b"a\xff", b"b"])}, "not UTF-8"),
    ({"domains": np.array([b"\xc3", b"b"]), "domain": np.array([0, 1])}, "not UTF-8"),
    ({"experts": np.zeros((0, 6, 8), np.int32), "request_id": np.zeros(0, np.int32)}, "no routing"),
    ({"token_id": np.array([2**32 + 5, 3])}, "not in [0, 2147483647]"),
])
def test_hostile_npz_content(capsys, tmp_path, arrays, match):
    a = {"experts": np.zeros((2, 6, 8), np.int32) + np.arange(8), **arrays}
    np.savez(tmp_path / "a.npz", **a)
    code, err = cli(capsys, "import", "arrays", str(tmp_path / "a.npz"), "--out",
                    str(tmp_path / "t.parquet"))
    assert code == 2 and match in one_line(err), err
    assert not (tmp_path / "t.parquet").exists()


# ---- kind 7: no silent narrowing -----------------------------------------------------------

@pytest.mark.parametrize("ids", [[1, 2**32 + 5], [2**40], [True, 2], [1, -1], [1.0]])
def test_token_ids_out_of_range_or_not_integers(capsys, tmp_path, ids):
    p = prompts_file(tmp_path, json.dumps({"input_ids": ids}))
    with serve(Faults()) as url:
        code, err = capture(capsys, url, p, tmp_path / "t.parquet")
    assert code == 2 and "not a list of token ids" in one_line(err)
    for engine in ("sglang", "vllm"):
        line = json.loads(saved_lines(engine, 1)[0][0])
        key = "input_ids" if engine == "sglang" else "token_ids"
        line["request"][key] = ids
        f = tmp_path / "r.jsonl"
        f.write_text(json.dumps(line) + "\n")
        code, err = cli(capsys, "import", f"{engine}-routed", str(f), "--out",
                        str(tmp_path / "t.parquet"), "--model-dir", "tiny-moe64")
        assert code == 2 and "not a list of token ids" in one_line(err), err


# ---- the router's prompt reader --------------------------------------------------------------

def _model(tmp_path, template: bytes | None = None, config: dict | None = None) -> Path:
    from sempar.models import resolve_model

    d = tmp_path / "m"
    d.mkdir()
    src = resolve_model("tiny-moe64").model_dir
    for name in ("config.json", "tokenizer.json"):
        (d / name).write_bytes((src / name).read_bytes())
    if template is not None:
        (d / "chat_template.jinja").write_bytes(template)
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


RAISING = (b"{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
           b"{{ raise_exception('unknown role ' + m['role']) }}{% endif %}{{ m['content'] }}"
           b"{% endfor %}")


def test_prompt_text_refuses_surrogates_and_bad_ids(tmp_path):
    from sempar.prompt import PromptError, PromptTokenizer

    tok = PromptTokenizer(_model(tmp_path, RAISING))
    assert tok.tokens("/v1/completions", {"prompt": "hello"}).size > 0
    for route, body in [("/v1/completions", {"prompt": "a\ud800"}),
                        ("/v1/chat/completions", {"messages": [{"content": "x\udfff"}]}),
                        ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}),
                        ("/generate", {"input_ids": [1, 2**32 + 5]}),
                        ("/generate", {"input_ids": [[1], [True]]}),
                        ("/v1/completions", {"prompt": [2**40]})]:
        with pytest.raises(PromptError):
            tok.tokens(route, body)


@pytest.mark.parametrize("template, config, match", [
    (b"{% for m in messages %}{{ m['content'] }", None, "does not compile"),
    (b"\xff\xfe{{ messages }}", None, "not UTF-8"),
    (None, {"chat_template": "{% if %}"}, "does not compile"),
])
def test_bad_chat_templates_are_refused_at_start(tmp_path, template, config, match):
    from sempar.prompt import PromptTokenizer

    with pytest.raises(InputError, match=match):
        PromptTokenizer(_model(tmp_path, template, config))


# ---- kind 8: the file named on a full disk; the SGLang map's size bounded -----------------------

def test_a_full_disk_names_the_trace(tmp_path, monkeypatch):
    import pyarrow.parquet as pq
    from conftest import build_trace

    from sempar.trace import write_trace

    def full(self, *a, **k):
        raise OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    with pytest.raises(OSError) as err:
        write_trace(build_trace(), tmp_path / "t.parquet")
    assert err.value.filename == str(tmp_path / "t.parquet") and err.value.errno == 28
    assert list(tmp_path.iterdir()) == []


def test_sglang_map_size_is_bounded():
    from sempar.bounds import SGLANG_MAP_ENTRIES_MAX
    from sempar.export.engines import ModelLayout, to_sglang
    from sempar.placement.placement import Placement

    p = Placement(np.tile(np.arange(4096), (2, 1)), 4096, 8)
    layers = SGLANG_MAP_ENTRIES_MAX // 4096 + 1
    with pytest.raises(InputError, match="map entries"):
        to_sglang(p, ModelLayout(layers, (0, 1)))


# ---- kind 9: a preset's node count in ASCII; arrival times bounded --------------------------

@pytest.mark.parametrize("name", ["pcie-upi8:²", "pcie-upi8:٨", "a100x4-ib:1e3", "a100x4-ib:99999999"])
def test_topology_node_counts_are_ascii_integers(name):
    from sempar.comm.topology_presets import load_topology

    with pytest.raises(InputError, match="node count|nodes"):
        load_topology(name)


@pytest.mark.parametrize("text", ["1e308\n0\n", "[0, 1e300]", "[0, true]", "-1\n", "nan\n", "[[1]]"])
def test_arrival_times_are_bounded(tmp_path, text):
    from sempar.serving.workload import read_arrivals

    (tmp_path / "a.txt").write_text(text)
    with pytest.raises(InputError, match="--arrivals"):
        read_arrivals(tmp_path / "a.txt")


# ---- what a captured trace knows about itself: slot order --------------------------------------

@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_captured_traces_say_their_slots_are_unsorted(capsys, tmp_path, engine):
    import dataclasses

    from conftest import build_trace

    from sempar.affinity.analysis import analyze_trace
    from sempar.trace import read_trace, write_trace
    from sempar.trace.schema import require_sorted_slots

    p = prompts_file(tmp_path, *[json.dumps({"input_ids": list(range(3 + i, 20 + i))})
                                 for i in range(8)])
    with serve(Faults()) as url:
        assert capture(capsys, url, p, tmp_path / "t.parquet", engine)[0] == 0
    t = read_trace(tmp_path / "t.parquet")
    assert t.meta.slots_sorted is False
    with pytest.raises(InputError, match="unsorted top-k order"):
        require_sorted_slots(t.meta, "top-1 look-back")
    a = analyze_trace(t, devices=4)
    assert all(v is None for v in a.lookback_expert) and "slots_sorted" in a.info["lookback"]
    sorted_trace = build_trace()                      # files without the field: sorted
    write_trace(sorted_trace, tmp_path / "s.parquet")
    assert read_trace(tmp_path / "s.parquet").meta.slots_sorted is True
    unsorted = dataclasses.replace(sorted_trace.meta, slots_sorted=False)
    assert unsorted.to_json()["slots_sorted"] is False
    with pytest.raises(InputError, match="slots_sorted"):
        dataclasses.replace(sorted_trace.meta, slots_sorted="no")


# ---- vLLM 0.33.0's OpenAI route --------------------------------------------------------------

@needs_vllm
def test_vllm_openai_route_equals_the_token_route(capsys, tmp_path):
    """The fixture reads the body with vLLM's own CompletionRequest and writes the answer with
    its CompletionResponse; a saved /v1/completions request + response imports the same."""
    from sempar.trace import read_trace

    p = prompts_file(tmp_path, *[json.dumps({"input_ids": list(range(3 + i, 9 + i))})
                                 for i in range(3)])
    with serve(Faults()) as url:
        for engine in ("vllm", "vllm-openai"):
            code, err = capture(capsys, url, p, tmp_path / f"{engine}.parquet", engine)
            assert code == 0, err
    a, b = read_trace(tmp_path / "vllm.parquet"), read_trace(tmp_path / "vllm-openai.parquet")
    np.testing.assert_array_equal(a.token_id, b.token_id)
    np.testing.assert_array_equal(a.position, b.position)
    assert a.meta.extra["capture"]["prompt_tokens"] == b.meta.extra["capture"]["prompt_tokens"]
    line = json.loads(saved_lines("vllm", 1)[0][0])
    choice = line["response"]["choices"][0]
    choice["prompt_token_ids"] = line["request"]["token_ids"]
    saved = {"request": {"prompt": line["request"]["token_ids"], "max_tokens": 3,
                         "return_token_ids": True, "routed_experts_prompt_start": 0},
             "response": {"object": "text_completion", "choices": [choice]}}
    (tmp_path / "r.jsonl").write_text(json.dumps(saved) + "\n")
    code, err = cli(capsys, "import", "vllm-routed", str(tmp_path / "r.jsonl"), "--out",
                    str(tmp_path / "i.parquet"), "--model-dir", "tiny-moe64")
    assert code == 0, err
    assert read_trace(tmp_path / "i.parquet").meta.extra["capture"]["prompt_tokens"] == [4]


# ---- prefill and decode rows as a column -------------------------------------------------------

@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_capture_and_import_write_the_decode_column(capsys, tmp_path, engine):
    from conftest import build_trace

    from sempar.capture.job import decode_mask
    from sempar.trace import concat, read_trace, write_trace

    p = prompts_file(tmp_path, *[json.dumps({"input_ids": list(range(3, 8 + i))}) for i in range(3)])
    with serve(Faults()) as url:
        assert capture(capsys, url, p, tmp_path / "t.parquet", engine)[0] == 0
    t = read_trace(tmp_path / "t.parquet")
    assert t.decode is not None and t.decode.dtype == np.bool_
    np.testing.assert_array_equal(t.decode, decode_mask(t.meta, t.request_id, t.position))
    assert int(t.decode.sum()) == 3 * 1 and int((~t.decode).sum()) == 5 + 6 + 7
    lines, _ = saved_lines(engine, 2)
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    assert cli(capsys, "import", f"{engine}-routed", str(tmp_path / "r.jsonl"), "--out",
               str(tmp_path / "i.parquet"), "--model-dir", "tiny-moe64")[0] == 0
    i = read_trace(tmp_path / "i.parquet")
    assert i.decode.tolist() == [False] * 4 + [True] * 2 + [False] * 5 + [True] * 2
    old = build_trace()                                   # older files: no column, still read
    write_trace(old, tmp_path / "old.parquet")
    assert read_trace(tmp_path / "old.parquet").decode is None
    both = concat([t, t])
    assert both.decode.size == 2 * t.num_tokens
    write_trace(both.take(np.arange(4)), tmp_path / "part.parquet")
    assert read_trace(tmp_path / "part.parquet").decode.tolist() == t.decode[:4].tolist()


def test_build_tooling_may_rewrite_a_committed_asset(capsys, tmp_path, monkeypatch):
    """With SEMPAR_WRITE_PACKAGE_ASSETS=1 a file in the package (committed, not in the ledger)
    may be replaced; without it the same command is refused."""
    import sempar
    from sempar.output_rule import PACKAGE_ASSETS_ENV

    target = Path(sempar.__file__).parent / "assets" / "h37c-test.parquet"
    target.write_bytes(b"committed")
    try:
        args = ("synth", "--preset", "mixtral-8x7b", "--tokens", "10", "--out", str(target))
        code, err = cli(capsys, *args)
        assert code == 2 and "package folder" in one_line(err)
        monkeypatch.setenv(PACKAGE_ASSETS_ENV, "1")
        assert cli(capsys, *args)[0] == 0 and target.read_bytes()[:4] == b"PAR1"
    finally:
        target.unlink()


def test_exflow_simulation_refuses_unsorted_slots():
    import dataclasses

    from conftest import build_trace

    from sempar.comm.compare import Study
    from sempar.comm.pipelines import PIPELINES
    from sempar.comm.simulate import SimOptions
    from sempar.comm.topology_presets import load_topology

    chained = [n for n in PIPELINES.names() if PIPELINES.get(n).chained]
    assert chained
    t = build_trace(T=400, R=20)
    t = dataclasses.replace(t, meta=dataclasses.replace(t.meta, slots_sorted=False))
    study = Study.from_trace(t, SimOptions(hidden=64, batch=64))
    with pytest.raises(InputError, match="unsorted top-k order"):
        study.run("vanilla", chained[0], load_topology("pcie-upi8"))
