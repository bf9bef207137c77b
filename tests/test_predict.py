"""Issue 36, first step: `biodistil predict` and `Predictor` run a fine-tuned model or its ONNX export on documents,
with the same code path as `evaluate --finetuned`, character offsets into the original text, and atomic output."""

import io
import json
import sys

import numpy as np
import pytest
import torch
from kd_fixtures import save_teacher, write_token_task

from biodistil import Predictor
from biodistil.cli.main import main
from biodistil.errors import BiodistilError
from biodistil.export.deployed import Deployed, score_deployed
from biodistil.export.predict import Document, entity_spans, read_documents
from biodistil.tasks.prediction import decision_margin
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.splits import read_split


@pytest.fixture(scope="module")
def ner(tmp_path_factory, teacher_dir):
    """A token classifier (random head on the tiny teacher: it tags arbitrary but fixed words) and its task."""
    root = tmp_path_factory.mktemp("predict")
    task_file = write_token_task(root / "task", sizes={"train": 8, "test": 24})
    task = get_task(str(task_file))
    return save_teacher(teacher_dir, task, root / "ner-model", seed=3), task


def test_entity_spans_read_strict_iob2():
    assert entity_spans(["B", "I", "O", "I", "B", "B", "I"]) == [(0, 1, "entity"), (4, 4, "entity"),
                                                                  (5, 6, "entity")]
    assert entity_spans(["B-Disease", "I-Disease", "I-Chemical", "B-Chemical"]) == [(0, 1, "Disease"),
                                                                                   (3, 3, "Chemical")]


def test_predict_returns_exactly_the_entities_evaluation_scores(ner):
    """On the task's test split, written back as plain text, the entities `Predictor` returns are the ones the
    predictions of `evaluate --finetuned` hold, word for word; offsets point into the text."""
    model, task = ner
    examples = read_split(task, "test", None)
    scored, _ = score_deployed(Deployed("m", model, "pytorch", "fp32"), task, examples)
    texts = [" ".join(example.tokens) for example in examples]
    records = Predictor(model, max_length=task.max_length)(texts)  # no run folder records the length here
    assert [r["id"] for r in records] == [str(i) for i in range(len(texts))]
    found = 0
    for text, example, tags, record in zip(texts, examples, scored.predictions.labels, records, strict=True):
        starts = [len(" ".join(example.tokens[:i])) + (1 if i else 0) for i in range(len(example.tokens))]
        predicted = [(starts.index(e["start"]), e["end"]) for e in record["entities"]]
        assert predicted == [(first, starts[last] + len(example.tokens[last])) for first, last, _ in
                             entity_spans(tags)]
        for entity in record["entities"]:
            assert text[entity["start"]:entity["end"]] == entity["text"] and 0 < entity["score"] <= 1
        found += len(record["entities"])
    assert found > 0, "the random head tags some words: the comparison is not empty"


def test_offsets_survive_odd_whitespace_unicode_and_long_documents(ner):
    model, _ = ner
    predictor = Predictor(model)
    text = "  protein\tkinase  —  α-synuclein\n\nbinding  " + " receptor gene" * 60  # longer than max_length 16
    (record,) = predictor([text])
    for entity in record["entities"]:
        assert text[entity["start"]:entity["end"]] == entity["text"]
    assert record["entities"] and record["entities"][-1]["start"] > 400, "the last window is predicted too"


def test_onnx_exports_predict_as_pytorch_does(ner, tmp_path):
    model, task = ner
    assert main(["export", str(model), "--out", str(tmp_path / "onnx"), "--int8"]) == 0
    texts = [" ".join(example.tokens) for example in read_split(task, "test", None)]
    pytorch = Predictor(model, runtime="pytorch", max_length=16)(texts)
    onnx = Predictor(tmp_path / "onnx", runtime="onnx", max_length=16)(texts)
    assert [[(e["start"], e["end"]) for e in r["entities"]] for r in onnx] == \
        [[(e["start"], e["end"]) for e in r["entities"]] for r in pytorch]
    int8 = Predictor(tmp_path / "onnx")  # auto: the fastest the folder holds
    assert int8.variant.precision == "int8" and "int8" in int8.description
    with pytest.raises(BiodistilError, match="holds no pytorch model"):
        Predictor(tmp_path / "onnx", runtime="pytorch")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers; bench/gpu_check.py runs CUDA")
