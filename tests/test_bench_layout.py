"""`bench/` holds the benchmarks users run, each imported and run by a test at tiny shapes so that it cannot rot;
the scripts behind single findings live in `bench/research/`, each described in its README."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_bench_script_is_imported_by_a_test():
    tests = [path.read_text(encoding="utf-8") for path in (REPO / "tests").glob("test_*.py")
             if path.name != Path(__file__).name]
    for script in sorted((REPO / "bench").glob("*.py")):
        run = [text for text in tests if f"bench/{script.name}" in text
               and re.search(rf"^\s*import {script.stem}\b|bench_script\(\"{script.stem}\"\)", text, re.MULTILINE)]
        assert run, f"bench/{script.name}: no test imports and runs it; add one or move it to bench/research/"


def test_every_research_script_is_described_in_its_readme():
    readme = (REPO / "bench" / "research" / "README.md").read_text(encoding="utf-8")
    described = set(re.findall(r"^\| `(\w+\.py)` \|", readme, re.MULTILINE))
    assert described == {script.name for script in (REPO / "bench" / "research").glob("*.py")}
