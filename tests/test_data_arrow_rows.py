"""`ArrowRows`: the rows of a memory-mapped Arrow stream (the corpus caches), read as `datasets.Dataset` read them."""

import pickle

import pyarrow as pa
import pytest

from biodistil.data.arrow_rows import ArrowRows


def write_stream(path, batches: list[list[list[int]]]) -> None:
    """An Arrow stream of `input_ids` lists, one record batch per item of `batches` (several chunks when read)."""
    schema = pa.schema([pa.field("input_ids", pa.list_(pa.int32()))])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(pa.record_batch([pa.array(batch, pa.list_(pa.int32()))], schema=schema))


def test_rows_across_record_batches_read_as_python_values(tmp_path):
    blocks = [[[1, 2, 3], [4]], [[5, 6]], [[7], [8, 9], [10]]]
    write_stream(tmp_path / "blocks.arrow", blocks)
    rows = ArrowRows.from_file(tmp_path / "blocks.arrow")
    flat = [row for batch in blocks for row in batch]
    assert len(rows) == 6 and rows.column_names == ["input_ids"]
    assert [rows[i] for i in range(6)] == [{"input_ids": ids} for ids in flat]
    assert rows[-1] == {"input_ids": [10]} and rows["input_ids"] == flat
    with pytest.raises(IndexError):
        rows[6]
    tail = rows.select(range(2, 6))
    assert len(tail) == 4 and tail[0] == {"input_ids": [5, 6]} and tail[-1] == {"input_ids": [10]}
    assert [r["input_ids"] for r in tail.select(range(1, 3))] == [[7], [8, 9]], "a range of a range"
    assert tail["input_ids"] == flat[2:]
    assert [r["input_ids"] for r in rows.select([5, 0, 2])] == [[10], [1, 2, 3], [5, 6]]
    assert len(rows.select(range(0))) == 0
    for bad in (range(3, 7), [0, -1], [6]):
        with pytest.raises(IndexError):
            rows.select(bad)


def test_a_mapped_file_pickles_as_its_path_and_a_built_table_as_itself(tmp_path):
    write_stream(tmp_path / "blocks.arrow", [[[1, 2], [3]] * 500])
    rows = ArrowRows.from_file(tmp_path / "blocks.arrow").select(range(990, 1000))
    sent = pickle.dumps(rows)
    assert len(sent) < 1000, "a loader worker maps the file again: the rows are not copied into it"
    again = pickle.loads(sent)
    assert [again[i] for i in range(10)] == [rows[i] for i in range(10)]
    built = ArrowRows.from_pylist([{"input_ids": [1, 2]}, {"input_ids": [3]}])
    assert pickle.loads(pickle.dumps(built))[1] == {"input_ids": [3]}


def test_a_distillation_imports_neither_datasets_pandas_nor_scikit_learn():
    """What `biodistil distill` and `pretrain` import holds no library they do not use (issue 52): `datasets` (with
    pandas, ~86 MB resident) is for transfer sets and Hub corpora — the corpus caches are read through `ArrowRows` —
    and scikit-learn (~150 MB) and seqeval's metrics, which the task registry's metrics import only when they score
    (seqeval's small tagging schemes come in with the document readers)."""
    import subprocess
    import sys

    code = ("import sys, biodistil.methods.task_agnostic, biodistil.data.text_blocks, biodistil.tasks.metrics; "
            "print(sorted({'datasets', 'pandas', 'sklearn', 'seqeval.metrics'} & {*sys.modules, "
            "*(n.split('.')[0] for n in sys.modules)}))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "[]"
