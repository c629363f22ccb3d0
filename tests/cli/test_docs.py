"""The README and docs/: CI runs the README's test command verbatim, and every relative link resolves."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_ci_runs_the_readmes_commands_verbatim():
    """.ci/run runs the lines of README's first bash block as they are (.ci/readme-commands prints
    them): install + the demo, then install + the test command."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    printed = subprocess.run(["bash", str(ROOT / ".ci" / "readme-commands")], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    assert printed == block and len(block) == 2
    setup, tests = block
    assert setup.endswith(".venv/bin/sempar demo --out sempar-demo")
    assert "-m pytest" in tests and "'.[test]'" in tests
    assert "readme-commands" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        assert (page.parent / path).exists(), f"{page.name}: {target}"