def test_a_pytorch_model_runs_where_device_says_and_cuda_without_a_gpu_is_a_clear_error(ner, tmp_path, capsys):
    model, _ = ner
    predictor = Predictor(model, device="auto")
    assert predictor.model.device.type == "cpu" and "on cpu" in predictor.description
    (tmp_path / "notes.txt").write_text("protein kinase binding\n", encoding="utf-8")
    assert main(["predict", str(model), str(tmp_path / "notes.txt"), "--out", str(tmp_path / "out.jsonl"),
                 "--device", "cuda", "--quiet"]) == 2
    assert "--device=cuda: no CUDA GPU is visible" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_pytorch_bf16_runs_the_model_folder_under_bf16_autocast_close_to_float32(ner, tmp_path, capsys, monkeypatch):
    """`--runtime pytorch-bf16`: the same weights, every forward under bf16 autocast (the head's matrix product comes
    out in bf16), logits within bf16's rounding of float32's; refused on an export folder; a CPU without bf16
    instructions is told that it only emulates it."""
    model, task = ner
    texts = [" ".join(example.tokens) for example in read_split(task, "test", None)]
    logits: dict[str, list[torch.Tensor]] = {"fp32": [], "bf16": []}
    for runtime, key in (("pytorch", "fp32"), ("pytorch-bf16", "bf16")):
        predictor = Predictor(model, runtime=runtime, max_length=16)
        predictor.model.classifier.register_forward_hook(lambda _m, _i, out, key=key: logits[key].append(out))
        records = predictor(texts)
        assert [r["id"] for r in records] == [str(i) for i in range(len(texts))]
    assert predictor.variant.precision == "bf16" and "(pytorch bf16 on cpu" in predictor.description
    assert {t.dtype for t in logits["fp32"]} == {torch.float32}
    assert {t.dtype for t in logits["bf16"]} == {torch.bfloat16}
    fp32 = torch.cat([t.flatten() for t in logits["fp32"]])
    bf16 = torch.cat([t.float().flatten() for t in logits["bf16"]])
    assert fp32.shape == bf16.shape and fp32.abs().max() > 0.05, "a head that outputs something to compare"
    assert (fp32 - bf16).abs().max() < 0.02 + 0.02 * fp32.abs().max(), "bf16 keeps 8 bits of each product's inputs"
    from biodistil.training.machine import bf16_fast

    native = bf16_fast(torch.device("cpu"))  # this machine's flags decide whether it is told; both ways below
    assert ("no native bf16" in capsys.readouterr().err) != native
    monkeypatch.setattr("biodistil.export.predict.bf16_fast", lambda device: False)
    Predictor(model, runtime="pytorch-bf16")
    assert "cpu has no native bf16 (a CPU needs amx_bf16 or avx512_bf16)" in capsys.readouterr().err
    assert main(["export", str(model), "--out", str(tmp_path / "onnx")]) == 0
    with pytest.raises(BiodistilError, match="holds no pytorch-bf16 model"):
        Predictor(tmp_path / "onnx", runtime="pytorch-bf16")


def test_decision_margins_by_hand():
    """The gap between the two most probable tags at words' first sub-words (others ignored), classes, or labels."""
    token = TaskSpec(name="t", kind="token_classification", format="biobert_ner_tsv", files={"test": "x"},
                     labels=["O", "B", "I"], metric="entity_f1")
    logits = np.log(np.array([[1, 1, 1], [3, 1, 1], [1, 1, 1], [4, 1, 1], [1, 1, 1]], dtype=float))
    # softmax rows: [3/5, 1/5, 1/5] (gap 0.4) at word 0's first sub-word, [4/6, 1/6, 1/6] (0.5) at word 1's; the
    # uniform rows (gap 0) are [CLS], word 0's second sub-word and [SEP]
    assert decision_margin(token, logits, [None, 0, 0, 1, None]) == pytest.approx(0.4)
    assert decision_margin(token, logits, [None, None, None, None, None]) == 1.0
    single = token.model_copy(update={"kind": "sequence_classification"})
    assert decision_margin(single, np.log(np.array([3.0, 1.0, 1.0]))) == pytest.approx(0.4)
    multi = token.model_copy(update={"kind": "multilabel_classification"})
    # sigmoid(ln 3) = 0.75 -> |0.75 - 0.5| * 2 = 0.5; sigmoid(-ln 4) = 0.2 -> 0.6
    assert decision_margin(multi, np.array([np.log(3.0), -np.log(4.0)])) == pytest.approx(0.5)


