"""Corpus reading, packing into blocks, the Arrow cache, and errors on bad corpora."""

import pytest

from biodistil.config import CorpusConfig
from biodistil.data.corpus import build_block_dataset, iter_lines, load_corpus_splits, resolve_corpus_files
from biodistil.errors import BiodistilError


def test_blocks_are_framed_and_full(tmp_path, corpus_file, tokenizer):
    blocks = build_block_dataset([corpus_file], tokenizer, block_size=32, cache_dir=tmp_path)
    lengths = [len(ids) for ids in blocks["input_ids"]]
    assert all(n == 32 for n in lengths[:-1]) and 3 <= lengths[-1] <= 32
    for ids in blocks["input_ids"]:
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    inner = sum(n - 2 for n in lengths)
    words = sum(len(tokenizer(line, add_special_tokens=False)["input_ids"]) for line in iter_lines([corpus_file]))
    documents = corpus_file.read_text().count("\n\n")
    # every token of the corpus is kept; documents are joined by one [SEP] each
    assert words <= inner <= words + documents + 1


def test_cache_is_reused_and_keyed_by_content(tmp_path, tokenizer):
    path = tmp_path / "c.txt"
    path.write_text("the protein kinase gene .\n" * 50)
    first = build_block_dataset([path], tokenizer, 16, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").iterdir())) == 1
    again = build_block_dataset([path], tokenizer, 16, cache_dir=tmp_path / "cache")
    assert again["input_ids"] == first["input_ids"]
    assert len(list((tmp_path / "cache").iterdir())) == 1
    path.write_text("cancer mice induced .\n" * 50)
    build_block_dataset([path], tokenizer, 16, cache_dir=tmp_path / "cache")
    build_block_dataset([path], tokenizer, 24, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").iterdir())) == 3


def test_folders_and_globs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.txt").write_text("x\n")
    (tmp_path / "a" / "two.txt").write_text("y\n")
    (tmp_path / "a" / "skip.csv").write_text("z\n")
    assert [p.name for p in resolve_corpus_files([str(tmp_path / "a")])] == ["one.txt", "two.txt"]
    assert [p.name for p in resolve_corpus_files([str(tmp_path / "a" / "t*.txt")])] == ["two.txt"]
    with pytest.raises(BiodistilError, match="matches no file"):
        resolve_corpus_files([str(tmp_path / "missing.txt")])


def test_bad_corpus_errors_name_file_and_line(tmp_path, tokenizer):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("fine line\nsecond line\ncaf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(BiodistilError, match=r"latin1.txt:3: not valid UTF-8"):
        build_block_dataset([bad], tokenizer, 16, cache_dir=tmp_path / "cache")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"ok\n\x00\x01\x02\n")
    with pytest.raises(BiodistilError, match=r"binary.txt:2: contains NUL"):
        build_block_dataset([binary], tokenizer, 16, cache_dir=tmp_path / "cache")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(BiodistilError, match="holds no text"):
        build_block_dataset([empty], tokenizer, 16, cache_dir=tmp_path / "cache")
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "cache").iterdir()), "no half-written cache"


def test_held_out_split(tmp_path, corpus_file, tokenizer):
    cfg = CorpusConfig(train=[str(corpus_file)], block_size=32, eval_fraction=0.1, cache_dir=str(tmp_path))
    train, held_out = load_corpus_splits(cfg, tokenizer)
    total = len(build_block_dataset([corpus_file], tokenizer, 32, cache_dir=tmp_path))
    assert len(train) + len(held_out) == total and len(held_out) == -(-total // 10)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("the protein .\n")
    with pytest.raises(BiodistilError, match="too few"):
        load_corpus_splits(CorpusConfig(train=[str(tiny)], block_size=32, cache_dir=str(tmp_path)), tokenizer)


@pytest.mark.parametrize("damage", ["truncate", "zero"])
def test_a_damaged_cache_is_detected_and_rebuilt(tmp_path, corpus_file, tokenizer, capsys, damage):
    first = len(build_block_dataset([corpus_file], tokenizer, 32, cache_dir=tmp_path))
    (arrow,) = tmp_path.glob("*/blocks.arrow")
    size = arrow.stat().st_size
    arrow.write_bytes(arrow.read_bytes()[: size // 2] if damage == "truncate" else bytes(size))
    again = build_block_dataset([corpus_file], tokenizer, 32, cache_dir=tmp_path)
    assert len(again) == first and again[first - 1]["input_ids"]
    err = capsys.readouterr().err
    assert f"The corpus cache {arrow.parent} is damaged" in err and "building it again" in err


def test_blocks_are_packed_from_token_arrays_as_worked_out_by_hand():
    import numpy as np

    from biodistil.data.corpus import pack_arrays

    cls, sep = 101, 102
    chunks = [np.array([1, 2, 3, sep], dtype=np.int32), np.array([sep, 4, 5], dtype=np.int32),
              np.array([6, 7, sep, 8], dtype=np.int32), np.array([sep], dtype=np.int32)]
    blocks = [row.tolist() for array in pack_arrays(chunks, cls, sep, block_size=5) for row in array]
    # bodies of 3: [1 2 3] [sep 4 5] — the repeated [SEP] at the chunk seam is dropped — then [6 7 sep], [8]
    assert blocks == [[cls, 1, 2, 3, sep], [cls, sep, 4, 5, sep], [cls, 6, 7, sep, sep], [cls, 8, sep]]


def test_several_worker_processes_build_the_same_blocks_as_one(tmp_path, corpus_file, tokenizer, monkeypatch):
    import itertools

    from biodistil.data import corpus
    from biodistil.data.corpus import pack_blocks

    monkeypatch.setattr(corpus, "LINES_PER_CHUNK", 37)  # many chunks, so that their order and seams matter

    one = build_block_dataset([corpus_file], tokenizer, 32, cache_dir=tmp_path / "one", workers=1)
    two = build_block_dataset([corpus_file], tokenizer, 32, cache_dir=tmp_path / "two", workers=2)
    assert len(one) > 10 and one["input_ids"] == two["input_ids"]
    streamed = [block["input_ids"] for block in pack_blocks(iter_lines([corpus_file]), tokenizer, 32)]
    assert streamed == one["input_ids"], "pack_blocks, in one process, gives the cache's blocks"
    cut = build_block_dataset([corpus_file], tokenizer, 32, max_lines=40, cache_dir=tmp_path / "cut", workers=2)
    lines = list(itertools.islice(iter_lines([corpus_file]), 40))
    assert cut["input_ids"] == [b["input_ids"] for b in pack_blocks(iter(lines), tokenizer, 32)]
