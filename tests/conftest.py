"""Shared fixtures: a small synthetic corpus, a tokenizer trained on it, a tiny teacher, and (task side) a tiny pair
task with a teacher fine-tuned on it and a student, all offline. Helper functions live in `kd_fixtures` and
`numerics`."""

import os
import random
import shutil
import tempfile
from collections import Counter
from pathlib import Path

# Every cache the project or its libraries read points into one empty folder of this test session (made by the first
# process that reads this file; pytest-xdist's workers and the tests' subprocesses inherit it): a model fetched, a
# corpus cached or a hub download left on the developer's machine can make no test pass. A test that needs a fetched
# model is skipped unless --fetched-models names where one is (see `fetched_model`).
CACHE_VARIABLES = ("BIODISTIL_CACHE", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "XDG_CACHE_HOME", "TORCH_HOME",
                   "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "MPLCONFIGDIR")
if "BIODISTIL_TEST_HOME" not in os.environ:
    os.environ["BIODISTIL_TEST_HOME"] = tempfile.mkdtemp(prefix="biodistil-tests-")
    for variable in CACHE_VARIABLES:
        os.environ[variable] = os.path.join(os.environ["BIODISTIL_TEST_HOME"], variable.lower())
TEST_HOME = Path(os.environ["BIODISTIL_TEST_HOME"])

# Before torch loads OpenMP: threads that wait for work sleep instead of spinning. The suite runs two workers (pytest-
# xdist) on two cores, and at OMP_NUM_THREADS=2 spinning threads of one worker took the cores the other needed (a 3×
# slower pass). Subprocesses of the tests inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402  (after the environment above: torch reads it when it loads)
import torch  # noqa: E402

# biodistil and transformers are imported by the fixtures that use them: pytest-xdist's controller process loads this
# file too, runs no test, and need not spend seconds importing transformers' models


def torch_threads() -> int:
    """OMP_NUM_THREADS when it is set (.ci/run runs the suite at 1 and at 2 threads), else 1.

    Tiny models are dominated by per-operation overhead, which extra threads only add to (and on a busy
    2-core machine thread hand-offs make them many times slower), hence 1 by default. No test may depend
    on the thread count: results of different kernels are compared with tolerances, never bit for bit.
    """
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else 1


torch.set_num_threads(torch_threads())
# the suite's threads are fixed: training stages keep them (no 1-second sample of other work per stage, no re-checks);
# tests of the thread governor remove it for themselves
os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads()))

WORDS = [
    "the", "protein", "kinase", "gene", "expression", "cell", "tumour", "patients", "mutation", "receptor",
    "binding", "inhibitor", "disease", "cancer", "mice", "induced", "levels", "increased", "decreased",
    "activation", "pathway", "signalling", "transcription", "factor", "apoptosis", "therapy", "clinical",
    "trial", "dose", "response", "antibody", "antigen", "immune", "infection", "virus", "bacterial",
    "resistance", "cytokine", "interleukin", "tnf", "p53", "brca1", "egfr", "insulin", "glucose", "liver",
    "renal", "cardiac",
]


def synthetic_corpus(lines: int = 400, seed: int = 0) -> str:
    """Sentences of biomedical-looking words, a blank line between documents of 5 sentences."""
    from biodistil.data.synthetic import synthetic_corpus as corpus_of

    return corpus_of(WORDS, lines, seed)


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(synthetic_corpus(), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer(corpus_file):
    from biodistil.data.vocab import train_wordpiece

    return train_wordpiece(corpus_file.read_text().splitlines(), vocab_size=200, min_frequency=1)


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory, tokenizer) -> Path:
    """A 4-layer, 32-wide BERT teacher (random weights) saved as a Hugging Face folder."""
    from biodistil.config import ArchitectureConfig
    from biodistil.models.student import model_from_architecture

    torch.manual_seed(0)
    arch = ArchitectureConfig(num_layers=4, hidden_size=32, num_heads=2, intermediate_size=64,
                              max_position_embeddings=64, dropout=0.1)
    model = model_from_architecture(arch, tokenizer)
    folder = tmp_path_factory.mktemp("teacher")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture()
def teacher(teacher_dir):
    from transformers import AutoModelForMaskedLM

    return AutoModelForMaskedLM.from_pretrained(teacher_dir)


@pytest.fixture(scope="session")
def pair_task(tmp_path_factory):
    """A tiny yes/no question + passage task (kd_fixtures.write_pair_task)."""
    from kd_fixtures import write_pair_task

    from biodistil.tasks.registry import get_task

    return get_task(str(write_pair_task(tmp_path_factory.mktemp("tiny_qa"))))


@pytest.fixture(scope="session")
def kd_models(tmp_path_factory, teacher_dir, tokenizer, pair_task):
    """(teacher fine-tuned on pair_task (random head), 2-layer student) model folders."""
    from kd_fixtures import save_student, save_teacher

    root = tmp_path_factory.mktemp("kd_models")
    return save_teacher(teacher_dir, pair_task, root / "teacher"), save_student(tokenizer, root / "student")


