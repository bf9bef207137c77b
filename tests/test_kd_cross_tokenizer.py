"""Task KD with an online teacher across tokenizers: a tiny ModernBERT teacher with a byte-level BPE tokenizer and a
BERT student with a WordPiece one, on a tiny NER task (per word: each word's first sub-word on both sides) and a
tiny sequence task (per example). The teacher reads its own tokens of each text; its logits land at the student's
positions; a kd run learns, and a MetaDistil step trains the teacher through the student's pilot step."""

import json

import pytest
import torch
from kd_fixtures import kd_recipe, save_student, save_teacher, write_pair_task, write_token_task
from modernbert_fixtures import save_modernbert, train_bpe

from biodistil.cli.main import main
from biodistil.config import TrainConfig, dump_recipe
from biodistil.data.alignment import tokenize_words
from biodistil.kd.command import run_kd
from biodistil.kd.meta import MetaTeacherUpdate
from biodistil.kd.module import KDModule, kd_data, kd_features
from biodistil.kd.recipe import KDOptions, MetaConfig
from biodistil.models.features import FeatureRequest
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.encoding import NO_POSITION
from biodistil.tasks.registry import get_task
from biodistil.teachers import task_cache
from biodistil.teachers.loading import load_teacher_classifier
from biodistil.teachers.signal import OnlineTeacher, at_student_tokens, classifier_forward


@pytest.fixture(scope="module")
def pair(tmp_path_factory, corpus_file, tokenizer):
    """(root, BPE teacher tokenizer, masked-LM ModernBERT teacher folder, BERT student folder)."""
    root = tmp_path_factory.mktemp("kd-cross")
    bpe = train_bpe(corpus_file.read_text().splitlines(), 300, root / "bpe")
    teacher = save_modernbert(bpe, root / "teacher", dropout=0.0)
    return root, bpe, teacher, save_student(tokenizer, root / "student", dropout=0.0)


@pytest.fixture(scope="module")
def tasks(pair):
    root = pair[0]
    token, sequence = write_token_task(root / "ner"), write_pair_task(root / "qa")
    return {"token": token, "sequence": sequence}


