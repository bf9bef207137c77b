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

    monkeypatch.setattr(corpus, "RANGE_BYTES", 997)  # many ranges, so that their order and seams matter

    one = build_block_dataset([corpus_file], tokenizer, 32, cache_dir=tmp_path / "one", workers=1)
    two = build_block_dataset([corpus_file], tokenizer, 32, cache_dir=tmp_path / "two", workers=2)
    assert len(one) > 10 and one["input_ids"] == two["input_ids"]
    streamed = [block["input_ids"] for block in pack_blocks(iter_lines([corpus_file]), tokenizer, 32)]
    assert streamed == one["input_ids"], "pack_blocks, in one process, gives the cache's blocks"
    cut = build_block_dataset([corpus_file], tokenizer, 32, max_lines=40, cache_dir=tmp_path / "cut", workers=2)
    lines = list(itertools.islice(iter_lines([corpus_file]), 40))
    assert cut["input_ids"] == [b["input_ids"] for b in pack_blocks(iter(lines), tokenizer, 32)]


@pytest.mark.parametrize("lowercase", [True, False])
def test_the_bert_word_shortcut_gives_the_tokenizers_own_ids(tmp_path, tokenizer, corpus_file, lowercase):
    import json

    from tokenizers import Tokenizer

    from biodistil.data.corpus import _BertWords, _LineEncoder

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["normalizer"]["lowercase"] = lowercase  # cased WordPiece (BioBERT) as well as uncased
    # the reference encodes without padding or truncation, whatever state an earlier call left the session's
    # tokenizer in (a call with padding=True keeps it on its backend)
    spec["padding"], spec["truncation"] = None, None
    reference = Tokenizer.from_str(json.dumps(spec))
    # saved as MiniLM's is: padding and truncation to 16 tokens, which corpus blocks must not take
    spec["padding"] = {"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                       "pad_type_id": 0, "pad_token": "[PAD]"}
    spec["truncation"] = {"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0}
    spec_json = json.dumps(spec)
    words = _BertWords.for_tokenizer(reference, spec_json)
    assert words is not None
    lines = [*iter_lines([corpus_file]),
             "IL-2 (interleukin-2) & TNF-α; p<0.05 [CLS] x", "Tab\there", "naïve T-cells", "a  b\u00a0c",
             "BRCA1/2 mutations, e.g. c.68_69delAG!", "[SEP] is special", "#$%^*~`{}|\\", "x" * 150]
    lines = [line for line in lines if line]
    shortcut = [words.encode(line) for line in lines]
    assert sum(ids is not None for ids in shortcut) > len(lines) // 2, "most lines take the shortcut"
    assert [ids is None for ids in shortcut[-8:]] == [True, True, True, True, False, True, False, False], \
        "non-ASCII, a tab, an added token ([CLS], [SEP]) in the text: the tokenizer itself"
    expected = [e.ids for e in reference.encode_batch(lines, add_special_tokens=False)]
    assert [ids for ids in shortcut if ids is not None] == [e for e, ids in zip(expected, shortcut, strict=True)
                                                            if ids is not None]
    encoder = _LineEncoder(spec_json, 102)
    assert encoder(lines).tolist() == [i for ids in expected for i in ids], "shortcut and fallback, in order"


def test_corpus_blocks_hold_the_tokens_the_tokenizer_gives_even_when_it_was_saved_to_pad(tmp_path):
    from biodistil.data.corpus import _LineEncoder
    from biodistil.embedded import resolve_model_name
    from biodistil.models.loading import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_name("minilm-l6"))  # its tokenizer.json pads and cuts to 128
    assert tokenizer.backend_tokenizer.padding is not None
    lines = ["Immunostaining and confocal analysis", "", "IL-2 (interleukin-2) & TNF-α; p<0.05", "word " * 200]
    expected = tokenizer([line for line in lines if line], add_special_tokens=False)["input_ids"]
    encoded = _LineEncoder(tokenizer.backend_tokenizer.to_str(), tokenizer.sep_token_id)(lines).tolist()
    assert encoded == [*expected[0], tokenizer.sep_token_id, *expected[1], *expected[2]]
    assert len(expected[2]) == 200 and 0 not in encoded, "no padding, no cut"
