"""`biodistil export` (ONNX fp32 and int8) of tiny random models: parity with PyTorch at lengths and batch sizes
other than the traced ones, int8 drift within a loose bound, scoring exports on a slice of NCBI-disease with the
fine-tuning metric code (skipped without the data folder), ONNX rows in `bench`, and clear errors."""

import json
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from recipe_fixtures import data_root, needs_data
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    PreTrainedTokenizerFast,
)

from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.evaluation.bench import run_bench
from biodistil.evaluation.recipe import BenchConfig
from biodistil.export.command import ExportOptions, check_int8_drop, run_export
from biodistil.export.deployed import expand_models
from biodistil.export.onnx import TRACE_LENGTH, head_of, load_model_folder
from biodistil.export.runtime import OnnxModel, require_onnx

needs_onnx = pytest.mark.skipif(not all(find_spec(n) for n in ("onnx", "onnxruntime", "onnxscript")),
                                reason="the optional extra 'export' is not installed")



def tiny_config(tokenizer, **extra) -> BertConfig:
    return BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id, **extra)


def save(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory, tokenizer) -> Path:
    torch.manual_seed(0)
    labels = {0: "O", 1: "B", 2: "I"}
    config = tiny_config(tokenizer, id2label=labels, label2id={v: k for k, v in labels.items()})
    return save(BertForTokenClassification(config), tokenizer, tmp_path_factory.mktemp("token") / "model")


@pytest.fixture(scope="module")
def token_export(token_dir) -> tuple[Path, dict]:
    """fp32 and int8 graphs, scored side by side on 12 NCBI-disease test sentences when the data is here."""
    out = token_dir.parent / "onnx"
    task = {"task": "ncbi_disease", "max_examples": 12, "max_int8_drop": 0.5} if data_root() else {}
    return out, run_export(token_dir, out, ExportOptions(int8=True, **task))


@pytest.fixture(scope="module")
def sequence_dir(tmp_path_factory, tokenizer) -> Path:
    """A GAD-shaped classifier whose tokenizer gives token_type_ids (as BERT's do), so the graph takes them."""
    torch.manual_seed(1)
    config = tiny_config(tokenizer, id2label={0: "0", 1: "1"}, label2id={"0": 0, "1": 1})
    segments = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, **tokenizer.special_tokens_map,
                                       model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    return save(BertForSequenceClassification(config), segments, tmp_path_factory.mktemp("sequence") / "model")


def close_at(folder: Path, source: Path, batch: int, length: int, variant: str = "fp32") -> float:
    """Largest |ONNX − PyTorch| logit difference on random ids of a shape neither traced nor checked."""
    loaded = load_model_folder(source)
    ids = torch.randint(5, len(loaded.tokenizer), (batch, length), generator=torch.Generator().manual_seed(3))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    inputs["attention_mask"][0, length // 3:] = 0
    with torch.inference_mode():
        want = loaded.model(**inputs).logits
    got = OnnxModel.from_export(folder, variant)(**inputs).logits
    return float((want - got).abs().max())


# ------------------------------------------------------------------------------------------ export


@needs_onnx
def test_token_classifier_fp32_matches_pytorch_and_int8_stays_close(token_dir, token_export):
    out, description = token_export
    assert sorted(p.name for p in out.glob("*.onnx")) == ["model.int8.onnx", "model.onnx"]
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "export.json").read_text()) == description
    assert description["head"] == "token_classification" and description["labels"] == ["O", "B", "I"]
    assert description["opset"] >= 18 and description["attention"] == "sdpa"
    assert [i["name"] for i in description["inputs"]] == ["input_ids", "attention_mask"]
    assert description["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", 3]}]
    checks = description["checks"]
    assert checks["lengths"] == [9, 64] and TRACE_LENGTH not in checks["lengths"]
    assert checks["fp32"]["max_abs_diff"] < 1e-5 and checks["fp32"]["min_agreement"] == 1.0
    assert 0 < checks["int8"]["max_abs_diff"] < 0.5 and checks["int8"]["min_agreement"] >= 0.9
    assert description["bytes"]["int8"] < description["bytes"]["fp32"]
    # dynamic axes: a batch and a length that neither the trace (2 × 17) nor the checks used
    assert close_at(out, token_dir, batch=3, length=41) < 1e-5
    assert close_at(out, token_dir, batch=3, length=41, variant="int8") < 0.5


