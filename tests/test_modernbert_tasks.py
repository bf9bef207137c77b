"""Task side with byte-level BPE tokenizers (ModernBERT, RoBERTa): word-level NER labels aligned and mapped back
(words of several pieces, sentence-initial words), and no token_type_ids for models that take none."""

import json

import pytest
import torch
from kd_fixtures import kd_recipe, save_student, save_teacher, write_token_task
from modernbert_fixtures import modernbert_arch, save_modernbert, train_bpe
from transformers import AutoModelForTokenClassification, RobertaTokenizer

from biodistil.config import ArchitectureConfig
from biodistil.data.alignment import align_labels, tokenize_words, word_predictions, words_for_tokenizer
from biodistil.data.batch import Batch
from biodistil.data.formats import TokenExample
from biodistil.finetune.on_task import ClassifierModule
from biodistil.kd.command import run_kd
from biodistil.models.student import architecture_config
from biodistil.tasks.encoding import collator_for, encode_split, model_inputs
from biodistil.tasks.registry import get_task

SENTENCE = ["Interleukin", "apoptosis", "in", "BRCA1", "-", "mutated", "tumours", "."]
TAGS = ["B", "O", "O", "B", "I", "I", "I", "O"]


@pytest.fixture(scope="module")
def bpe(corpus_file, tmp_path_factory):
    return train_bpe(corpus_file.read_text().splitlines(), 400, tmp_path_factory.mktemp("bpe"))


def roberta_like(bpe, add_prefix_space: bool) -> RobertaTokenizer:
    """A RoBERTa tokenizer class over the same vocabulary and merges."""
    model = json.loads(bpe.backend_tokenizer.to_str())["model"]
    return RobertaTokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]],
                            add_prefix_space=add_prefix_space, bos_token="[CLS]", eos_token="[SEP]",
                            cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
                            mask_token="[MASK]")


def test_bpe_words_carry_their_space_wherever_they_stand(bpe):
    first = tokenize_words(bpe, ["apoptosis", "in", "tumours"], add_special_tokens=False)
    later = tokenize_words(bpe, ["in", "apoptosis", "tumours"], add_special_tokens=False)
    pieces = bpe.convert_ids_to_tokens(first["input_ids"])
    assert pieces[0].startswith("Ġ"), "a sentence-initial word is tokenized as in running text"
    head = [i for i, w in zip(first["input_ids"], first.word_ids(), strict=True) if w == 0]
    inner = [i for i, w in zip(later["input_ids"], later.word_ids(), strict=True) if w == 1]
    assert head == inner, "a word is split into the same pieces at the start of a sentence and inside it"
    # the same pieces as the word gets in running text
    assert bpe(" apoptosis", add_special_tokens=False)["input_ids"] == head


def test_roberta_tokenizers_agree_with_and_without_add_prefix_space(bpe):
    with_space, without = roberta_like(bpe, True), roberta_like(bpe, False)
    expected = with_space(SENTENCE, is_split_into_words=True)["input_ids"]
    assert tokenize_words(without, SENTENCE)["input_ids"] == expected
    assert tokenize_words(with_space, SENTENCE)["input_ids"] == expected, "no second space"


def test_wordpiece_words_are_unchanged(tokenizer):
    assert words_for_tokenizer(tokenizer, SENTENCE) == SENTENCE


@pytest.mark.parametrize("policy", ["first", "all"])
def test_ner_labels_round_trip_through_bpe_pieces(bpe, policy):
    task = get_task("ncbi_disease").model_copy(update={"label_policy": policy})
    encoded = encode_split(task, [TokenExample("s1", SENTENCE, TAGS)], bpe)
    (feature,), (word_ids,) = encoded.features, encoded.word_ids
    assert "token_type_ids" not in feature
    pieces = [word_ids.count(w) for w in range(len(SENTENCE))]
    assert max(pieces) >= 3 and pieces[0] >= 2, f"words of several pieces, the first word too: {pieces}"
    labels = feature["labels"]
    ids = [task.label_to_id[t] for t in TAGS]
    assert labels == align_labels(word_ids, ids, policy, task.b_to_i if policy == "all" else None)
    first_pieces = [p for p, w in enumerate(word_ids) if w is not None and (p == 0 or word_ids[p - 1] != w)]
    assert [labels[p] for p in first_pieces] == ids, "every word's first piece carries the word's label"
    # a model that predicts each word's label on every piece (and garbage elsewhere) gives back the tags
    predicted = [ids[w] if w is not None else 2 for w in word_ids]
    assert list(word_predictions(word_ids, predicted, len(SENTENCE))) == ids


def test_long_sentences_split_into_windows_of_whole_bpe_words(bpe):
    task = get_task("ncbi_disease").model_copy(update={"max_length": 16})
    words, tags = SENTENCE * 3, TAGS * 3
    encoded = encode_split(task, [TokenExample("s1", words, tags)], bpe)
    assert len(encoded) > 1 and encoded.truncated_examples == 0, "split: every word kept, in windows"
    covered = []
    for (_, start), word_ids in zip(encoded.origins, encoded.word_ids, strict=True):
        covered += sorted({start + w for w in word_ids if w is not None})
    assert covered == list(range(len(words))), "every word is in exactly one window"


def test_no_token_type_ids_reach_a_model_that_takes_none(tokenizer):
    """A BERT tokenizer makes token_type_ids; a ModernBERT classifier never receives them, a BERT one does."""
    task = get_task("ncbi_disease")
    encoded = encode_split(task, [TokenExample("s1", SENTENCE, TAGS)], tokenizer)
    batch = Batch.of(collator_for(task, tokenizer)(encoded.features))
    batch.inputs["token_type_ids"] = torch.zeros_like(batch.input_ids)  # as BERT tokenizers give them
    models = {}
    for name, arch in (("modernbert", modernbert_arch(layers=2, hidden=16)),
                       ("bert", ArchitectureConfig(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=16))):
        config = architecture_config(arch, tokenizer)
        config.num_labels = task.num_labels
        models[name] = AutoModelForTokenClassification.from_config(config)
    seen = {}
    models["modernbert"].register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    loss, _ = ClassifierModule(models["modernbert"])(batch)
    assert torch.isfinite(loss) and "input_ids" in seen and "token_type_ids" not in seen
    assert "token_type_ids" not in model_inputs(models["modernbert"], batch.inputs)
    assert "token_type_ids" in model_inputs(models["bert"], batch.inputs), "models that take them keep them"


@pytest.mark.parametrize("student_family", ["modernbert", "bert"])
def test_task_kd_from_a_modernbert_teacher_on_ner(student_family, bpe, tmp_path):
    """Hinton KD + PatientKD on a tiny NER task: ModernBERT teacher (BPE tokenizer), ModernBERT or BERT student."""
    task_file = write_token_task(tmp_path / "ner")
    base = save_modernbert(bpe, tmp_path / "base")
    teacher = save_teacher(base, get_task(str(task_file)), tmp_path / "teacher")
    if student_family == "modernbert":
        student = save_modernbert(bpe, tmp_path / "student", layers=2, seed=1)
    else:
        student = save_student(bpe, tmp_path / "student")
    out = tmp_path / "kd"
    recipe = kd_recipe(task_file, teacher, student, out, kd={"epochs": 1, "patient": {"gamma": 1.0}})
    run_kd(recipe)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["finished"] and "f1" in metrics["test"], metrics
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["soft"] > 0 and first["pkd"] > 0, "Hinton KD and PatientKD on the ModernBERT teacher's outputs"
