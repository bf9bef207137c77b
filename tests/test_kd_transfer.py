"""Transfer sets: shaping to the task, labels dropped / kept / mapped, the saved random set, the command."""

import json

import pytest
from kd_fixtures import write_pair_task

from biodistil.cli.main import main
from biodistil.data.formats import TextExample
from biodistil.errors import BiodistilError
from biodistil.kd.random_text import DEFAULT_STARTERS
from biodistil.kd.recipe import TransferConfig
from biodistil.kd.transfer import (
    build_transfer_set,
    fingerprint_examples,
    load_transfer_set,
    read_text_units,
    save_transfer_set,
    shape_for_task,
)
from biodistil.tasks.registry import get_task

BOOLQ = [
    {"question": "is the sky blue", "title": "Sky", "passage": "The sky is blue because of Rayleigh scattering.",
     "answer": True},
    {"question": "do cats bark", "title": "Cat", "passage": "Cats meow and purr; dogs bark at night.",
     "answer": False},
    {"question": "can fish fly", "title": "Flying fish", "passage": "Flying fish glide above the waves.",
     "answer": True},
]


@pytest.fixture()
def pair_task(tmp_path):
    return get_task(str(write_pair_task(tmp_path / "task")))


@pytest.fixture()
def boolq_file(tmp_path):
    path = tmp_path / "boolq.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in BOOLQ), encoding="utf-8")
    return path


def test_in_domain_set_drops_labels_unless_kept(pair_task):
    dropped = build_transfer_set(TransferConfig(), pair_task)
    assert len(dropped) == 48 and all(e.label is None and e.text_pair for e in dropped)
    kept = build_transfer_set(TransferConfig(keep_labels=True), pair_task)
    assert [e.label for e in kept[:2]] == ["yes", "no"]


def test_boolq_labels_map_into_the_task_and_unknown_labels_are_errors(pair_task, boolq_file):
    source = {"kind": "file", "format": "boolq_jsonl", "path": str(boolq_file)}
    kept = build_transfer_set(TransferConfig(source=source, keep_labels=True), pair_task)
    assert [(e.text, e.label) for e in kept] == [("is the sky blue", "yes"), ("do cats bark", "no"),
                                                 ("can fish fly", "yes")]
    dropped = build_transfer_set(TransferConfig(source=source, keep_labels=True, label_map={"no": None}), pair_task)
    assert [e.label for e in dropped] == ["yes", "yes"]
    with pytest.raises(BiodistilError, match="label 'yes' is not a label of task"):
        build_transfer_set(TransferConfig(source=source, keep_labels=True, label_map={"yes": "maybe"}), pair_task)


def test_shapes_follow_the_task(pair_task):
    singles = [TextExample(str(i), f"text {i}", None, None) for i in range(5)]
    pairs = shape_for_task(singles, pair_task, pairs=True)
    assert [(e.text, e.text_pair) for e in pairs] == [("text 0", "text 1"), ("text 2", "text 3")]
    joined = shape_for_task([TextExample("0", "q", "p", None)], pair_task, pairs=False)
    assert joined[0].text == "q p" and joined[0].text_pair is None
    token_task = get_task("ncbi_disease")
    assert shape_for_task([TextExample("0", "a b", "c", None)], token_task, pairs=False)[0].tokens == ["a", "b", "c"]


def test_text_source_is_split_into_sentences(tmp_path):
    path = tmp_path / "wiki.txt"
    path.write_text("First sentence here. Second one follows! third stays\n\nAnother paragraph.\n", encoding="utf-8")
    texts = [e.text for e in read_text_units(path, sentences=True, limit=None)]
    assert texts == ["First sentence here.", "Second one follows! third stays", "Another paragraph."]
    assert len(read_text_units(path, sentences=True, limit=2)) == 2


def test_saved_random_set_is_reproducible_and_uses_only_source_words(pair_task, boolq_file, tmp_path):
    cfg = TransferConfig(source={"kind": "file", "format": "boolq_jsonl", "path": str(boolq_file)},
                         random={"size": 30, "question_length": [2, 5], "passage_length": [4, 9], "seed": 7})
    first = build_transfer_set(cfg, pair_task)
    save_transfer_set(first, tmp_path / "set", {"kind": "random"})
    loaded = load_transfer_set(tmp_path / "set")
    assert loaded == first and len(loaded) == 30
    again = build_transfer_set(cfg, pair_task)
    assert fingerprint_examples(again) == json.loads((tmp_path / "set" / "transfer.json").read_text())["fingerprint"]
    other = build_transfer_set(cfg.model_copy(update={"random": cfg.random.model_copy(update={"seed": 8})}),
                               pair_task)
    assert fingerprint_examples(other) != fingerprint_examples(first)
    vocabulary = {word for row in BOOLQ for word in row["passage"].lower().split()}
    for example in loaded:
        starter, *question = example.text.split()
        assert starter in DEFAULT_STARTERS and set(question) <= vocabulary
        assert set(example.text_pair.split()) <= vocabulary and example.label is None


