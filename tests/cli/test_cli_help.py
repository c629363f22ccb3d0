"""`sempar --help` answers at once: building the CLI imports no heavy library (each verb imports
what it needs inside its function; a help text that names what a heavy module holds is generated
when that verb's help is asked for), and the verbs are listed in the data flow's order.

Checked on `sys.modules` in a fresh interpreter, not timed: a timing test fails on a loaded
machine and passes a regression on a fast one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "scipy", "torch", "matplotlib", "pyarrow", "sklearn", "numba", "transformers",
         "pandas", "safetensors", "tokenizers", "ray", "aiohttp", "uvicorn", "starlette")


def imported_after(code: str) -> set[str]:
    """The top-level packages of HEAVY that a fresh interpreter holds after running `code`."""
    probe = (f"import sys\n{code}\n"
             f"import json; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & "
             f"set({list(HEAVY)!r}))))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def test_building_the_cli_imports_no_heavy_library():
    assert imported_after("import sempar.cli") == set()


def test_top_level_help_imports_no_heavy_library():
    code = ("import contextlib, io\nfrom sempar.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit as e:\n"
            "        assert e.code == 0, e.code")
    assert imported_after(code) == set()


def test_verbs_are_listed_in_the_data_flow_order():
    import typer

    from sempar.cli import app
    from sempar.commands import ORDER

    group = typer.main.get_command(app)
    verbs = set(group.commands)
    assert verbs <= set(ORDER), f"name these verbs in commands.ORDER: {sorted(verbs - set(ORDER))}"
    assert group.list_commands(None) == [v for v in ORDER if v in verbs]


def test_help_lists_the_verbs_in_that_order(capsys):
    from sempar.cli import main
    from sempar.commands import ORDER

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    rows = [line.strip("│ ").split(" ")[0] for line in text.splitlines() if line.startswith("│ ")]
    listed = [w for w in rows if w in ORDER]
    assert listed == [v for v in ORDER if v in listed] and len(listed) >= 20, listed


@pytest.mark.parametrize("argv, needle", [
    (["place", "--help"], "kmeans2d"),                 # a registry, imported for this help
    (["import", "arrays", "--help"], "input_ids"),     # a help generated from trace.arrays
    (["synth", "--help"], "deepseek-v2-lite"),
])
def test_a_verbs_help_still_names_its_choices(capsys, argv, needle):
    from sempar.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert needle in " ".join(capsys.readouterr().out.replace("│", " ").split())
