"""SmoothQuant's migration on ONNX graphs (`biodistil.export.smoothing`, `export --int8-smooth`): the factors of
eq. 4 by hand, channel maxima read at non-padding positions only, one Mul per activation shared by the products
that read it, the fp32 function unchanged, per-tensor int8 error cut where one channel outlies, and the export
option end to end on a tiny MPNet (calibrated on NCBI-disease's dev split; skipped without the data folder)."""

import json
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
import torch
from recipe_fixtures import data_root
from transformers import BertConfig

from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.export.command import ExportOptions
from biodistil.export.smoothing import LAYER_NORMS, migration_factors, migration_groups, smooth_graph

needs_onnx = pytest.mark.skipif(not all(find_spec(n) for n in ("onnx", "onnxruntime", "onnxscript")),
                                reason="the optional extra 'export' is not installed")
VOCAB, CHANNELS, OUTLIER = 40, 16, 100.0


def test_migration_factors_by_hand():
    """s_j = max|X_j|^α / max|W_j|^(1−α): α 0.5, |X| maxima (4, 1, 0), |W| maxima (1, 4, 9) → (2, 0.5, floor)."""
    factors = migration_factors(np.array([4.0, 1.0, 0.0]), np.array([1.0, 4.0, 9.0]), 0.5)
    assert factors[:2] == pytest.approx([2.0, 0.5])
    assert factors[2] == pytest.approx(max(1e-5**0.5 / 9**0.5, 1e-5))  # a dead channel: floored, never 0
    # α 0.8 on the first channel: 4^0.8 / 1^0.2
    assert migration_factors(np.array([4.0]), np.array([1.0]), 0.8)[0] == pytest.approx(4**0.8)