def test_the_int8_fallback_predicts_unsure_windows_again_with_the_fp32_graph(ner, tmp_path, capsys):
    model, task = ner  # one ONNX Runtime thread each: several may sum in another order from one session to the next
    assert main(["export", str(model), "--out", str(tmp_path / "onnx"), "--int8"]) == 0
    texts = [" ".join(example.tokens) for example in read_split(task, "test", None)]
    fp32 = Predictor(tmp_path / "onnx", runtime="onnx", max_length=16, threads=1)(texts)
    int8 = Predictor(tmp_path / "onnx", max_length=16, threads=1)(texts)
    assert int8 != fp32, "int8 drifts (the entities' scores at least), so the checks below can tell them apart"
    everything = Predictor(tmp_path / "onnx", max_length=16, threads=1, int8_fallback=1.0)  # every gap is under 1
    assert everything(texts) == fp32 and everything.fallback.rerun == everything.fallback.windows > 0
    nothing = Predictor(tmp_path / "onnx", max_length=16, threads=1, int8_fallback=1e-12)
    # only a window whose two best tags tie exactly in the int8 graph's (quantised) logits has a gap under 1e-12:
    # rarely one; it alone is predicted again, so every record is the int8 one but for at most that many (a record of
    # several 16-token windows then joins the fp32 graph's tags for that window to the int8 graph's for the others:
    # it may be neither graph's record)
    records, ties = nothing(texts), nothing.fallback.rerun
    assert ties <= nothing.fallback.windows // 20
    assert sum(r != i for r, i in zip(records, int8, strict=True)) <= ties
    assert ties > 0 or records == int8
    def spans(records):
        return [{(e["start"], e["end"], e["label"]) for e in r["entities"]} for r in records]

    whole = {runtime: spans(Predictor(tmp_path / "onnx", runtime=runtime, max_length=128, threads=1)(texts))
             for runtime in ("onnx", "onnx-int8")}  # a window per sentence
    for margin in (0.3, 0.1, 0.03, 0.01, 0.003, 0.001):  # the random head is unsure of most windows
        middle = Predictor(tmp_path / "onnx", max_length=128, threads=1, int8_fallback=margin)
        mixed = spans(middle(texts))
        if 0 < middle.fallback.rerun < middle.fallback.windows:
            break
    assert 0 < middle.fallback.rerun < middle.fallback.windows, "some windows sure, some not"
    assert all(m in (a, b) for m, a, b in zip(mixed, whole["onnx-int8"], whole["onnx"], strict=True))
    notes = tmp_path / "notes.txt"
    notes.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["predict", str(tmp_path / "onnx"), str(notes), "--out", str(tmp_path / "out.jsonl"),
                 "--int8-fallback", "1", "--quiet"]) == 0
    assert "predicted again by the fp32 graph (decision margin under 1)" in capsys.readouterr().err
    for argv, expected in (([str(model), "--int8-fallback", "0.1"], "the fallback backs an int8 graph"),
                           ([str(tmp_path / "onnx"), "--int8-fallback", "0"], "expected a probability gap in"),
                           ([str(tmp_path / "onnx" / "model.int8.onnx"), "--int8-fallback", "0.1"],
                            "needs the export's fp32 graph beside its int8 one")):
        assert main(["predict", *argv, str(notes), "--out", str(tmp_path / "bad.jsonl"), "--quiet"]) == 2
        assert expected in capsys.readouterr().err, argv
    assert not (tmp_path / "bad.jsonl").exists()


def test_a_pair_classifier_gives_its_label_and_every_probability(kd_models, tmp_path):
    teacher, _ = kd_models  # fine-tuned on the tiny yes/no pair task
    records = Predictor(teacher)([("is cell tumour", "protein kinase binding"), ("is mice", "dose levels")])
    for record in records:
        assert record["label"] in ("yes", "no") and set(record["probabilities"]) == {"yes", "no"}
        assert abs(sum(record["probabilities"].values()) - 1) < 1e-4
        assert record["label"] == max(record["probabilities"], key=record["probabilities"].get)