@pytest.fixture()
def fresh_accelerator_state():
    """Accelerate keeps one process-wide state whose mixed precision cannot change: a test that trains under another
    precision than the rest of the session starts and leaves it empty."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture()
def bench_script(fresh_accelerator_state):
    """`bench_script("gpu_check")`: a script of bench/ (or bench/research/) imported as a module; the worker's torch
    threads (a bench sets its own) restored after the test. Only the two folders are taken off sys.path afterwards:
    pytest's monkeypatch would restore the whole list, dropping what an import made during the test added to it (ONNX
    Runtime's transformer optimizer adds its own folder on first import and then imports from it), and the next
    fused export in the worker would fail."""
    import importlib
    import sys

    folders = [str(Path(__file__).resolve().parents[1] / "bench" / sub) for sub in ("", "research")]
    sys.path[:0] = folders
    threads = torch.get_num_threads()
    yield importlib.import_module
    torch.set_num_threads(threads)
    for folder in folders:
        sys.path.remove(folder)


def pytest_addoption(parser):
    parser.addoption("--fetched-models", metavar="DIR", default=None,
                     help="a folder of fetched models (e.g. ~/.cache/biodistil/models, filled by `biodistil models "
                     "fetch NAME`) for the tests that need one; without it they are skipped")
    parser.addoption("--mixed-threads", action="store_true",
                     help="run each test that computes in its own process (not `slow`, not `pinned_threads`) at 1 or "
                     "2 torch threads, drawn per test from the random-order seed (.ci/run: one pass checks both "
                     "counts; the same seed draws the same counts)")


def drawn_threads(item: pytest.Item) -> int:
    """The torch threads of a test under --mixed-threads: 1 for the slow and pinned ones (their work runs commands
    and processes at 1 thread), else 1 or 2, drawn from the random-order seed and the test's id."""
    if item.get_closest_marker("slow") or item.get_closest_marker("pinned_threads"):
        return 1
    seed = item.config.getoption("randomly_seed", default=None)
    return 1 + random.Random(f"{seed}:{item.nodeid}").randrange(2)


@pytest.fixture(autouse=True)
def _mixed_threads(request):
    if not request.config.getoption("mixed_threads"):
        yield
        return
    threads, before = drawn_threads(request.node), (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))
    request.node.user_properties.append(("torch_threads", threads))  # reaches the controller's summary
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the test's own commands and subprocesses read it
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        os.environ["OMP_NUM_THREADS"] = before[1] or str(before[0])


def pytest_configure(config):
    config.pluginmanager.register(SlowFirst(), "slow-first")
    fetched = config.getoption("fetched_models")
    if fetched:  # linked into the session's own cache: the rest of it stays empty
        (TEST_HOME / "biodistil_cache").mkdir(parents=True, exist_ok=True)
        link = TEST_HOME / "biodistil_cache" / "models"
        if not link.exists():
            link.symlink_to(Path(fetched).expanduser().resolve(), target_is_directory=True)


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # the process that made the folder (pytest-xdist's controller, or -n 0)
        shutil.rmtree(TEST_HOME, ignore_errors=True)


@pytest.fixture()
def fetched_model():
    """`fetched_model("mpnet-base")`: the folder of a fetched model, or the test is skipped with the command that
    fetches it (the suite's cache starts empty; pass --fetched-models DIR to use the models fetched there)."""
    from biodistil.embedded import FETCHED, fetched_model_folder

    def folder(name: str) -> Path:
        if not (TEST_HOME / "biodistil_cache" / "models" / name / FETCHED[name].weights).is_file():
            pytest.skip(f"needs the fetched model {name}: biodistil models fetch {name}, then python -m pytest "
                        "--fetched-models ~/.cache/biodistil/models")
        return fetched_model_folder(FETCHED[name])

    return folder


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n`, `--dist loadgroup`, set in pyproject.toml): the tests of a module that share a module
    fixture run on one worker (`xdist_group`: the fixture is built once)."""
    for item in items:
        if any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


class SlowFirst:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        """The slow tests are handed out first, so that no long test starts last while the other worker idles. The
        sort is stable: the order pytest-randomly shuffled (before every other hook) holds within each part."""
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_terminal_summary(terminalreporter, config):
    seed = config.getoption("randomly_seed", default=None)
    mixed = " --mixed-threads" if config.getoption("mixed_threads") else ""
    if seed is not None and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(f"Tests ran in a random order (pytest-randomly); replay it with: python -m pytest "
                                    f"--randomly-seed={seed}{mixed}")
    if mixed:
        counts = Counter(dict(report.user_properties).get("torch_threads") for reports in
                         terminalreporter.stats.values() for report in reports
                         if getattr(report, "when", None) == "call")
        terminalreporter.write_line(f"Torch threads per test (--mixed-threads): {counts[1]} tests at 1, {counts[2]} "
                                    "at 2")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per usable core, at most 2 (each worker builds the session's fixtures and holds about
    1.5 GB; the suite is sized for two)."""
    return max(1, min(2, len(os.sched_getaffinity(0))))