def outlier_graph(folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """input_ids → Gather(E) → X, read by two MatMuls (W1, W2), logits = X·W1 + X·W2. Channel 0 of E is 100× the
    others (the outlier) and read with weights 100× smaller; row 7 of E, fed only at padded positions, is 1,000 in
    channel 1."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = rng.normal(size=(VOCAB, CHANNELS)).astype(np.float32)
    table[:, 0] *= OUTLIER
    table[7, 1] = 1000.0
    weights = {"W1": rng.normal(size=(CHANNELS, 3)).astype(np.float32),
               "W2": rng.normal(size=(CHANNELS, 3)).astype(np.float32)}
    for weight in weights.values():
        weight[0] /= OUTLIER  # as in trained transformers: the outlying channel is read with small weights
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["X"]),
             helper.make_node("MatMul", ["X", "W1"], ["A"]),
             helper.make_node("MatMul", ["X", "W2"], ["B"]),
             helper.make_node("Add", ["A", "B"], ["logits"])]
    graph = helper.make_graph(
        nodes, "outlier",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", 3])],
        [numpy_helper.from_array(table, "E"), *(numpy_helper.from_array(w, n) for n, w in weights.items())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    BertConfig(vocab_size=VOCAB, hidden_size=CHANNELS, num_attention_heads=1).save_pretrained(folder)
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path, {"E": table, **weights}


def batches(padded: bool = True) -> list[dict[str, np.ndarray]]:
    """Two batches of ids 0–6 and 8–39; `padded`: id 7 at the first row's last two positions, masked out."""
    rng = np.random.default_rng(1)
    found = []
    for rows, length in ((2, 9), (3, 5)):
        ids = rng.choice([i for i in range(VOCAB) if i != 7], size=(rows, length))
        mask = np.ones_like(ids)
        if padded:
            ids[0, -2:], mask[0, -2:] = 7, 0
        found.append({"input_ids": ids, "attention_mask": mask})
    return found


def run(path: Path, batch: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {k: v.astype(np.int64) for k, v in batch.items()})[0]


@needs_onnx
@pytest.mark.parametrize("watched_mb", [256.0, 1e-4], ids=["whole-batches", "one-row-per-run"])
def test_one_division_per_activation_keeps_the_function_and_scales_the_weights_rows(tmp_path, monkeypatch,
                                                                                     watched_mb):
    import onnx
    from onnx import numpy_helper

    from biodistil.export import smoothing

    monkeypatch.setattr(smoothing, "WATCHED_MB", watched_mb)
    source, arrays = outlier_graph(tmp_path / "graph")
    groups = migration_groups(onnx.load(str(source)).graph)
    assert [(g.activation, g.weights) for g in groups] == [("X", ["W1", "W2"])]
    assert migration_groups(onnx.load(str(source)).graph, LAYER_NORMS) == [], "X comes from a Gather"
    with pytest.raises(BiodistilError, match="no MatMul or Attention with a constant weight to migrate"):
        smooth_graph(source, tmp_path / "graph" / "none.onnx", 0.5, lambda model: None, inputs="layernorm")
    record = smooth_graph(source, tmp_path / "graph" / "smoothed.onnx", 0.5,
                          lambda model: [model(**batch) for batch in batches()])
    assert (record["activations"], record["products"]) == (1, 2)
    assert not (tmp_path / "graph" / ".calibration.onnx").exists()

    smoothed = onnx.load(str(tmp_path / "graph" / "smoothed.onnx"))
    muls = [n for n in smoothed.graph.node if n.op_type == "Mul"]
    assert len(muls) == 1 and muls[0].input[0] == "X"
    assert all(n.input[0] == muls[0].output[0] for n in smoothed.graph.node if n.op_type == "MatMul")
    # the factors by hand: channel maxima over the rows the unmasked ids pick (id 7's 1,000 never counts)
    seen = sorted({int(i) for b in batches() for i in b["input_ids"][b["attention_mask"] == 1]})
    x_max = np.abs(arrays["E"][seen]).max(axis=0)
    w_max = np.maximum(np.abs(arrays["W1"]).max(axis=1), np.abs(arrays["W2"]).max(axis=1))
    factors = x_max**0.5 / w_max**0.5
    assert x_max[1] < 10
    stored = {t.name: numpy_helper.to_array(t) for t in smoothed.graph.initializer}
    np.testing.assert_allclose(stored["W1"], arrays["W1"] * factors[:, None], rtol=1e-5)
    np.testing.assert_allclose(stored["W2"], arrays["W2"] * factors[:, None], rtol=1e-5)
    np.testing.assert_allclose(stored[muls[0].input[1]], 1 / factors, rtol=1e-5)
    for batch in batches():
        want = run(source, batch)
        np.testing.assert_allclose(run(tmp_path / "graph" / "smoothed.onnx", batch), want,
                                   atol=1e-4 * np.abs(want).max())


@needs_onnx
def test_the_migration_cuts_per_tensor_int8_error_where_one_channel_outlies(tmp_path):
    """uint8 per tensor gives X's 100× channel the whole range: the other channels keep a few steps. Migrated at
    α 0.5 first, the same quantisation is several times closer to fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source, _ = outlier_graph(tmp_path / "graph")
    smooth_graph(source, tmp_path / "graph" / "smoothed.onnx", 0.5,
                 lambda model: [model(**b) for b in batches(padded=False)])
    errors = {}
    for name in ("model", "smoothed"):
        target = tmp_path / "graph" / f"{name}.int8.onnx"
        quantize_dynamic(str(tmp_path / "graph" / f"{name}.onnx"), str(target), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"])
        errors[name] = max(float(np.abs(run(target, b) - run(source, b)).max()) for b in batches(padded=False))
    assert errors["smoothed"] < errors["model"] / 3, errors


@needs_onnx
def test_the_option_is_checked_before_any_work(tmp_path, capsys):
    model = tmp_path / "absent"
    assert main(["export", str(model), "--out", str(tmp_path / "o"), "--int8", "--int8-smooth", "0.7"]) == 2
    assert "--int8-smooth needs --int8 and --task" in capsys.readouterr().err
    assert main(["export", str(model), "--out", str(tmp_path / "o"), "--int8", "--task", "ncbi_disease",
                 "--int8-smooth", "1.5"]) == 2
    assert "strictly between 0 and 1; got 1.5" in capsys.readouterr().err
    assert main(["export", str(model), "--out", str(tmp_path / "o"), "--int8", "--task", "ncbi_disease",
                 "--int8-smooth", "0.7", "--int8-scheme", "per-tensor"]) == 2
    assert "--int8-smooth needs int8 weights with a scale per column" in capsys.readouterr().err
    assert ExportOptions(int8=True, task="t", int8_smooth=0.7).schemes == ["per-channel"]
    assert ExportOptions(int8=True, task="t").schemes == ["per-tensor", "per-channel"]


@pytest.mark.slow
@needs_onnx
@pytest.mark.skipif(data_root() is None, reason="needs the shared data folder (NCBI-disease)")
def test_export_int8_smooth_on_an_mpnet_calibrates_on_dev_and_records_it(tmp_path, tokenizer, capsys):
    import onnx
    from transformers import MPNetConfig, MPNetForTokenClassification

    config = MPNetConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id,
                         id2label={0: "O", 1: "B", 2: "I"}, label2id={"O": 0, "B": 1, "I": 2})
    torch.manual_seed(5)
    source = tmp_path / "model"
    MPNetForTokenClassification(config).save_pretrained(source)
    tokenizer.save_pretrained(source)
    out = tmp_path / "onnx"
    assert main(["export", str(source), "--out", str(out), "--int8", "--task", "ncbi_disease", "--max-examples", "8",
                 "--int8-smooth", "0.7"]) == 0
    description = json.loads((out / "export.json").read_text())
    smoothing = description["quantization"]["smoothing"]
    # per layer: Q/K/V's input, the attention output's, the intermediate's, the FFN output's; then the classifier's
    assert (smoothing["alpha"], smoothing["inputs"], smoothing["activations"], smoothing["products"]) == \
        (0.7, "all", 9, 13)
    assert smoothing["calibration"] == {"split": "dev", "examples": 512}
    assert description["quantization"]["schemes"] == ["per-channel"]
    assert description["quantization"]["choice"].startswith(
        "per-channel: the one scheme auto makes after SmoothQuant's migration (drops per-channel ")
    printed = capsys.readouterr().out
    assert "SmoothQuant before int8 (α 0.7): 9 activations divided per channel, 13 products' weights scaled; " \
        "calibrated on 512 dev examples" in printed
    assert "after SmoothQuant's migration (α 0.7)" in description["quantization"]["activations"]
    assert "SmoothQuant before quantising (α 0.7)" in (out / "README.md").read_text()

    def smooth_nodes(graph: str) -> int:
        return sum(n.name.endswith("/smooth") for n in onnx.load(str(out / graph)).graph.node)
    assert (smooth_nodes("model.onnx"), smooth_nodes("model.int8.onnx")) == (0, 9)  # the fp32 graph is untouched
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []

    # only the LayerNorm outputs: Q/K/V's and the intermediate's input per layer, and the classifier's
    record = smooth_graph(out / "model.onnx", tmp_path / "layernorm.onnx", 0.7,
                    lambda model: model(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3)),
                    inputs="layernorm")
    assert (record["inputs"], record["activations"], record["products"]) == ("layernorm", 5, 9)
    assert description["accuracy"]["onnx_int8"]["f1"] >= 0


def test_the_deploy_stage_passes_its_alpha_to_every_export(tmp_path, monkeypatch):
    """`int8_smooth` of a pipeline's deploy stage reaches each export's options (gate on dev, as before), and an α
    outside (0, 1) is a recipe error naming the field."""
    from pydantic import ValidationError

    from biodistil.evaluation import deploy
    from biodistil.evaluation.deploy import DeployRecipe

    asked = []

    def export(model_dir, out, options):
        asked.append(options)
        out.mkdir(parents=True)
        (out / "export.json").write_text("{}")

    monkeypatch.setattr(deploy, "run_export", export)
    recipe = DeployRecipe(task="ncbi_disease", int8_smooth=0.8, models=[{"name": "m", "path": str(tmp_path)}])
    deploy._export(recipe, recipe.models[0], tmp_path / "onnx" / "m")
    assert [(o.int8, o.split, o.int8_smooth) for o in asked] == [(True, "dev", 0.8)]
    with pytest.raises(ValidationError, match="int8_smooth"):
        DeployRecipe(task="ncbi_disease", int8_smooth=1.0, models=[{"name": "m", "path": str(tmp_path)}])