def test_the_command_reads_text_folders_and_json_lines_and_writes_json_lines(ner, tmp_path, monkeypatch, capsys):
    model, _ = ner
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("protein kinase binding\n\nreceptor gene\n", encoding="utf-8")
    (tmp_path / "notes" / "b.txt").write_text("cell tumour\n", encoding="utf-8")
    (tmp_path / "docs.jsonl").write_text(json.dumps({"pmid": "42", "abstract": "gene receptor"}) + "\n")
    assert main(["predict", str(model), "notes", "--out", "out/entities.jsonl", "--quiet"]) == 0
    records = [json.loads(line) for line in (tmp_path / "out/entities.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["notes/a.txt:1", "notes/a.txt:3", "notes/b.txt:1"]
    assert "records/s" in capsys.readouterr().err
    assert main(["predict", str(model), "docs.jsonl", "--text-field", "abstract", "--id-field", "pmid", "--out",
                 "j.jsonl", "--quiet"]) == 0
    assert json.loads((tmp_path / "j.jsonl").read_text())["id"] == "42"
    assert main(["predict", str(model), "notes", "--whole-files", "--out", "w.jsonl", "--quiet"]) == 0
    assert [json.loads(x)["id"] for x in (tmp_path / "w.jsonl").read_text().splitlines()] == ["notes/a.txt",
                                                                                               "notes/b.txt"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("protein kinase\n"))
    assert main(["predict", str(model), "-", "--out", "-", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["id"] == "<stdin>:1"


def test_bad_input_names_file_and_line_and_leaves_no_output(ner, tmp_path, teacher_dir, capsys):
    model, _ = ner
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "gene"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(model), str(bad), "--out", str(out), "--quiet"]) == 2
    assert f"{bad}:2: no text field 'text'" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl*")), "nothing half-written"
    bad.write_text('{"text": "gene"\n')
    assert main(["predict", str(model), str(bad), "--out", str(out), "--quiet"]) == 2
    assert f"{bad}:1: not a JSON record" in capsys.readouterr().err
    assert main(["predict", str(teacher_dir), str(bad), "--out", str(out), "--quiet"]) == 2
    assert "masked lm has no task head to predict with" in capsys.readouterr().err


def test_read_documents_keeps_order_ids_and_pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"q": "is it", "p": "yes it is", "id": 7}) + "\n\n")
    (document,) = read_documents([str(path)], text_field="q", pair_field="p")
    assert document == Document("7", "is it", "yes it is")
    with pytest.raises(BiodistilError, match="no pair field 'x'"):
        list(read_documents([str(path)], text_field="q", pair_field="x"))


def write_multilabel_task(folder, size: int = 24):
    """A tiny multi-label task (BLURB JSON lines, 0/1 vectors over three labels)."""
    import random

    from kd_fixtures import OTHER, POSITIVE

    rng = random.Random(5)
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"t{i}", "sentence": " ".join(rng.choice(POSITIVE + OTHER) for _ in range(rng.randint(4, 9))),
             "label": [rng.randint(0, 1) for _ in range(3)]} for i in range(size)]
    (folder / "test.json").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (folder / "tiny_hoc.yaml").write_text(json.dumps({
        "name": "tiny_hoc", "kind": "multilabel_classification", "format": "blurb_jsonl",
        "files": {"test": str(folder / "test.json")}, "labels": ["a", "b", "c"], "metric": "hoc_example_f1",
        "max_length": 32}), encoding="utf-8")
    return folder / "tiny_hoc.yaml", folder / "test.json"


