"""bf16 autocast on the CPU for every kind of training (distillation, task KD; fine-tuning: test_finetune), and one
process running stages under different precisions (a pipeline, a study)."""

import json
from types import SimpleNamespace

import pytest
import torch
from kd_fixtures import kd_recipe
from safetensors.torch import load_file

from biodistil.config import DistillRecipe, validate_recipe
from biodistil.kd.command import run_kd
from biodistil.methods.task_agnostic import run_distill
from biodistil.training.engine import make_accelerator


def _train_losses(run_dir) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["split"] == "train"]


def _distill_settings(tmp_path, teacher_dir, corpus_file, terms, **train) -> DistillRecipe:
    """A tiny distill run (the teacher's layers 0 and 2, blocks of 32) with `train` settings on top."""
    return validate_recipe(DistillRecipe, {
        "run": {"output_dir": str(tmp_path / "run"), "seed": 3},
        "teacher": {"name_or_path": str(teacher_dir), "dtype": "float32"},
        "student": {"init": "teacher_layers", "layers": [0, 2]},
        "data": {"train": [str(corpus_file)], "block_size": 32, "cache_dir": str(tmp_path / "corpus")},
        "objective": {"temperature": 2.0, "terms": terms},
        "train": {"max_steps": 12, "batch_size": 8, "learning_rate": 3e-3, "warmup_steps": 0, "eval_every": 0,
                  "save_every": 0, "log_every": 4, "progress_bar": False, "tensorboard": False, **train},
    })


def test_one_process_runs_stages_under_different_precisions():
    assert make_accelerator("no").mixed_precision == "no"
    assert make_accelerator("bf16").mixed_precision == "bf16", "a later stage may train under bf16"
    assert make_accelerator("no").mixed_precision == "no", "and the next one in float32 again"


def test_distillation_under_bf16_autocast_learns_and_exports_float32(tmp_path, teacher_dir, corpus_file,
                                                                     fresh_accelerator_state):
    terms = [{"loss": "mlm", "weight": 2.0}, {"loss": "logit_kl", "weight": 5.0, "positions": "all"},
             {"loss": "hidden_cosine"}]
    recipe = _distill_settings(tmp_path, teacher_dir, corpus_file, terms, max_steps=30, precision="bf16")
    model_dir = run_distill(recipe)
    losses = _train_losses(tmp_path / "run")
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], "the loss falls under bf16"
    assert {w.dtype for w in load_file(str(model_dir / "model.safetensors")).values()} == {torch.float32}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["result"]["compiled"].startswith("auto: nothing (the KL's rows are 200 columns wide"), \
        "the tests' vocabulary of 200 is too narrow for the compiled kernel"


def test_task_kd_under_bf16_autocast_learns(kd_models, pair_task, tmp_path, fresh_accelerator_state):
    teacher_path, student_path = kd_models
    task_file = pair_task.files["train"].replace("train.json", "tiny_qa.yaml")
    recipe = kd_recipe(task_file, teacher_path, student_path, tmp_path / "run",
                       kd={"epochs": 6}, train={"precision": "bf16", "learning_rate": 3e-3})
    run_kd(recipe)
    losses = _train_losses(tmp_path / "run")
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], "the loss falls under bf16"


@pytest.mark.slow
@pytest.mark.parametrize("compiler", [True, False], ids=["with-a-compiler", "without"])
def test_train_compile_trains_in_place_or_says_it_cannot(compiler, tmp_path, teacher_dir, corpus_file, monkeypatch,
                                                         capsys):
    from biodistil.training import compiling

    if not compiler:
        monkeypatch.setattr(compiling, "cpp_compiler", lambda: None)
    settings = _distill_settings(tmp_path, teacher_dir, corpus_file, [{"loss": "mlm"}, {"loss": "hidden_cosine"}],
                                 compile=True)
    model_dir = run_distill(settings)
    said = "the encoders of BertForMaskedLM, BertForMaskedLM" if compiler else "no C++ compiler found"
    assert said in capsys.readouterr().out
    assert f"| train.compile | true: {'the encoders' if compiler else 'nothing, no C++ compiler'}" in \
        (tmp_path / "run" / "report.md").read_text(), "the run's report says what was compiled"
    losses = _train_losses(tmp_path / "run")
    assert losses[-1] < losses[0]
    names = set(load_file(str(model_dir / "model.safetensors")))
    assert names and not any("_orig_mod" in name for name in names), "compiling in place keeps the weights' names"


def test_the_fused_kl_row_function_equals_the_eager_rows():
    from biodistil.losses.distillation import _kl_rows, _kl_rows_fused

    generator = torch.Generator().manual_seed(4)
    student, teacher = (torch.randn(3, 11, generator=generator) * 2 for _ in range(2))
    eager_grad = torch.empty(3, 11)
    eager = _kl_rows(student.clone(), teacher.clone(), 0.5, eager_grad)
    fused, fused_grad = _kl_rows_fused(student, teacher, 0.5)
    by_hand = sum(float((torch.softmax(t, -1) * (torch.log_softmax(t, -1) - torch.log_softmax(s, -1))).sum())
                  for s, t in zip(student, teacher, strict=True))
    assert fused.item() == pytest.approx(by_hand, rel=1e-5) and eager.item() == pytest.approx(by_hand, rel=1e-5)
    assert torch.allclose(fused_grad, 0.5 * (torch.softmax(student, -1) - torch.softmax(teacher, -1)), atol=1e-7)
    assert torch.allclose(fused_grad, eager_grad, atol=1e-7)