@needs_onnx
def test_sequence_classifier_with_segments(sequence_dir):
    out = sequence_dir.parent / "onnx"
    description = run_export(sequence_dir, out, ExportOptions())
    assert [i["name"] for i in description["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert description["outputs"][0]["shape"] == ["batch", 2] and "int8" not in description["files"]
    assert description["checks"]["fp32"]["max_abs_diff"] < 1e-5
    assert close_at(out, sequence_dir, batch=1, length=50) < 1e-5


@needs_onnx
def test_masked_lm_export(teacher_dir, tmp_path):
    description = run_export(teacher_dir, tmp_path / "onnx", ExportOptions())
    assert description["head"] == "masked_lm" and description["labels"] is None
    assert description["outputs"][0]["shape"][:2] == ["batch", "sequence"]
    assert description["checks"]["fp32"]["max_abs_diff"] < 1e-4


def test_heads_from_the_saved_architecture(tokenizer):
    config = tiny_config(tokenizer, architectures=["BertForSequenceClassification"])
    assert head_of(config, "m") == "sequence_classification"
    config.problem_type = "multi_label_classification"
    assert head_of(config, "m") == "multilabel_classification"
    config.architectures = ["RobertaForMaskedLM"]
    assert head_of(config, "m") == "masked_lm"


# ------------------------------------------------------------------------------------------ errors


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(BiodistilError, match=r"optional extra 'export' \(onnxruntime not installed\).*\.\[export\]"):
        require_onnx()


@needs_onnx
def test_bad_inputs_are_clear_errors(tmp_path, tokenizer, token_dir, capsys):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(BiodistilError, match="is not a folder"):
        run_export(tmp_path / "file.txt", tmp_path / "out", ExportOptions())
    (tmp_path / "empty").mkdir()
    with pytest.raises(BiodistilError, match=r"has no config\.json"):
        run_export(tmp_path / "empty", tmp_path / "out", ExportOptions())
    bare = save(BertModel(tiny_config(tokenizer)), tokenizer, tmp_path / "bare")
    with pytest.raises(BiodistilError, match=r"cannot export architecture \['BertModel'\]; supported heads"):
        run_export(bare, tmp_path / "out", ExportOptions())
    with pytest.raises(BiodistilError, match="would replace the model folder"):
        run_export(token_dir, token_dir, ExportOptions())
    with pytest.raises(BiodistilError, match="exists and is not an ONNX export"):
        run_export(token_dir, tmp_path / "bare", ExportOptions())
    assert main(["export", str(token_dir), "--out", str(tmp_path / "o"), "--max-int8-drop", "0.01"]) == 2
    assert "--max-int8-drop needs --int8 and --task" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


@needs_onnx
@needs_data
def test_task_and_label_mismatches(token_export, sequence_dir, teacher_dir):
    from biodistil.evaluation.finetuned import ScoringPlan, run_scoring

    out = token_export[0].parent / "mismatch"
    with pytest.raises(BiodistilError, match="token_classification model cannot be scored on gad"):
        run_scoring([(None, str(token_export[0]))], ScoringPlan("gad", max_examples=4), out)
    with pytest.raises(BiodistilError, match="a masked LM has no task head"):
        run_scoring([(None, str(teacher_dir))], ScoringPlan("ncbi_disease", max_examples=4), out)
    with pytest.raises(BiodistilError, match=r"labels \['0', '1'\] are not task bioasq's"):
        run_scoring([(None, str(sequence_dir))], ScoringPlan("bioasq", max_examples=4), out)


# ------------------------------------------------------------------------------------------ accuracy


@needs_onnx
@needs_data
def test_evaluate_scores_pytorch_and_onnx_side_by_side(token_dir, token_export, tmp_path):
    out = tmp_path / "scored"
    assert main(["evaluate", "--finetuned", f"tiny={token_dir}", f"tiny-onnx={token_export[0]}",
                 "--task", "ncbi_disease", "--max-examples", "12", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [m["label"] for m in results["models"]] == ["tiny", "tiny-onnx", "tiny-onnx-int8"]
    cells = {c["model"]: c for c in results["cells"]}
    assert cells["tiny"]["test"] == cells["tiny-onnx"]["test"]  # same predictions, same metric code
    assert cells["tiny-onnx-int8"]["precision"] == "int8" and cells["tiny"]["test_examples"] == 12
    rows = (out / "cells/tiny-onnx-int8/ncbi_disease/scored/predictions.jsonl").read_text().splitlines()
    assert len(rows) == 12 and set(json.loads(rows[0])) == {"id", "tokens", "gold", "prediction"}
    report = (out / "report.md").read_text()
    assert "tiny-onnx-int8" in report and "Scored without training" in report


@needs_onnx
@needs_data
def test_export_with_task_reports_accuracy_side_by_side(token_export):
    accuracy = token_export[1]["accuracy"]
    assert accuracy["task"] == "ncbi_disease" and accuracy["examples"] == 12 and accuracy["max_int8_drop"] == 0.5
    assert accuracy["pytorch_fp32"] == accuracy["onnx_fp32"] and accuracy["onnx_fp32_drop"] == 0
    assert accuracy["int8_drop"] == accuracy["pytorch_fp32"]["f1"] - accuracy["onnx_int8"]["f1"]


def test_int8_limit():
    accuracy = {"task": "t", "split": "dev", "headline": "f1", "max_int8_drop": 0.01, "int8_drop": 0.02,
                "pytorch_fp32": {"f1": 0.8}, "onnx_int8": {"f1": 0.78}}
    with pytest.raises(BiodistilError, match=r"0\.0200 below PyTorch fp32 \(0\.8000; limit 0\.01\); nothing written"):
        check_int8_drop(accuracy, "m")
    check_int8_drop({**accuracy, "int8_drop": 0.01}, "m")
    check_int8_drop({**accuracy, "max_int8_drop": None}, "m")


# ------------------------------------------------------------------------------------------ latency


@needs_onnx
def test_bench_measures_onnx_beside_pytorch(token_dir, token_export):
    models = [(d.label, str(d.path)) for d in expand_models([("tiny", str(token_dir)), (None, str(token_export[0]))])]
    assert [label for label, _ in models] == ["tiny", "onnx", "onnx-int8"]
    result = run_bench(models, BenchConfig(lengths=[16], warmup=0, repeats=2, throughput_batch=4, threads=1))
    rows = {row["label"]: row for row in result["models"]}
    assert rows["onnx-int8"]["runtime"].startswith("onnxruntime") and "int8, 1 thread" in rows["onnx-int8"]["runtime"]
    assert rows["tiny"]["runtime"].startswith("PyTorch")
    assert all(row["latency"]["16"]["median_ms"] > 0 and row["throughput"]["16"]["batch"] == 4 for row in rows.values())
    assert rows["onnx-int8"]["disk_bytes"] < rows["onnx"]["disk_bytes"]


def test_an_export_folder_ships_with_a_card_the_hub_parses(token_export):
    from huggingface_hub import ModelCard

    out, description = token_export
    card = ModelCard.load(out / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "onnx" and {"onnx", "int8"} <= set(data["tags"])
    assert "model.onnx" in card.text and "model.int8.onnx" in card.text
    assert f"{description['checks']['fp32']['max_abs_diff']}" in card.text, "the parity check is stated"
    if description["accuracy"]:
        assert "| onnx int8 |" in card.text
