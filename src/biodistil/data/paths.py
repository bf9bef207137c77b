"""Where the biomedical datasets live: --data, else $BIODISTIL_DATA, else ../shared/data beside the repo."""

import os
from pathlib import Path

from biodistil.errors import BiodistilError

DATA_ENV = "BIODISTIL_DATA"
_REPO_ROOT = Path(__file__).resolve().parents[3]


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """Return the data folder: the explicit one, else $BIODISTIL_DATA, else ../shared/data next to the repo."""
    candidates: list[tuple[str, Path]] = []
    if explicit:
        candidates.append(("--data", Path(explicit)))
    elif os.environ.get(DATA_ENV):
        candidates.append((f"${DATA_ENV}", Path(os.environ[DATA_ENV])))
    else:
        candidates.append(("default", _REPO_ROOT.parent / "shared" / "data"))
    origin, root = candidates[0]
    if root.is_dir():
        return root.resolve()
    raise BiodistilError(
        f"Data folder not found: {root} (from {origin}). Pass --data DIR or set {DATA_ENV}=DIR to a folder "
        "laid out like the biodistil data folder (corpus/biomed.txt, ner/ncbi_disease/{train,devel,test}.tsv, ...). "
        "The public datasets come from the BioBERT and BLURB releases; see README.md, section 'Data'."
    )


def require_file(root: Path, relative: str) -> Path:
    """Return root/relative, or a clear error naming the missing file."""
    path = root / relative
    if not path.is_file():
        raise BiodistilError(f"Expected data file {path} (relative path '{relative}' under data folder {root}).")
    return path