@pytest.mark.parametrize("kind", ["pair", "multi-label"])
def test_every_classifier_kind_predicts_exactly_what_evaluation_scores(kind, kd_models, pair_task, teacher_dir,
                                                                       tmp_path):
    """The labels `predict` returns for a task file's examples (read with --format) are those of the predictions
    `evaluate --finetuned` scores, example for example, for a pair classifier and a multi-label one."""
    if kind == "pair":
        model, task = kd_models[0], pair_task
        test_file = task.files["test"]
    else:
        spec, test_file = write_multilabel_task(tmp_path / "hoc")
        task = get_task(str(spec))
        model = save_teacher(teacher_dir, task, tmp_path / "hoc-model", seed=4)
    examples = read_split(task, "test", None)
    scored, _ = score_deployed(Deployed("m", model, "pytorch", "fp32"), task, examples)
    documents = list(read_documents([str(test_file)], task_format="blurb_jsonl"))
    assert [d.id for d in documents] == [e.id for e in examples]
    records = Predictor(model, max_length=task.max_length)(documents)
    if kind == "pair":
        assert [r["label"] for r in records] == scored.predictions.labels
    else:
        chosen = [[label for label, bit in zip(task.labels, bits, strict=True) if bit]
                  for bits in scored.predictions.labels]
        assert [r["labels"] for r in records] == chosen
        assert any(chosen) and not all(len(c) == 3 for c in chosen), "the comparison is not trivial"
    for record, probabilities in zip(records, scored.predictions.scores, strict=True):
        assert list(record["probabilities"].values()) == pytest.approx(probabilities, abs=1e-6)


