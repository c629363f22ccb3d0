"""Where sempar finds its data: the packaged assets (tokenizer, tiny models, dev traces and the
real-model routing traces) and the read-only extra real data (`shared/data/real/`)."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "SEMPAR_REAL_DATA"


def real_data_dir() -> Path | None:
    """The `data/real` folder: $SEMPAR_REAL_DATA when set (None when that is not a folder: a
    path that does not exist, such as /nonexistent, hides `shared/` the way a user's machine
    lacks it), else `../shared/data/real` beside the checkout or the working directory; None
    when none exists."""
    if os.environ.get(ENV):
        given = Path(os.environ[ENV])
        return given if given.is_dir() else None
    repo = Path(__file__).resolve().parents[2]
    candidates = [repo.parent / "shared" / "data" / "real",
                  Path.cwd().parent / "shared" / "data" / "real",
                  Path.cwd() / "shared" / "data" / "real"]
    for c in candidates:
        if c.is_dir():
            return c
    return None


def olmoe_aggregates_dir() -> Path | None:
    root = real_data_dir()
    if root is None or not (root / "olmoe-routing-aggregates").is_dir():
        return None
    return root / "olmoe-routing-aggregates"


def assets_dir() -> Path:
    """The package's committed assets: tokenizer, tiny models, dev traces."""
    return Path(__file__).resolve().parent / "assets"


def packaged_model_dir(name: object) -> Path | None:
    """The folder of the packaged model called exactly `name` (assets/models/NAME), or None.

    `name` often comes from a file (a trace's `meta.model`): only a plain folder name counts, so
    "../../x" or an absolute path never leads outside the package's models."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name \
            or "\0" in name:
        return None
    d = assets_dir() / "models" / name
    return d if d.is_dir() else None


DEV_TRACES = ("tiny-moe64", "tiny-mixtral")


def dev_trace_paths() -> list[Path]:
    """The committed dev traces recorded from the tiny models (those that exist)."""
    return [p for p in (assets_dir() / "traces" / f"{n}.parquet" for n in DEV_TRACES) if p.is_file()]


# The real-model routing that ships with sempar (assets/traces/NOTICE: licences, sources):
# model (preset) name -> trace file stem. Rebuilt by scripts/make-real-assets.sh.
REAL_TRACES = {"deepseek-v2-lite": "deepseek-v2-lite-esft", "gpt-oss-20b": "gpt-oss-20b-mmlu"}


def real_trace_path(name: str) -> Path:
    """The packaged real trace called `name`: a model name of REAL_TRACES ("gpt-oss-20b") or
    its file stem ("gpt-oss-20b-mmlu"). Raises InputError for any other name."""
    from sempar.errors import InputError

    stem = REAL_TRACES.get(name, name)
    if stem not in REAL_TRACES.values():
        raise InputError(f"real trace {name!r}: not one of "
                         f"{', '.join(sorted({*REAL_TRACES, *REAL_TRACES.values()}))}")
    return assets_dir() / "traces" / f"{stem}.parquet"
