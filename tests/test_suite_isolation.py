"""A fresh machine passes (issue 51): no test reads a cache that the machine happens to hold. tests/conftest.py points
every cache the project and its libraries read into an empty folder of the test session; these checks ask each library
where it would read, in this process and in a command the tests start."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import CACHE_VARIABLES, TEST_HOME


def inside_session(path: str | os.PathLike) -> bool:
    return Path(path).resolve().is_relative_to(TEST_HOME.resolve())


def test_every_cache_variable_points_into_the_sessions_own_folder():
    assert not inside_session(Path.home()) and TEST_HOME.is_dir()
    assert all(inside_session(os.environ[variable]) for variable in CACHE_VARIABLES)


def test_biodistil_and_the_hub_libraries_read_their_caches_there():
    import datasets
    import huggingface_hub.constants
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from biodistil.data.corpus import default_cache_dir
    from biodistil.embedded import cache_root

    places = {"biodistil": cache_root(), "corpora": default_cache_dir(),
              "hub": huggingface_hub.constants.HF_HUB_CACHE, "datasets": datasets.config.HF_DATASETS_CACHE,
              "inductor": cache_dir()}
    assert {name: where for name, where in places.items() if not inside_session(where)} == {}


def test_a_command_the_tests_start_inherits_them():
    code = "from biodistil.embedded import cache_root; print(cache_root())"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert inside_session(printed.strip())


def test_a_test_computes_at_the_torch_threads_drawn_for_it(request):
    """Under --mixed-threads (.ci/run) a test that computes in its own process runs at the 1 or 2 threads drawn for it
    from the seed, and its commands and subprocesses are told the same; otherwise at OMP_NUM_THREADS."""
    import torch
    from conftest import drawn_threads, torch_threads

    expected = drawn_threads(request.node) if request.config.getoption("mixed_threads") else torch_threads()
    assert torch.get_num_threads() == expected and os.environ["OMP_NUM_THREADS"] == str(expected)
