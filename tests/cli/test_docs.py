"""The README and docs/: CI runs the README's test command verbatim, and every relative link resolves."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_ci_runs_the_readmes_test_command_verbatim():
    readme = (ROOT / "README.md").read_text().split("\n")
    assert readme[2] == "```bash" and readme[5] == "```"
    setup, tests = readme[3], readme[4]
    assert setup.endswith(".venv/bin/sempar demo --out sempar-demo")
    assert tests in (ROOT / ".ci" / "run").read_text().split("\n")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        assert (page.parent / path).exists(), f"{page.name}: {target}"
