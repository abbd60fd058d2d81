"""Training corpus: the `.py` files of the running Python's standard library.

Data flow (default model):  stdlib `.py` files -> corpus.py (sorted, split by path hash)
-> tokenizer.py (BPE trained on the train split) -> tiny_lm.py (token ids -> target LM)
-> eagle3 trainer (same corpus, same splits).

The corpus is reproducible on any machine with the same Python version: files are listed
in sorted order of their path relative to the stdlib root, and every file lands in a fixed
split chosen by a hash of that relative path, never by chance or by listing order:

    bucket = int(sha1(relpath), 16) % 100
    bucket in {0, 1} -> "heldout"  (~2%: model-card figures, acceptance length)
    bucket in {2, 3} -> "val"      (~2%: checkpoint selection while training)
    otherwise        -> "train"

`site-packages` is skipped; files that are not valid UTF-8 (a handful of encoding tests)
are skipped too.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "val", "heldout")
_SKIP_PARTS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True, slots=True)
class CorpusFile:
    relpath: str  # posix path relative to the stdlib root
    path: Path  # absolute path on this machine

    @property
    def split(self) -> str:
        return split_of(self.relpath)

    def read(self) -> str | None:
        """The file's text, or None when it is not valid UTF-8."""
        try:
            return self.path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return None


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str) -> str:
    """The fixed split of a file, from a hash of its relative posix path."""
    bucket = int(hashlib.sha1(relpath.encode("utf-8")).hexdigest(), 16) % 100
    if bucket < 2:
        return "heldout"
    if bucket < 4:
        return "val"
    return "train"


def _all_files(root: Path | None = None) -> list[CorpusFile]:
    root = root or stdlib_root()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if _SKIP_PARTS.intersection(rel.parts) or not path.is_file():
            continue
        files.append(CorpusFile(rel.as_posix(), path))
    files.sort(key=lambda f: f.relpath)
    return files


def iter_files(
    split: str | None = None, max_files: int | None = None, root: Path | None = None
) -> Iterator[CorpusFile]:
    """Files of one split (all splits when None), sorted by relative path.

    `max_files` keeps the first N files of the split (in sorted order): a deterministic
    subset for tests.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    count = 0
    for f in _all_files(root):
        if split is not None and f.split != split:
            continue
        if max_files is not None and count >= max_files:
            return
        count += 1
        yield f


def load_files(
    split: str | None = None, max_files: int | None = None, root: Path | None = None
) -> list[tuple[str, str]]:
    """(relpath, text) pairs of one split, sorted, skipping non-UTF-8 files."""
    out = []
    for f in iter_files(split, max_files, root):
        text = f.read()
        if text is not None and text.strip():
            out.append((f.relpath, text))
    return out


def load_texts(
    split: str | None = None, max_files: int | None = None, root: Path | None = None
) -> list[str]:
    """Texts of one split, sorted by relative path, skipping non-UTF-8 files."""
    return [text for _, text in load_files(split, max_files, root)]


def fingerprint(split: str | None = None, max_files: int | None = None) -> dict:
    """A small description of the corpus (Python version, file count, content hash)."""
    digest = hashlib.sha1()
    files = load_files(split, max_files)
    for rel, text in files:
        digest.update(rel.encode("utf-8") + b"\0" + text.encode("utf-8") + b"\0")
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "split": split or "all",
        "num_files": len(files),
        "num_chars": sum(len(t) for _, t in files),
        "sha1": digest.hexdigest(),
    }


def main() -> None:
    stats = {s: fingerprint(s) for s in SPLITS}
    print(json.dumps({"root": str(stdlib_root()), "splits": stats}, indent=2))


if __name__ == "__main__":
    main()
