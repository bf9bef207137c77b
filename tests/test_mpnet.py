"""The MPNet family (issue 33): a tiny random MPNet masked LM distils into a student of its layers with MLM, logit,
hidden-state, Q/K/V-relation and attention-map terms, its attention recomputed from hooked Q/K plus the relative-
position bias equals the model's own, and its student fine-tunes on a token task."""

import json
from pathlib import Path

import pytest
import torch
from kd_fixtures import save_mpnet, write_token_task
from recipe_fixtures import RECIPES
from transformers import AutoModelForMaskedLM, MPNetConfig

from biodistil.cli.main import main
from biodistil.config import DistillRecipe, validate_recipe
from biodistil.methods.task_agnostic import run_distill
from biodistil.models.families import family_of


@pytest.fixture(scope="module")
def mpnet(tmp_path_factory, tokenizer):
    """A 4-layer, 32-wide MPNet masked LM with the fixtures' WordPiece tokenizer (random weights)."""
    torch.manual_seed(0)
    return save_mpnet(tokenizer, tmp_path_factory.mktemp("mpnet"), layers=4, positions=80)


def recipe(teacher, corpus_file, out, terms) -> DistillRecipe:
    return validate_recipe(DistillRecipe, {
        "run": {"output_dir": str(out), "seed": 1}, "teacher": {"name_or_path": str(teacher), "dtype": "float32"},
        "student": {"init": "teacher_layers", "layers": [0, 2]},
        "data": {"train": [str(corpus_file)], "block_size": 32, "eval_fraction": 0, "cache_dir": str(out.parent / "c")},
        "objective": {"terms": terms},
        "train": {"max_steps": 12, "batch_size": 8, "learning_rate": 3e-3, "warmup_steps": 0, "eval_every": 0,
                  "save_every": 0, "log_every": 4, "progress_bar": False, "tensorboard": False}})


def test_an_mpnet_teacher_distils_into_its_layers_and_the_student_fine_tunes(mpnet, corpus_file, tmp_path):
    assert not family_of(MPNetConfig()).takes_token_type_ids
    terms = [{"loss": "mlm"}, {"loss": "logit_kl", "positions": "masked"}, {"loss": "hidden_cosine"},
             {"loss": "minilm_relations", "student_layer": -1, "teacher_layer": -1}]
    model_dir = run_distill(recipe(mpnet, corpus_file, tmp_path / "distil", terms))
    student = AutoModelForMaskedLM.from_pretrained(model_dir)
    assert student.config.model_type == "mpnet" and student.config.num_hidden_layers == 2
    records = [json.loads(line) for line in (tmp_path / "distil" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert len(losses) == 3 and losses[-1] < losses[0], "the loss falls"
    task = write_token_task(tmp_path / "task", sizes={"train": 24, "dev": 8, "test": 8})
    assert main(["finetune", str(RECIPES / "finetune-bioasq.yaml"), f"model.name_or_path={model_dir}",
                 f"task.name={task}", "finetune.epochs=2", "train.progress_bar=false", "train.tensorboard=false",
                 "train.batch_size=8", "--out", str(tmp_path / "ner")]) == 0
    metrics = json.loads((tmp_path / "ner" / "metrics.json").read_text())
    assert "f1" in metrics["test"] and metrics["train"]["steps"] > 0
    assert (tmp_path / "ner" / "model" / "config.json").is_file()


def test_recomputed_attention_equals_mpnets_own_with_its_relative_position_bias(mpnet):
    """The hooked Q/K and the relative-position bias the encoder computes give MPNet's own attention probabilities
    (eager, eval mode) at every layer, padding included; without the bias they would not."""
    assert_recomputed_attention_is_own(mpnet, atol=1e-5)


def test_the_fetched_mpnet_base_has_its_attention_recomputed_as_its_own(fetched_model):
    """The same on the real 12 × 768 encoder (skipped unless `mpnet-base` is fetched and given: --fetched-models)."""
    assert_recomputed_attention_is_own(fetched_model("mpnet-base"), atol=1e-4)


def assert_recomputed_attention_is_own(folder: Path, atol: float) -> None:
    from biodistil.models.features import FeatureRequest, extract_features
    from biodistil.models.loading import load_masked_lm

    model = load_masked_lm(str(folder), "float32").eval()
    layers = model.config.num_hidden_layers
    ids = torch.randint(5, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        features = extract_features(model, batch, FeatureRequest(attentions=set(range(1, layers + 1))), None)
        own = model.mpnet(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for layer in range(1, layers + 1):
        assert torch.allclose(features.attention_at(layer)[0], own[layer - 1][0], atol=atol), layer
        assert torch.allclose(features.attention_at(layer)[1, :, :30, :30], own[layer - 1][1, :, :30, :30],
                              atol=atol), layer
    assert model.mpnet.encoder.relative_attention_bias.weight.abs().max() > 0.01, "the bias is not zero"


def test_attention_map_terms_distil_an_mpnet_teacher(mpnet, corpus_file, tmp_path):
    model_dir = run_distill(recipe(mpnet, corpus_file, tmp_path / "attention",
                                   [{"loss": "attention_kl", "layer_map": "uniform"},
                                    {"loss": "attention_mse", "student_layer": -1, "teacher_layer": -1,
                                     "attention_map": "scores"}]))
    records = [json.loads(line) for line in (tmp_path / "attention" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert (Path(model_dir) / "config.json").is_file() and losses[-1] < losses[0]


def test_mpnet_like_roberta_takes_two_tokens_fewer_than_its_position_table(mpnet):
    """MPNet numbers positions after the padding index, as RoBERTa: a table of 80 positions takes inputs of 78 tokens
    (79 raised IndexError in the model); `position_limit` caps tasks, exports, benches and predict at that."""
    from transformers import BertConfig, PretrainedConfig, RobertaConfig

    from biodistil.models.families import position_limit
    from biodistil.tasks.encoding import fit_length_to_model
    from biodistil.tasks.registry import get_task

    model = AutoModelForMaskedLM.from_pretrained(mpnet).eval()
    assert position_limit(model.config) == 78
    with torch.inference_mode():
        model(input_ids=torch.full((1, 78), 7))
        with pytest.raises(IndexError):
            model(input_ids=torch.full((1, 79), 7))
    assert fit_length_to_model(get_task("ncbi_disease").model_copy(update={"max_length": 128}), mpnet).max_length == 78
    assert position_limit(RobertaConfig(max_position_embeddings=514)) == 512
    assert position_limit(BertConfig(max_position_embeddings=512)) == 512
    assert position_limit(PretrainedConfig(), default=64) == 64  # no table recorded
