"""The engine end to end on a tiny teacher: loss falls, exact resume, export, run folder, CLI errors."""

import json
from pathlib import Path

import pytest
import torch
from distill_fixtures import distill_recipe
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM

from biodistil.cli.main import main
from biodistil.config import PretrainRecipe, validate_recipe
from biodistil.errors import BiodistilError
from biodistil.methods.task_agnostic import run_distill, run_pretrain

REPO = Path(__file__).resolve().parents[1]


def records(run: Path, split: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def test_distillation_lowers_loss_and_exports_a_clean_student(tmp_path, teacher_dir, corpus_file):
    out = tmp_path / "run"
    model_dir = run_distill(distill_recipe(teacher_dir, corpus_file, out, max_steps=30))
    train = records(out, "train")
    assert train[-1]["loss"] < train[0]["loss"], "loss falls over 30 steps"
    assert records(out, "eval"), "held-out evaluation ran"
    for name in ("config.yaml", "metrics.jsonl", "report.md", "summary.json"):
        assert (out / name).is_file(), name
    student = AutoModelForMaskedLM.from_pretrained(model_dir)
    assert student.config.hidden_size == 16
    weights = load_file(str(model_dir / "model.safetensors"))
    assert not [k for k in weights if "projection" in k], "the projection is not exported"
    checkpoint = sorted((out / "checkpoints").iterdir())[-1]
    assert any("projections" in k for k in load_file(str(checkpoint / "trainable.safetensors")))


def test_resume_equals_uninterrupted_run(tmp_path, teacher_dir, corpus_file):
    full = run_distill(distill_recipe(teacher_dir, corpus_file, tmp_path / "full"))
    cut = distill_recipe(teacher_dir, corpus_file, tmp_path / "cut")
    run_distill(cut, stop_after=10)
    assert not (tmp_path / "cut" / "model").exists(), "a stopped run does not export"
    checkpoint = json.loads((sorted((tmp_path / "cut" / "checkpoints").iterdir())[-1] / "trainer_state.json")
                            .read_text())["state"]
    assert checkpoint["step"] == 10 and checkpoint["train_seconds"] > 0
    resumed = run_distill(cut, resume=True)
    result = json.loads((tmp_path / "cut" / "summary.json").read_text())["result"]
    assert result["earlier_seconds"] == checkpoint["train_seconds"], "the time before the checkpoint is counted"
    assert f"{result['earlier_seconds']:.1f} s of it before the resumed checkpoint" in (
        tmp_path / "cut" / "report.md").read_text()
    a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert [r["loss"] for r in records(tmp_path / "full", "train")] == [
        r["loss"] for r in records(tmp_path / "cut", "train")]


def test_run_folder_refuses_a_finished_run_and_restarts_a_failed_one(tmp_path, teacher_dir, corpus_file):
    recipe = distill_recipe(teacher_dir, corpus_file, tmp_path / "run", max_steps=2)
    run_distill(recipe)
    with pytest.raises(BiodistilError, match="already holds a finished run"):
        run_distill(recipe)
    fresh = distill_recipe(teacher_dir, corpus_file, tmp_path / "other", max_steps=2)
    assert (run_distill(fresh, resume=True) / "model.safetensors").is_file(), "--resume with nothing to resume starts"


def test_resume_refuses_changed_training_settings(tmp_path, teacher_dir, corpus_file):
    # begun with the loader workers set, as every run before `train.num_workers: auto` recorded them: 0
    run_distill(distill_recipe(teacher_dir, corpus_file, tmp_path / "run", num_workers=0), stop_after=10)
    with pytest.raises(BiodistilError, match="interrupted at step 10; continue it with --resume"):
        run_distill(distill_recipe(teacher_dir, corpus_file, tmp_path / "run"))
    changed = distill_recipe(teacher_dir, corpus_file, tmp_path / "run", learning_rate=1e-3, batch_size=4)
    with pytest.raises(BiodistilError, match="differs") as err:
        run_distill(changed, resume=True)
    assert "train.batch_size: 8 -> 4" in str(err.value) and "train.learning_rate: 0.003 -> 0.001" in str(err.value)
    assert "train.num_workers: 0 -> auto" not in str(err.value), "the loader's workers do not change the run"
    bookkeeping = distill_recipe(teacher_dir, corpus_file, tmp_path / "run", log_every=2, save_every=5)
    assert bookkeeping.train.num_workers == "auto"
    assert (run_distill(bookkeeping, resume=True) / "model.safetensors").is_file()


def test_rerunning_a_failed_command_works(tmp_path, capsys, teacher_dir, corpus_file):
    """A run that failed before its first checkpoint leaves config.yaml; the same command then starts it again."""
    corpus = tmp_path / "later.txt"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"teacher: {{name_or_path: {teacher_dir}}}\nstudent: {{init: teacher_layers, layers: [0, 9]}}\n"
        f"data: {{train: [{corpus}], block_size: 32, cache_dir: {tmp_path / 'cache'}}}\n"
        "objective: {terms: [{loss: mlm}]}\n"
        "train: {max_steps: 2, batch_size: 4, tensorboard: false, progress_bar: false}\n")
    command = ["distill", str(recipe), "--out", str(tmp_path / "run")]
    assert main(command) == 2
    assert "layer" in capsys.readouterr().err
    assert (tmp_path / "run" / "config.yaml").is_file()
    recipe.write_text(recipe.read_text().replace("[0, 9]", "[0, 3]"))
    assert main(command) == 2, "the corpus is still missing"
    err = capsys.readouterr().err
    assert "later.txt' matches no file" in err and "--resume" not in err
    corpus.write_text(corpus_file.read_text())
    assert main(command) == 0
    assert "stopped before its first checkpoint; starting it again" in capsys.readouterr().err
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_pretrain_from_scratch_trains_a_vocabulary(tmp_path, corpus_file):
    recipe = validate_recipe(PretrainRecipe, {
        "run": {"output_dir": str(tmp_path / "pre")},
        "model": {"init": "scratch", "tokenizer": {"vocab_size": 150, "min_frequency": 1},
                  "architecture": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32,
                                   "max_position_embeddings": 64}},
        "data": {"train": [str(corpus_file)], "block_size": 32, "cache_dir": str(tmp_path / "cache")},
        "train": {"max_steps": 20, "batch_size": 8, "learning_rate": 5e-3, "warmup_steps": 0, "eval_every": 0,
                  "log_every": 5, "progress_bar": False, "tensorboard": False},
    })
    model_dir = run_pretrain(recipe)
    model = AutoModelForMaskedLM.from_pretrained(model_dir)
    assert model.config.vocab_size <= 150
    train = records(tmp_path / "pre", "train")
    assert train[-1]["loss"] < train[0]["loss"]


