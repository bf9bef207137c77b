"""bench/research/carry_parts.py: a file larger than one device call carries, sent in pieces over several calls."""

import os

import pytest


def test_pieces_staged_call_by_call_join_to_the_same_files_and_a_damaged_one_is_refused(bench_script, tmp_path):
    carry = bench_script("carry_parts")
    sources = tmp_path / "wheels"
    sources.mkdir()
    files = {"a.whl": os.urandom(2_500_000), "b.whl": os.urandom(1_000_000)}
    for name, data in files.items():
        (sources / name).write_bytes(data)
    manifest = carry.split(sorted(sources.iterdir()), tmp_path / "parts", megabytes=1.0)
    assert [piece["name"] for piece in manifest["pieces"]] == ["a.whl.000", "a.whl.001", "a.whl.002", "b.whl.000"]
    keep, out = tmp_path / "there" / "kept", tmp_path / "there" / "joined"
    for call in (1, 2):  # two pieces a call: what one call carries is the manifest and its own pieces
        staged = carry.stage(tmp_path / "parts", call, tmp_path / ".carry", per_call=2)
        assert sorted(path.name for path in (tmp_path / ".carry").iterdir()) == sorted([carry.MANIFEST, *staged])
        missing = carry.receive(tmp_path / ".carry", keep)
        assert len(missing) == 2 * (2 - call)
        if call == 1:
            with pytest.raises(SystemExit, match="2 pieces have not come yet"):
                carry.join(keep, out)
    assert [path.read_bytes() for path in carry.join(keep, out)] == list(files.values())
    with pytest.raises(SystemExit, match="no pieces left"):
        carry.stage(tmp_path / "parts", 3, tmp_path / ".carry", per_call=2)
    (keep / "a.whl.001").write_bytes(b"x" * 1_000_000)  # damaged after it was checked
    with pytest.raises(SystemExit, match="a piece is damaged"):
        carry.join(keep, tmp_path / "again")
    assert not list((tmp_path / "again").iterdir()), "nothing half-joined is left"
    carry.stage(tmp_path / "parts", 1, tmp_path / ".carry", per_call=2)
    (tmp_path / ".carry" / "a.whl.000").write_bytes(b"y")  # damaged in transit
    with pytest.raises(SystemExit, match="damaged in transit"):
        carry.receive(tmp_path / ".carry", tmp_path / "other")