@pytest.mark.parametrize("compiler", [True, False], ids=["with-a-compiler", "without"])
def test_train_compile_auto_compiles_the_kl_row_kernel_where_it_can(compiler, monkeypatch):
    from biodistil.losses import distillation
    from biodistil.training import compiling

    if not compiler:
        monkeypatch.setattr(compiling, "cpp_compiler", lambda: None)
    elif compiling.cpp_compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    chosen = compiling.apply_compile("auto", torch.nn.Module(), torch.device("cpu"))
    assert chosen.note == ("auto: the vocabulary KL's row kernel (TorchInductor)" if compiler
                           else "auto: nothing, no C++ compiler found (install g++ or set CXX)")
    assert (chosen.kl_rows is not None) == compiler
    student = torch.randn(4, 9, requires_grad=True)
    teacher = torch.randn(4, 9)
    loss = distillation.soft_kl_loss(student, teacher, temperature=2.0, kernel=chosen.kl_rows)  # compiled, if any
    loss.backward()
    log_s, log_t = torch.log_softmax(student.detach() / 2, -1), torch.log_softmax(teacher / 2, -1)
    expected = 4 * (log_t.exp() * (log_t - log_s)).sum(-1).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(student.grad, 2 * (log_s.exp() - log_t.exp()) / 4, atol=1e-6)
    chosen = compiling.apply_compile(False, torch.nn.Module(), torch.device("cpu"))
    assert chosen.kl_rows is None and chosen.note == "false: nothing", "false turns it off again"


def test_train_compile_auto_leaves_a_task_kd_kl_over_a_few_classes_eager(monkeypatch):
    """Task KD's KL is over the task's classes (3 for NER): eager rows are as fast there and the compile costs ~11 s,
    so `auto` compiles nothing; a KL as wide as a vocabulary is still compiled; `true` compiles either."""
    from transformers import BertConfig, BertForTokenClassification

    from biodistil.kd.module import KDModule
    from biodistil.training import compiling

    monkeypatch.setattr(compiling, "cpp_compiler", lambda: "/usr/bin/g++")
    monkeypatch.setattr(compiling, "compiled_kl_rows", lambda: "kernel")
    student = BertForTokenClassification(BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1,
                                                    num_attention_heads=1, intermediate_size=8, num_labels=3))
    kd = KDModule.__new__(KDModule)  # the two attributes `apply_compile` reads, without a teacher or a task
    torch.nn.Module.__init__(kd)
    kd.student, kd.cfg = student, SimpleNamespace(soft_loss="hinton")
    assert kd.uses_kl_rows
    assert kd.kl_columns == 3
    chosen = compiling.apply_compile("auto", kd, torch.device("cpu"))
    assert chosen.kl_rows is None
    assert chosen.note == "auto: nothing (the KL's rows are 3 columns wide; the compiled kernel wins from 2,048)"
    wide = torch.nn.Module()
    wide.kl_columns = 30522
    assert compiling.apply_compile("auto", wide, torch.device("cpu")).kl_rows == "kernel"
    assert compiling.apply_compile(True, kd, torch.device("cpu")).kl_rows == "kernel"


@pytest.mark.parametrize(("vocab_size", "shared_vocab", "compiled"),
                         [(200, None, False), (30522, None, True), (30622, 30522, True), (30622, 1000, False)])
def test_train_compile_auto_compiles_a_distillation_kl_only_as_wide_as_a_vocabulary(vocab_size, shared_vocab,
                                                                                    compiled, monkeypatch):
    """A distillation's KL rows span the student's vocabulary (under VE-KD the teacher's, its prefix): a real one
    (30,522) is compiled under `auto`, a toy one of a few hundred (the tests') is left eager."""
    from transformers import BertConfig, BertForMaskedLM

    from biodistil.methods.masked_lm import MaskedLMModule
    from biodistil.training import compiling

    monkeypatch.setattr(compiling, "cpp_compiler", lambda: "/usr/bin/g++")
    monkeypatch.setattr(compiling, "compiled_kl_rows", lambda: "kernel")
    student = BertForMaskedLM(BertConfig(vocab_size=vocab_size, hidden_size=8, num_hidden_layers=1,
                                         num_attention_heads=1, intermediate_size=8))
    objective = SimpleNamespace(cfg=SimpleNamespace(terms=[SimpleNamespace(loss="mlm"),
                                                           SimpleNamespace(loss="logit_kl")]))
    module = MaskedLMModule(student, objective, teacher=None, shared_vocab=shared_vocab)
    assert module.uses_kl_rows and module.kl_columns == (shared_vocab or vocab_size)
    chosen = compiling.apply_compile("auto", module, torch.device("cpu"))
    assert (chosen.kl_rows == "kernel") == compiled
    if not compiled:
        assert chosen.note == (f"auto: nothing (the KL's rows are {module.kl_columns:,} columns wide; the compiled "
                               "kernel wins from 2,048)")