def test_cli_reports_recipe_and_corpus_errors_without_traceback(tmp_path, capsys, teacher_dir):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"teacher: {{name_or_path: {teacher_dir}}}\ndata: {{train: [{tmp_path}/absent.txt]}}\n"
        "objective: {terms: [{loss: mlm}]}\ntrain: {tensorboard: false}\n"
    )
    assert main(["distill", str(recipe), "train.max_step=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'train.max_step'" in err and "max_steps" in err
    assert main(["distill", str(recipe), f"--out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert "absent.txt' matches no file" in err and "Traceback" not in err


def test_continual_pretraining_starts_from_the_given_model(tmp_path, teacher_dir, corpus_file):
    recipe = validate_recipe(PretrainRecipe, {
        "run": {"output_dir": str(tmp_path / "cont")},
        "model": {"init": "continual", "name_or_path": str(teacher_dir)},
        "data": {"train": [str(corpus_file)], "block_size": 32, "cache_dir": str(tmp_path / "cache")},
        "train": {"max_steps": 3, "batch_size": 8, "learning_rate": 1e-12, "warmup_steps": 0, "eval_every": 0,
                  "progress_bar": False, "tensorboard": False},
    })
    adapted = AutoModelForMaskedLM.from_pretrained(run_pretrain(recipe))
    original = AutoModelForMaskedLM.from_pretrained(teacher_dir)
    assert adapted.config.num_hidden_layers == original.config.num_hidden_layers
    # a vanishing learning rate: the adapted weights are the original ones (loaded, not re-initialised)
    for (name, a), b in zip(adapted.state_dict().items(), original.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_offline_hub_dataset_is_a_clear_error(tmp_path, tokenizer, monkeypatch):
    import datasets

    from biodistil.config import CorpusConfig
    from biodistil.data.corpus import load_corpus_splits

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    cfg = CorpusConfig(hub_dataset="no-such-org/no-such-corpus", cache_dir=str(tmp_path))
    with pytest.raises(BiodistilError, match="Could not load Hub dataset 'no-such-org/no-such-corpus'"):
        load_corpus_splits(cfg, tokenizer)


def test_bf16_autocast_on_cpu_distils_into_an_fp32_student(tmp_path, teacher_dir, corpus_file,
                                                           fresh_accelerator_state):
    out = tmp_path / "bf16"
    model_dir = run_distill(distill_recipe(teacher_dir, corpus_file, out, max_steps=30, precision="bf16"))
    train = records(out, "train")
    assert train[-1]["loss"] < train[0]["loss"], "loss falls under bf16 autocast"
    assert all(r["grad_norm"] > 0 for r in train)
    student = AutoModelForMaskedLM.from_pretrained(model_dir, dtype=torch.float32)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in student.parameters())
    weights = load_file(str(model_dir / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.float32}, "the saved student is fp32"
