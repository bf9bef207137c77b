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
    (arrow,) = tmp_path.glob("*/data-*.arrow")
    size = arrow.stat().st_size
    arrow.write_bytes(arrow.read_bytes()[: size // 2] if damage == "truncate" else bytes(size))
    again = build_block_dataset([corpus_file], tokenizer, 32, cache_dir=tmp_path)
    assert len(again) == first and again[first - 1]["input_ids"]
    err = capsys.readouterr().err
    assert f"The corpus cache {arrow.parent} is damaged" in err and "building it again" in err
