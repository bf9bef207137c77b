"""The embedded pretrained model (hash check, short name) and encoder-only checkpoints as teachers and students."""

import hashlib
import json

import pytest
from kd_fixtures import write_pair_task
from safetensors.torch import load_file
from transformers import AutoModel, BertConfig, BertModel

from biodistil import embedded
from biodistil.config import DistillRecipe, validate_recipe
from biodistil.embedded import EMBEDDED, EmbeddedModel, embedded_model_folder, verify_weights
from biodistil.errors import BiodistilError
from biodistil.finetune.command import FinetuneRecipe, run_finetune
from biodistil.finetune.init_model import init_model_path
from biodistil.kd.command import run_kd
from biodistil.kd.recipe import KDRecipe
from biodistil.methods.task_agnostic import run_distill
from biodistil.models.loading import load_masked_lm, untrained_head_weights

TRAIN = {"batch_size": 4, "learning_rate": 1e-3, "save_every": 0, "eval_every": 0, "log_every": 1,
         "tensorboard": False, "progress_bar": False}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test verifies hashes afresh: the remembered-verification markers live in its own folder."""
    monkeypatch.setenv("BIODISTIL_CACHE", str(tmp_path / "cache"))
    embedded._verified.cache_clear()


# ------------------------------------------------------------------------------------------ hash check


def test_weights_with_the_published_hash_pass_and_are_remembered(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights" * 1000)
    verify_weights(weights, hashlib.sha256(weights.read_bytes()).hexdigest(), "tiny")
    assert list((tmp_path / "cache" / "verified").iterdir()), "a verified file is remembered"


def test_a_corrupted_copy_is_refused_with_both_hashes(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights" * 1000)
    good = hashlib.sha256(weights.read_bytes()).hexdigest()
    verify_weights(weights, good, "tiny")
    weights.write_bytes(b"weightz" * 1000)  # same size, new contents (and mtime): checked again
    with pytest.raises(BiodistilError, match=f"expected {good}.*corrupted"):
        verify_weights(weights, good, "tiny")


def test_a_missing_package_names_the_extra_to_install():
    entry = EmbeddedModel("ghost", "biodistil-no-such-distribution", "0.1.0", "x/model", "model.safetensors",
                          "0" * 64, "a model that is not installed")
    with pytest.raises(BiodistilError, match=r"not installed.*pip install -e \"\.\[models\]\""):
        embedded_model_folder(entry)


def test_the_installed_minilm_checks_out_and_a_wrong_hash_is_refused():
    entry = EMBEDDED["minilm-l6"]
    folder = embedded_model_folder(entry)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 6
    wrong = EmbeddedModel(**{**entry.__dict__, "sha256": "1" * 64})
    with pytest.raises(BiodistilError, match="expected 1111"):
        embedded_model_folder(wrong)


def test_the_short_name_works_where_a_model_path_is_accepted(tmp_path):
    recipe = validate_recipe(KDRecipe, {"teacher": {"name_or_path": "minilm-l6"},
                                        "student": {"name_or_path": "minilm-l6", "layers": [0, 2, 4]},
                                        "task": {"name": "ncbi_disease"}})
    assert recipe.teacher.name_or_path == str(embedded_model_folder(EMBEDDED["minilm-l6"]))
    local = tmp_path / "minilm-l6"
    local.mkdir()
    assert embedded.resolve_model_name(str(local)) == str(local), "a real folder is never shadowed"


# ------------------------------------------------------------------------------------------ the real model


def test_minilm_loads_as_a_masked_lm_with_its_untrained_head_listed_and_gives_a_layer_student(tmp_path):
    teacher = load_masked_lm("minilm-l6")
    assert teacher.config.num_hidden_layers == 6 and teacher.config.hidden_size == 384
    assert untrained_head_weights(teacher) and all(k.startswith("cls.") for k in untrained_head_weights(teacher))
    student_dir = init_model_path("minilm-l6", [0, 2, 4], tmp_path)
    student = AutoModel.from_pretrained(student_dir)
    assert student.config.num_hidden_layers == 3
    weights = load_file(f"{student_dir}/model.safetensors")
    source = load_file(str(embedded_model_folder(EMBEDDED["minilm-l6"]) / "model.safetensors"))
    assert not [k for k in weights if k.startswith("cls.")], "an encoder-only model stays encoder-only"
    assert (weights["encoder.layer.1.attention.self.query.weight"]
            == source["encoder.layer.2.attention.self.query.weight"]).all()


# ------------------------------------------------------------------------------------------ encoder-only teachers


@pytest.fixture(scope="module")
def encoder_only(tmp_path_factory, tokenizer):
    """A tiny BERT encoder saved without an MLM head (as sentence encoders and many clinical models are)."""
    folder = tmp_path_factory.mktemp("encoder_only")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def distill_recipe(teacher, corpus_file, out, terms) -> DistillRecipe:
    return validate_recipe(DistillRecipe, {
        "run": {"output_dir": str(out), "seed": 1}, "teacher": {"name_or_path": str(teacher)},
        "data": {"train": [str(corpus_file)], "block_size": 32, "eval_fraction": 0,
                 "cache_dir": str(out.parent / "corpus-cache")},
        "objective": {"terms": terms}, "train": {**TRAIN, "max_steps": 4}})


def test_an_encoder_only_teacher_drives_hidden_and_attention_distillation(encoder_only, corpus_file, tmp_path):
    terms = [{"loss": "hidden_cosine"}, {"loss": "attention_mse", "layer_map": "uniform"},
             {"loss": "minilm_relations", "num_relation_heads": 2}]
    model_dir = run_distill(distill_recipe(encoder_only, corpus_file, tmp_path / "run", terms))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["finished"] and summary["result"]["steps"] == 4
    assert AutoModel.from_pretrained(model_dir).config.num_hidden_layers == 2


@pytest.mark.parametrize("term", ["logit_kl", "soft_ce", "logit_mse"])
def test_a_logits_term_with_a_headless_teacher_fails_before_training(encoder_only, corpus_file, tmp_path, term):
    recipe = distill_recipe(encoder_only, corpus_file, tmp_path / "run", [{"loss": "mlm"}, {"loss": term}])
    with pytest.raises(BiodistilError, match=rf"\['{term}'\].*no trained MLM head.*cls\.predictions"):
        run_distill(recipe)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_encoder_only_model_is_fine_tuned_and_distilled_on_a_task(encoder_only, tmp_path):
    task_file = write_pair_task(tmp_path / "task")
    finetune = validate_recipe(FinetuneRecipe, {
        "run": {"output_dir": str(tmp_path / "teacher")}, "model": {"name_or_path": str(encoder_only)},
        "task": {"name": str(task_file)}, "finetune": {"epochs": 1}, "train": TRAIN})
    teacher = run_finetune(finetune)
    kd = validate_recipe(KDRecipe, {
        "run": {"output_dir": str(tmp_path / "kd")}, "teacher": {"name_or_path": str(teacher)},
        "student": {"name_or_path": str(encoder_only), "layers": [0, 2]}, "task": {"name": str(task_file)},
        "kd": {"epochs": 1, "cache_dir": str(tmp_path / "cache")}, "train": TRAIN})
    student = run_kd(kd)
    metrics = json.loads((tmp_path / "kd" / "metrics.json").read_text())
    assert metrics["finished"] and set(metrics["test"]) >= {"accuracy", "auroc"}
    assert AutoModel.from_pretrained(student).config.num_hidden_layers == 2
    assert (tmp_path / "kd" / "init_model" / "config.json").is_file()