def test_a_task_file_is_predicted_word_for_word_as_evaluation_reads_it(ner, tmp_path, capsys):
    """`--format biobert_ner_tsv`: the sentences keep their words (no second split), and the entities are exactly
    those of evaluation's predictions."""
    model, task = ner
    examples = read_split(task, "test", None)
    scored, _ = score_deployed(Deployed("m", model, "pytorch", "fp32"), task, examples)
    out = tmp_path / "entities.jsonl"
    assert main(["predict", str(model), task.files["test"], "--format", "biobert_ner_tsv", "--max-length",
                 str(task.max_length), "--out", str(out), "--quiet"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [e.id for e in examples]
    for example, tags, record in zip(examples, scored.predictions.labels, records, strict=True):
        starts = [len(" ".join(example.tokens[:i])) + (1 if i else 0) for i in range(len(example.tokens))]
        assert [(starts.index(e["start"]), e["label"]) for e in record["entities"]] == \
            [(first, kind) for first, _, kind in entity_spans(tags)]
    assert main(["predict", str(model), str(tmp_path / "absent.tsv"), "--format", "biobert_ner_tsv", "--out",
                 str(out), "--quiet"]) == 2
    assert "absent.tsv: no such file" in capsys.readouterr().err


@pytest.fixture
def int8_layers(bench_script):
    """bench/research/int8_layers.py, imported; the worker's torch threads restored after it (its predictors use
    1)."""
    return bench_script("int8_layers")


def test_the_int8_layers_bench_finds_a_nodes_layer_by_name_or_by_its_recorded_scopes(int8_layers):
    """Fused BERT graphs name their nodes by layer; the dynamo exporter's unfused graphs (MPNet, ModernBERT) name them
    `node_MatMul_70` and record the module scopes in the node's metadata."""
    from onnx import StringStringEntryProto, helper

    named = helper.make_node("MatMul", ["a", "b"], ["c"], name="/model/bert/encoder/layer.3/output/dense/MatMul")
    scoped = helper.make_node("MatMul", ["a", "b"], ["c"], name="node_MatMul_70")
    scopes = "['', 'model', 'model.mpnet', 'model.mpnet.encoder', 'model.mpnet.encoder.layer.11', 'x.attention']"
    scoped.metadata_props.append(StringStringEntryProto(key="pkg.torch.onnx.name_scopes", value=scopes))
    head = helper.make_node("MatMul", ["a", "b"], ["c"], name="node_MatMul_323")
    head.metadata_props.append(StringStringEntryProto(key="pkg.torch.onnx.name_scopes",
                                                      value="['', 'model', 'model.classifier', 'linear_36']"))
    assert [int8_layers.node_layer(node) for node in (named, scoped, head)] == [3, 11, None]
    assert int8_layers.node_layer(helper.make_node("Attention", ["a"], ["c"], name="Attention_2")) == 2


def test_the_int8_layers_bench_keeps_the_layers_it_names_in_fp32(ner, tmp_path, int8_layers):
    """bench/research/int8_layers.py on the tiny NER model: `none` is the int8 graph, `0` keeps layer 0's matmuls in
    fp32, `head` the classifier; keeping the embeddings, every layer and the head in fp32 reproduces PyTorch's
    entities."""
    model, _ = ner
    assert main(["export", str(model), "--out", str(tmp_path / "onnx"), "--int8"]) == 0
    out = tmp_path / "record.json"
    task_file = write_token_task(tmp_path / "task", sizes={"train": 8, "test": 24})  # the fixture's task again
    assert int8_layers.main([str(model), str(tmp_path / "onnx"), "--task", str(task_file), "--keep", "none", "0",
                             "head", "embeddings,0,1,2,3,head", "--out", str(out)]) == 0
    rows = {row["keep_fp32"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["none"]["nodes_kept_fp32"] == 0 and rows["head"]["nodes_kept_fp32"] == 1
    assert rows["0"]["nodes_kept_fp32"] >= 2, "layer 0's attention and matmuls"
    everything = rows["embeddings,0,1,2,3,head"]
    assert everything["share_of_pytorch"] == 1.0 and everything["added"] == 0

    task_file = write_token_task(tmp_path / "task", sizes={"train": 8, "dev": 8, "test": 24})
    assert int8_layers.main([str(model), str(tmp_path / "onnx"), "--task", str(task_file), "--schemes",
                             "per-channel", "blockwise", "static", "--out", str(out)]) == 0
    nodes = {row["scheme"]: row["int8_nodes"] for row in json.loads(out.read_text())["rows"]}
    assert nodes["per-channel"]["MatMulInteger"] > 0 and nodes["per-channel"]["QAttention"] > 0
    assert nodes["blockwise"]["MatMulNBits"] > 0 and "MatMulInteger" not in nodes["blockwise"]
    assert nodes["static"]["QLinearMatMul"] > 0 and "DynamicQuantizeLinear" not in nodes["static"]

    assert int8_layers.main([str(model), str(tmp_path / "onnx"), "--task", str(task_file), "--keep", "none",
                             "embeddings,0,1,2,3,head", "--smooth", "0.7", "--out", str(out)]) == 0
    rows = {(row["keep_fp32"], row["smooth"]): row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {(keep, alpha) for keep in ("none", "embeddings,0,1,2,3,head") for alpha in (None, 0.7)}
    assert rows["embeddings,0,1,2,3,head", 0.7]["share_of_pytorch"] == 1.0, "the migrated fp32 graph is the model"


def test_the_predict_bench_adds_a_fallback_row_per_margin_and_checks_it_on_a_task(ner, tmp_path, bench_script):
    """bench/predict.py: `--int8-fallback` adds a row per margin after an int8 model; at margin 1 every window is
    predicted again in fp32, so that row finds exactly the PyTorch model's entities. `PATH@RUNTIME` runs one row
    with that runtime (a model folder under bf16 autocast), which evaluation has no scores of to equal."""
    predict_bench = bench_script("predict")

    model, _ = ner
    assert main(["export", str(model), "--out", str(tmp_path / "onnx"), "--int8"]) == 0
    rows = predict_bench.variants([f"pytorch={model}", f"student={tmp_path / 'onnx'}", f"bf16={model}@pytorch-bf16"],
                                  "auto", [0.05, 1.0])
    onnx = str(tmp_path / "onnx")
    assert rows == [("pytorch", str(model), "auto", None), ("student", onnx, "auto", None),
                    ("student+fp32<0.05", onnx, "auto", 0.05), ("student+fp32<1", onnx, "auto", 1.0),
                    ("bf16", str(model), "pytorch-bf16", None)]
    threads = torch.get_num_threads()
    try:
        timed = predict_bench.run(str(tmp_path / "onnx"), "auto", ["protein kinase binding", "cell tumour"], 1, 1.0)
    finally:
        torch.set_num_threads(threads)
    assert timed["fallback_rerun_share"] == 1.0 and timed["records"] == 2 and 0 <= timed["overhead_share"] < 1
    task_file = write_token_task(tmp_path / "task", sizes={"train": 8, "test": 24})  # the fixture's task again
    check = predict_bench.task_agreement(rows, str(task_file), None, "test")
    assert check["predict_equals_evaluate"] == {"pytorch": True, "student": True}
    assert check["share_of_first_entities"]["student+fp32<1"] == 1.0
    assert check["fallback_rerun_share"]["student+fp32<1"] == 1.0
    assert 0 <= check["fallback_rerun_share"]["student+fp32<0.05"] <= 1
    assert 0 <= check["share_of_first_entities"]["bf16"] <= 1  # bf16 moves a random head's near-ties: no bound