def test_at_student_tokens_places_teacher_rows_by_hand() -> None:
    logits = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], requires_grad=True)
    index = torch.tensor([[2, 0, NO_POSITION, 2]])
    placed = at_student_tokens(logits, index)
    assert placed.tolist() == [[[5.0, 6.0], [1.0, 2.0], [0.0, 0.0], [5.0, 6.0]]]
    placed.sum().backward()
    assert logits.grad.tolist() == [[[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]]  # the gradient goes back to the teacher


def test_token_features_carry_each_words_first_teacher_token(pair, tasks, tokenizer) -> None:
    _, bpe, _, _ = pair
    task = get_task(str(tasks["token"]))
    examples = task.load_split("train")[:4]
    features = kd_features(task, examples, tokenizer, bpe)
    checked = 0
    for feature in features:
        example, start = feature["origin"]
        words = examples[example].tokens[start:]
        teacher_words = tokenize_words(bpe, words[:max(feature["word_ids"]) + 1], truncation=True,
                                       max_length=task.max_length).word_ids()
        assert feature["teacher"]["input_ids"][0] == bpe.cls_token_id and len(feature["teacher"]["attention_mask"]) == \
            len(feature["teacher"]["input_ids"])
        for position, word in enumerate(feature["word_ids"]):
            index = feature["teacher"]["word_index"][position]
            if word < 0:
                assert index == NO_POSITION and feature["kd_mask"][position] == 0
            elif index == NO_POSITION:  # the teacher's side was cut before this word
                assert word not in teacher_words and feature["kd_mask"][position] == 0
            else:  # the first teacher token of the same word
                assert teacher_words[index] == word and teacher_words.index(word) == index
                checked += feature["kd_mask"][position]
    assert checked > 10


def test_sequence_features_carry_the_teachers_encoding_of_the_example(pair, tasks, tokenizer) -> None:
    _, bpe, _, _ = pair
    task = get_task(str(tasks["sequence"]))
    example = task.load_split("train")[0]
    (feature,) = kd_features(task, [example], tokenizer, bpe)
    expected = bpe(example.text, example.text_pair, truncation="longest_first", max_length=task.max_length)
    assert feature["teacher"]["input_ids"] == expected["input_ids"]
    assert feature["input_ids"] == tokenizer(example.text, example.text_pair)["input_ids"]
    assert "word_index" not in feature["teacher"]


@pytest.mark.parametrize("kind", ["token", "sequence"])
def test_online_teacher_reads_its_own_tokens_and_its_logits_pair_with_the_students(kind, pair, tasks,
                                                                                   tokenizer) -> None:
    root, bpe, teacher_dir, _ = pair
    task = get_task(str(tasks[kind]))
    teacher = load_teacher_classifier(save_teacher(teacher_dir, task, root / f"teacher-{kind}"), task)
    features, collate = kd_data(task, task.load_split("train")[:6], tokenizer, None, bpe)
    batch = collate(features)
    assert not torch.equal(batch.teacher["input_ids"], batch.input_ids)  # two tokenizations of the same texts
    logits = classifier_forward(teacher, batch, FeatureRequest()).logits.logits()
    with torch.no_grad():
        own = teacher(input_ids=batch.teacher["input_ids"], attention_mask=batch.teacher["attention_mask"]).logits
    if kind == "sequence":
        torch.testing.assert_close(logits, own)
        return
    rows, length = batch.input_ids.shape
    assert logits.shape == (rows * length, task.num_labels)
    index = batch.teacher["word_index"]
    b, p = (index >= 0).nonzero(as_tuple=True)[0][0], (index >= 0).nonzero(as_tuple=True)[1][0]
    torch.testing.assert_close(logits.reshape(rows, length, -1)[b, p], own[b, index[b, p]])


@pytest.mark.parametrize("kind", ["token", "sequence"])
def test_kd_with_an_online_teacher_across_tokenizers_learns(kind, pair, tasks, tmp_path, monkeypatch,
                                                            tokenizer) -> None:
    root, _, teacher_dir, student_dir = pair
    task = get_task(str(tasks[kind]))
    teacher = save_teacher(teacher_dir, task, root / f"teacher-run-{kind}")
    read = []
    original = task_cache.forward_teacher
    monkeypatch.setattr(task_cache, "forward_teacher", lambda model, inputs, hidden:
                        read.append(inputs["input_ids"]) or original(model, inputs, hidden))
    recipe = kd_recipe(tasks[kind], teacher, student_dir, tmp_path / "run",
                       kd={"teacher_outputs": "online", "epochs": 6, "alpha": 1.0, "beta": 0.0},
                       train={"learning_rate": 3e-3, "log_every": 1, "warmup_steps": 0})
    run_kd(recipe)
    logs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    soft = [row["soft"] for row in logs if row.get("split") == "train"]
    assert len(soft) >= 6 and sum(soft[-3:]) / 3 < sum(soft[:3]) / 3, soft
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["teacher_outputs"] == "online"
    assert max(int(ids.max()) for ids in read) >= len(tokenizer), "the teacher reads its own (BPE) ids"


def test_metadistil_across_tokenizers_trains_the_teacher_and_the_student(pair, tasks, tokenizer) -> None:
    root, bpe, teacher_dir, student_dir = pair
    task = get_task(str(tasks["token"]))
    torch.manual_seed(0)
    teacher = load_teacher_classifier(save_teacher(teacher_dir, task, root / "teacher-meta"), task)
    module = KDModule(build_classifier(student_dir, task), task, KDOptions(alpha=0.5, beta=0.5, temperature=2.0),
                      OnlineTeacher(teacher, classifier_forward), trainable_teacher=True)
    examples = task.load_split("train")
    train, collate = kd_data(task, examples[:16], tokenizer, None, bpe)
    quiz, _ = kd_data(task, examples[16:], tokenizer, None, bpe)
    update = MetaTeacherUpdate(module, quiz, collate, MetaConfig(mode="metadistil", teacher_learning_rate=1e-3),
                               TrainConfig(learning_rate=0.05, batch_size=8), seed=1)
    module.train()
    teacher_before = [p.detach().clone() for p in module.teacher.parameters()]
    batch = collate(train[:8])
    logs = update(module, [batch], step=0)
    assert logs["meta_grad_norm"] > 0, "the quiz loss reaches the BPE teacher through the pilot step"
    assert any(not torch.equal(a, p) for a, p in zip(teacher_before, module.teacher.parameters(), strict=True))
    optimizer = torch.optim.SGD(module.student.parameters(), lr=0.05)
    losses = []
    for _ in range(8):  # the student's own step with the updated teacher: its loss falls
        loss, _ = module(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("mode", ["metadistil", "adaptive"])
def test_meta_learning_runs_across_tokenizers_from_the_cli(mode, pair, tasks, tmp_path) -> None:
    root, _, teacher_dir, student_dir = pair
    task = get_task(str(tasks["token"]))
    teacher = save_teacher(teacher_dir, task, root / f"teacher-cli-{mode}")
    recipe = kd_recipe(tasks["token"], teacher, student_dir, tmp_path / "run", kd={"alpha": 0.5, "beta": 0.5},
                       transfer={"keep_labels": True}, meta={"mode": mode, "teacher_learning_rate": 1e-3})
    dump_recipe(recipe, tmp_path / "kd.yaml")
    assert main(["kd", str(tmp_path / "kd.yaml")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["teacher_outputs"] == "online" and summary["finished"] and "quiz_loss" in summary["meta"]
    meta = [json.loads(line) for line in (tmp_path / "run" / "meta.jsonl").read_text().splitlines()]
    assert len(meta) == summary["steps"] and all(row["meta_grad_norm"] > 0 for row in meta)