def test_transfer_command_builds_a_kd_recipes_set(pair_task, boolq_file, tmp_path):
    recipe = tmp_path / "kd.yaml"
    recipe.write_text(json.dumps({
        "teacher": {"name_or_path": "unused"}, "student": {"name_or_path": "unused"}, "kd": {"soft_loss": "sigmoid"},
        "task": {"name": str(tmp_path / "task" / "tiny_qa.yaml")},
        "transfer": {"source": {"kind": "file", "format": "boolq_jsonl", "path": str(boolq_file)},
                     "random": {"size": 12}}}), encoding="utf-8")
    assert main(["transfer", str(recipe), "transfer.random.seed=3", "--out", str(tmp_path / "out")]) == 0
    info = json.loads((tmp_path / "out" / "transfer_set" / "transfer.json").read_text())
    assert info["size"] == 12 and info["randomized"] and not info["labelled"]
    assert len(load_transfer_set(tmp_path / "out")) == 12
    assert main(["transfer", str(recipe), "transfer.sauce=1", "--out", str(tmp_path / "bad")]) == 2


def test_a_labelled_budget_keeps_the_labels_of_the_subset_fine_tuning_trains_on(pair_task, tmp_path):
    from kd_fixtures import write_token_task

    from biodistil.kd.transfer import is_labelled
    from biodistil.tasks.splits import read_split

    for task in (pair_task, get_task(str(write_token_task(tmp_path / "ner")))):
        budget = 10
        examples = build_transfer_set(TransferConfig(keep_labels=True, labelled=budget), task)
        whole = task.load_split("train", None)
        assert [e.id for e in examples] == [e.id for e in whole], "the whole training split, in file order"
        labelled = [e.id for e in examples if is_labelled(e)]
        assert labelled == [e.id for e in read_split(task, "train", None, None, budget)], \
            "the same seeded subset as task.train_examples"
        assert len(labelled) == budget


def test_a_labelled_budget_beside_other_text_adds_the_budget_and_drops_the_texts_labels(tmp_path):
    from kd_fixtures import write_token_task

    from biodistil.kd.transfer import describe_transfer, is_labelled
    from biodistil.tasks.splits import read_split

    task = get_task(str(write_token_task(tmp_path / "ner")))
    text = tmp_path / "unseen.txt"
    text.write_text("Mutations in BRCA1 cause cancer.\n\nThe patient had fever (≥38 °C) today.\n", encoding="utf-8")
    cfg = TransferConfig(keep_labels=True, labelled=4, source={"kind": "text", "path": str(text)})
    examples = build_transfer_set(cfg, task)
    budget = read_split(task, "train", None, None, 4)
    assert [e.id for e in examples[:4]] == [e.id for e in budget] and all(map(is_labelled, examples[:4]))
    assert [e.tags for e in examples[:4]] == [e.tags for e in budget], "the budget keeps its gold tags"
    assert [e.tokens for e in examples[4:]] == [["Mutations", "in", "BRCA1", "cause", "cancer."],
                                                ["The", "patient", "had", "fever", "(≥38", "°C)", "today."]]
    assert not any(map(is_labelled, examples[4:])) and len({e.id for e in examples}) == len(examples)
    assert describe_transfer(cfg) == f"text {text} + a labelled budget of 4 training examples"

    randomized = TransferConfig(keep_labels=True, labelled=4, source={"kind": "text", "path": str(text)},
                                random={"size": 6, "passage_length": [3, 5]})
    examples = build_transfer_set(randomized, task)
    assert len(examples) == 10 and sum(map(is_labelled, examples)) == 4
    words = {"mutations", "in", "brca1", "cause", "cancer.", "the", "patient", "had", "fever", "(≥38", "°c)", "today."}
    assert all(set(e.tokens) <= words and 3 <= len(e.tokens) <= 5 for e in examples[4:]), "the text's unigrams"


def test_a_labelled_budget_needs_the_training_split_and_labels():
    with pytest.raises(ValueError, match="set keep_labels: true"):
        TransferConfig(labelled=5)
    with pytest.raises(ValueError, match="whole training split"):
        TransferConfig(keep_labels=True, labelled=5, source={"kind": "in_domain", "split": "dev"})
    with pytest.raises(ValueError, match="whole training split"):
        TransferConfig(keep_labels=True, labelled=5, source={"kind": "in_domain", "max_examples": 20})
