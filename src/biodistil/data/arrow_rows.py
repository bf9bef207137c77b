"""The rows of an Arrow table, read as a map-style dataset: what the corpus caches need of `datasets.Dataset`.

The token-block and text-block caches (`corpus.py`, `text_blocks.py`) are Arrow stream files, memory-mapped when
read: `ArrowRows.from_file` maps one the way `datasets.Dataset.from_file` does (`pyarrow.ipc.open_stream` over
`pyarrow.memory_map`: the rows stay in the page cache, not in the process), and gives its length, one row as a dict
of Python values, and a range of its rows — without importing `datasets` (and pandas with it: about 86 MB resident
before a distillation's first step, issue 52). Pickled (a loader worker started by spawn), a mapped table travels as
its path and is mapped again there.
"""

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any, overload

import pyarrow as pa


class ArrowRows:
    """Rows `rows` (default: all) of an Arrow table, each read as {column: Python value}."""

    def __init__(self, table: pa.Table, rows: Sequence[int] | None = None, path: Path | None = None):
        self._table = table
        self._rows = range(table.num_rows) if rows is None else rows
        self._path = path
        lengths = [len(chunk) for chunk in table.column(0).chunks] if table.num_columns else []
        self._starts = [0, *accumulate(lengths)][:-1]

    @classmethod
    def from_file(cls, path: str | Path) -> "ArrowRows":
        """A memory-mapped Arrow stream file (a `pyarrow.ipc.new_stream` writer's)."""
        return cls(pa.ipc.open_stream(pa.memory_map(str(path))).read_all(), path=Path(path))

    @classmethod
    def from_pylist(cls, rows: list[dict[str, Any]]) -> "ArrowRows":
        return cls(pa.Table.from_pylist(rows))

    @property
    def column_names(self) -> list[str]:
        return list(self._table.column_names)

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: str) -> list[Any]: ...

    def __getitem__(self, index: int | str) -> dict[str, Any] | list[Any]:
        """Row `index` as {column: value}, or column `index` as the list of its values over these rows."""
        if isinstance(index, str):
            return self._table.column(index).take(pa.array(self._rows, pa.int64())).to_pylist()
        position = self._rows[index]  # an IndexError beyond the rows, as a list's
        chunk = bisect_right(self._starts, position) - 1
        offset = position - self._starts[chunk]
        return {name: self._table.column(name).chunk(chunk)[offset].as_py() for name in self._table.column_names}

    def select(self, rows: Sequence[int]) -> "ArrowRows":
        """The rows at positions `rows` of these rows (a view: nothing is copied; a range stays a range)."""
        ends = (rows[0], rows[-1]) if isinstance(rows, range) and len(rows) else rows
        if len(rows) and (min(ends) < 0 or max(ends) >= len(self)):
            raise IndexError(f"rows {rows} are not all among the {len(self)} rows")
        if isinstance(rows, range) and isinstance(self._rows, range):
            return ArrowRows(self._table, self._rows[rows.start:rows.stop:rows.step], self._path)
        return ArrowRows(self._table, [self._rows[row] for row in rows], self._path)

    def __getstate__(self) -> dict[str, Any]:
        table = None if self._path is not None else self._table  # a mapped file travels as its path
        return {"table": table, "rows": self._rows, "path": self._path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        table = state["table"] if state["path"] is None else ArrowRows.from_file(state["path"])._table
        self.__init__(table, state["rows"], state["path"])
