"""Shared fixtures: a small synthetic corpus, a tokenizer trained on it, a tiny teacher, and (task side) a tiny pair
task with a teacher fine-tuned on it and a student, all offline. Helper functions live in `kd_fixtures` and
`numerics`."""

import os
from pathlib import Path

# Before torch loads OpenMP: threads that wait for work sleep instead of spinning. The suite runs two workers (pytest-
# xdist) on two cores, and at OMP_NUM_THREADS=2 spinning threads of one worker took the cores the other needed (a 3×
# slower pass). Subprocesses of the tests inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n`, `--dist loadgroup`, set in pyproject.toml): the tests of a module that share a module
    fixture run on one worker (`xdist_group`: the fixture is built once), and the slow tests are handed out first so
    that no long test starts last while the other worker idles."""
    for item in items:
        if any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per usable core, at most 2 (each worker builds the session's fixtures and holds about
    1.5 GB; the suite is sized for two)."""
    return max(1, min(2, len(os.sched_getaffinity(0))))
