"""Task-agnostic distillation across tokenizers: text blocks both tokenizers read (by hand), a student of teacher
layers given a vocabulary of its own (by hand), the objective's word-level terms equal to the hand-checked losses of
`biodistil.losses.cross_tokenizer`, gradients that reach the student only, the pre-flight, and from the CLI a tiny
ModernBERT (byte-level BPE) teacher distilled into a BERT (WordPiece) student with hidden, relation and masked-LM
terms whose loss falls and whose export loads."""

import json

import pytest
import torch
from modernbert_fixtures import modernbert_arch, save_modernbert, train_bpe
from recipe_fixtures import RECIPES, data_root, needs_data
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, BertTokenizerFast

from biodistil.cli.main import main
from biodistil.config import ArchitectureConfig, MaskingConfig, ObjectiveConfig, TermConfig
from biodistil.data.batch import Batch
from biodistil.data.masking import MaskingVocabulary
from biodistil.data.shared_vocabulary import shared_vocabulary
from biodistil.data.text_blocks import AlignedTextCollate, build_text_dataset, pack_texts
from biodistil.data.token_alignment import membership, pooling_matrix
from biodistil.data.vocab import train_wordpiece
from biodistil.losses.cross_tokenizer import (
    shared_vocab_kl_loss,
    uld_loss,
    word_attention_kl_loss,
    word_hidden_mse_loss,
    word_relations_loss,
)
from biodistil.methods.masked_lm import MaskedLMModule, MaskSameWords
from biodistil.methods.objective import Objective
from biodistil.methods.word_units import WordUnits
from biodistil.models.features import FeatureRequest, extract_features
from biodistil.models.student import model_from_architecture, student_from_teacher_layers
from biodistil.models.vocab_transfer import VocabularyTransfer, transfer_vocabulary, vocabulary_pieces

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LINES = ["IL-2 induced p53-deficient cells in Müller glia (n=12).", "The café patients' TNF-α levels rose.",
         "BRCA1 mutation carriers; p53 and IL-2 pathways."] * 10


def wordpiece(tokens: list[str], lowercase: bool) -> BertTokenizerFast:
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(SPECIAL + tokens)}, do_lower_case=lowercase)


# ------------------------------------------------------------------------------------------ text blocks
def test_text_blocks_hold_a_block_of_student_tokens_and_keep_documents_apart() -> None:
    tokenizer = wordpiece(["a", "b", "c", "d", "e", "##x"], lowercase=True)
    lines = ["a b c", "d e", "", "a b c d e a b", "", "axxxxx"]
    # block 6 = [CLS] + 4 tokens + [SEP]: "a b c" + "d e" would be 5; the 7-token line is cut before its 5th word;
    # a word longer than the block is cut at a token
    assert list(pack_texts(iter(lines), tokenizer, 6)) == ["a b c", "d e", "a b c d", "e a b", "axxx", "xx"]


def test_text_blocks_are_cached_and_read_back(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    tokenizer = train_wordpiece(LINES, 120, lowercase=False, min_frequency=1)
    first = build_text_dataset([corpus], tokenizer, 32, cache_dir=tmp_path / "cache")
    again = build_text_dataset([corpus], tokenizer, 32, cache_dir=tmp_path / "cache")
    assert len(first) == len(again) > 1 and first[0]["text"] == again[0]["text"]
    assert all(len(tokenizer(row["text"])["input_ids"]) <= 32 for row in first)
    assert " ".join(row["text"] for row in first) == " ".join(LINES)  # every character of the corpus, in order


# ------------------------------------------------------------------------------------------ student vocabulary
def test_a_student_of_teacher_layers_takes_the_teachers_rows_for_its_own_vocabulary() -> None:
    teacher_tokenizer = wordpiece(["protein", "cell", "##s", "x", "##y", "##z", "##ase"], lowercase=True)
    student_tokenizer = wordpiece(["Protein", "cell", "##s", "xyz", "##ase"], lowercase=False)
    torch.manual_seed(0)
    teacher = model_from_architecture(ArchitectureConfig(num_layers=2, hidden_size=8, num_heads=2,
                                                         intermediate_size=16, max_position_embeddings=16),
                                      teacher_tokenizer)
    student = student_from_teacher_layers(teacher, [1])
    report = transfer_vocabulary(student, teacher, student_tokenizer, teacher_tokenizer)
    # special tokens by role, "Protein" through the teacher's lowercasing, "xyz" = mean of x, ##y, ##z
    assert vocabulary_pieces(student_tokenizer, teacher_tokenizer) == [[0], [1], [2], [3], [4], [5], [6], [7],
                                                                       [8, 9, 10], [11]]
    assert report == VocabularyTransfer(copied=8, averaged=1, unknown=1)
    rows, source = student.get_input_embeddings().weight, teacher.get_input_embeddings().weight
    assert rows.shape == (10, 8) and student.config.vocab_size == 10
    torch.testing.assert_close(rows[5], source[5])
    torch.testing.assert_close(rows[8], source[8:11].mean(0))
    bias, teacher_bias = student.get_output_embeddings().bias, teacher.get_output_embeddings().bias
    torch.testing.assert_close(bias[8], teacher_bias[8:11].mean())
    assert student.get_output_embeddings().weight is rows  # the decoder stays tied


def test_a_byte_level_teacher_gives_word_starts_their_space_mark(tmp_path) -> None:
    bpe = train_bpe(LINES, 300, tmp_path / "bpe")
    student_tokenizer = train_wordpiece(LINES, 120, lowercase=False, min_frequency=1)
    pieces = vocabulary_pieces(student_tokenizer, bpe)
    vocab = student_tokenizer.get_vocab()
    teacher_vocab = bpe.get_vocab()
    assert "IL" in teacher_vocab and pieces[vocab["IL"]] == [teacher_vocab["IL"]]  # the same string: copied
    for token in ("##s", "p53"):  # else a continuation piece without a space, a word start with "Ġ"
        assert token not in teacher_vocab
        text = token[2:] if token.startswith("##") else f" {token}"
        assert pieces[vocab[token]] == bpe(text, add_special_tokens=False)["input_ids"], token
    assert pieces[student_tokenizer.cls_token_id] == [bpe.cls_token_id]


# ------------------------------------------------------------------------------------------ the objective
TERMS = [TermConfig(loss="mlm"), TermConfig(loss="logit_kl", positions="masked"),
         TermConfig(loss="uld", positions="masked"), TermConfig(loss="hidden_mse"),
         TermConfig(loss="attention_kl", student_layer=-1, teacher_layer=-1),
         TermConfig(loss="minilm_relations", num_relation_heads=2)]


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    """A tiny ModernBERT teacher (BPE), a BERT student of another width (WordPiece), their objective, and a batch
    aligned and masked on both sides."""
    root = tmp_path_factory.mktemp("aligned")
    bpe = train_bpe(LINES, 300, root / "bpe")
    student_tokenizer = train_wordpiece(LINES, 150, lowercase=False, min_frequency=1)
    torch.manual_seed(0)
    teacher = model_from_architecture(modernbert_arch(layers=2, hidden=32, heads=2, window=4), bpe)
    student = model_from_architecture(ArchitectureConfig(num_layers=2, hidden_size=24, num_heads=2,
                                                         intermediate_size=48, max_position_embeddings=64,
                                                         dropout=0.0), student_tokenizer)
    vocabulary = shared_vocabulary(student_tokenizer, bpe, student.config.vocab_size, teacher.config.vocab_size)
    objective = Objective(ObjectiveConfig(temperature=2.0, terms=TERMS), student, teacher, vocabulary)
    collate = AlignedTextCollate(student_tokenizer, bpe, 48, 96)
    mask = MaskSameWords(MaskingVocabulary.from_tokenizer(student_tokenizer), MaskingVocabulary.from_tokenizer(bpe),
                         MaskingConfig(probability=0.5))
    batch = mask(collate([{"text": line} for line in LINES[:3]]), torch.Generator().manual_seed(0))
    return student, teacher, objective, batch


def test_the_batch_masks_the_same_words_on_both_sides(aligned) -> None:
    _, _, _, batch = aligned
    chosen = batch.alignment.chosen
    assert chosen.any() and not (chosen & ~batch.alignment.word_mask.bool()).any()
    units = WordUnits.of(batch.alignment)
    # the first token of each masked word on each side: as many rows on both sides, and labelled on the student's
    assert int(units.first_masked("student").sum()) == int(units.first_masked("teacher").sum()) == int(chosen.sum())
    assert (batch.labels[units.first_masked("student")] >= 0).all()


def test_the_objectives_word_terms_are_the_cross_tokenizer_losses(aligned) -> None:
    student, teacher, objective, batch = aligned
    module = MaskedLMModule(student, objective, teacher).eval()
    _, logs = module(batch)
    units = WordUnits.of(batch.alignment)
    request = FeatureRequest(hidden={-1}, logits=True, attentions={-1}, qkv={-1})
    with torch.no_grad():
        s = extract_features(student, batch.inputs, request, units.first_masked("student"))
        t = extract_features(teacher, {"input_ids": batch.teacher["input_ids"],
                                       "attention_mask": batch.teacher["attention_mask"]}, request,
                             units.first_masked("teacher"))
    width = units.num_units
    pools = pooling_matrix(batch.alignment.student_units, width), pooling_matrix(batch.alignment.teacher_units, width)
    members = membership(batch.alignment.student_units, width), membership(batch.alignment.teacher_units, width)
    projection = objective.projections["hidden_mse_sm1_tm1"]
    vocabulary = objective.vocabulary
    with torch.no_grad():
        expected = {
            "loss_hidden_mse": word_hidden_mse_loss(projection(s.hidden_at(-1)), t.hidden_at(-1), *pools,
                                                    batch.alignment.unit_mask),
            "loss_attention_kl": word_attention_kl_loss(s.attention_at(-1), t.attention_at(-1), *members,
                                                        batch.alignment.unit_mask),
            "loss_minilm_relations": word_relations_loss(s.qkv_at(-1), t.qkv_at(-1), *pools,
                                                         batch.alignment.unit_mask, 2),
            "loss_logit_kl": shared_vocab_kl_loss(s.logits.logits(), t.logits.logits(), vocabulary.student_index,
                                                  vocabulary.teacher_index, vocabulary.size, 2.0),
            "loss_uld": uld_loss(s.logits.logits(), t.logits.logits(), 2.0),
        }
    for name, value in expected.items():
        assert float(value) > 0, name
        torch.testing.assert_close(logs[name].float(), value.float(), rtol=1e-4, atol=1e-6, msg=name)


def test_the_terms_compute_the_same_whichever_runs_first(aligned) -> None:
    student, teacher, objective, batch = aligned
    reversed_objective = Objective(ObjectiveConfig(temperature=2.0, terms=TERMS[::-1]), student, teacher,
                                   objective.vocabulary)
    reversed_objective.load_state_dict(objective.state_dict())  # the same projection
    forward = MaskedLMModule(student, objective, teacher).eval()(batch)[1]
    backward = MaskedLMModule(student, reversed_objective, teacher).eval()(batch)[1]
    for name, value in forward.items():
        torch.testing.assert_close(backward[name], value, rtol=1e-5, atol=1e-7, msg=name)


def test_uld_on_one_tokenizer_compares_the_rows_at_its_positions(teacher_dir, tokenizer) -> None:
    teacher = AutoModelForMaskedLM.from_pretrained(teacher_dir).eval()
    student = student_from_teacher_layers(teacher, [0, 2]).eval()
    objective = Objective(ObjectiveConfig(temperature=1.0, terms=[TermConfig(loss="uld", positions="masked")]),
                          student, teacher)
    ids = tokenizer(["the protein kinase gene", "cell tumour"], padding=True, return_tensors="pt")
    labels = torch.full_like(ids["input_ids"], -100)
    labels[:, 1] = ids["input_ids"][:, 1]
    batch = Batch(dict(ids), labels)
    _, logs = MaskedLMModule(student, objective, teacher)(batch)
    masked = labels != -100
    with torch.no_grad():
        expected = uld_loss(student(**ids).logits[masked], teacher(**ids).logits[masked])
    torch.testing.assert_close(logs["loss_uld"], expected, rtol=1e-5, atol=1e-7)
    assert float(expected) > 0


def test_gradients_reach_the_student_and_its_projection_only(aligned) -> None:
    student, teacher, objective, batch = aligned
    module = MaskedLMModule(student, objective, teacher)
    student.zero_grad()
    loss, _ = module(batch)
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in student.bert.encoder.parameters())
    assert student.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert all(p.grad.abs().sum() > 0 for p in objective.projections.parameters())


# ------------------------------------------------------------------------------------------ from the CLI
@pytest.fixture(scope="module")
def bpe_teacher(tmp_path_factory, corpus_file):
    root = tmp_path_factory.mktemp("cross-cli")
    bpe = train_bpe(corpus_file.read_text().splitlines(), 400, root / "bpe")
    return root, save_modernbert(bpe, root / "teacher", dropout=0.0)


STUDENT = ["student.init=architecture", "student.tokenizer={vocab_size: 150, min_frequency: 1}",
           "student.architecture={model_type: bert, num_layers: 2, hidden_size: 24, num_heads: 2, "
           "intermediate_size: 48, max_position_embeddings: 64}"]
QUIET = ["train.batch_size=8", "train.warmup_steps=0", "train.save_every=0", "train.progress_bar=false",
         "train.tensorboard=false"]


def distill(root, teacher, corpus_file, out, *extra: str) -> int:
    recipe = root / "empty.yaml"
    recipe.write_text("# every setting on the command line\n")
    return main(["distill", str(recipe), f"teacher.name_or_path={teacher}", f"data.train=[{corpus_file}]",
                 "data.block_size=32", f"data.cache_dir={root / 'cache'}", *STUDENT, *QUIET, *extra, f"--out={out}"])


@pytest.mark.slow
def test_a_bpe_modernbert_teacher_distils_into_a_wordpiece_bert_student_from_the_cli(bpe_teacher, corpus_file,
                                                                                   tmp_path) -> None:
    root, teacher = bpe_teacher
    out = tmp_path / "run"
    terms = ("objective.terms=[{loss: mlm}, {loss: logit_kl, weight: 2.0, positions: masked}, "
             "{loss: uld, positions: masked}, {loss: hidden_mse}, {loss: minilm_relations, num_relation_heads: 2}]")
    assert distill(root, teacher, corpus_file, out, terms, "train.max_steps=40", "train.learning_rate=2e-3",
                   "train.log_every=2", "data.eval_fraction=0.05", "train.eval_every=20") == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in records if row["split"] == "train"]
    assert {"loss_logit_kl", "loss_uld", "loss_hidden_mse", "loss_minilm_relations", "loss_mlm"} <= set(train[0])
    first, last = sum(r["loss"] for r in train[:3]) / 3, sum(r["loss"] for r in train[-3:]) / 3
    assert last < first - 0.1, (first, last)
    assert any(row["split"] == "eval" and "loss_logit_kl" in row for row in records)  # held-out text blocks
    model = AutoModel.from_pretrained(out / "model")
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    assert model.config.model_type == "bert" and len(tokenizer) == 150 == model.config.vocab_size
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(out / "tokenizer").get_vocab()
    assert AutoModelForMaskedLM.from_pretrained(out / "model")(**tokenizer("the cell", return_tensors="pt")).logits \
        .shape[-1] == 150
    report = (out / "report.md").read_text()
    assert "Across tokenizers" in report and "strings both vocabularies name" in report


def test_the_pre_flight_names_each_refused_term_before_any_work(bpe_teacher, corpus_file, tmp_path, capsys) -> None:
    root, teacher = bpe_teacher
    terms = "objective.terms=[{loss: soft_ce}, {loss: logit_mse}, {loss: hidden_mse}]"
    assert distill(root, teacher, corpus_file, tmp_path / "run", terms, "train.max_steps=2") == 2
    error = capsys.readouterr().err
    assert "soft_ce: " in error and "logit_mse: " in error and "use logit_kl" in error and "hidden_mse" not in error
    assert not (tmp_path / "run").exists(), "refused before the run folder, the vocabulary or the corpus"


def test_teacher_cache_and_static_masks_are_refused_across_tokenizers(bpe_teacher, corpus_file, tmp_path,
                                                                      capsys) -> None:
    root, teacher = bpe_teacher
    assert distill(root, teacher, corpus_file, tmp_path / "run", "objective.terms=[{loss: hidden_mse}]",
                   "masking.duplication=2", "teacher_cache={}") == 2
    assert "teacher_cache is not supported across tokenizers" in capsys.readouterr().err


@pytest.mark.slow
@needs_data
def test_the_minilm_recipe_runs_a_few_steps_from_the_cli(tmp_path) -> None:
    """recipes/cross-tokenizer-minilm.yaml as written (the embedded minilm-l6 teacher, its layers 0, 2, 4, the recipe's
    terms) on the first lines of the corpus, with a small vocabulary and three steps."""
    out = tmp_path / "minilm"
    assert main(["distill", str(RECIPES / "cross-tokenizer-minilm.yaml"),
                 f"data.train=[{data_root() / 'corpus' / 'biomed.txt'}]", "data.max_lines=300", "data.block_size=64",
                 f"data.cache_dir={tmp_path / 'cache'}", "data.eval_fraction=0", "student.tokenizer.vocab_size=600",
                 "student.tokenizer.max_lines=300", "train.max_steps=3", "train.batch_size=4", "train.eval_every=0",
                 "train.save_every=0", "train.progress_bar=false", "train.tensorboard=false", f"--out={out}"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["result"]["steps"] == 3
    student = AutoModelForMaskedLM.from_pretrained(out / "model")
    assert (student.config.num_hidden_layers, student.config.hidden_size, student.config.vocab_size) == (3, 384, 600)
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    assert tokenizer.tokenize("Protein")[0].startswith("P"), "a cased vocabulary"
    assert "embeddings copied from the teacher's token" in (out / "report.md").read_text()


def test_a_pretrained_student_of_another_tokenizer_distils_across_tokenizers(bpe_teacher, corpus_file, tokenizer,
                                                                            tmp_path, capsys) -> None:
    root, teacher = bpe_teacher
    folder = tmp_path / "pretrained"
    torch.manual_seed(0)
    model_from_architecture(ArchitectureConfig(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32,
                                               max_position_embeddings=64), tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    pretrained = ["student.init=pretrained", f"student.name_or_path={folder}", "student.tokenizer=null",
                  "student.architecture=null", "objective.terms=[{loss: mlm}, {loss: hidden_cosine}]"]
    assert distill(root, teacher, corpus_file, tmp_path / "cached", *pretrained, "masking.duplication=2",
                   "teacher_cache={}") == 2
    assert "not supported across tokenizers" in capsys.readouterr().err
    assert distill(root, teacher, corpus_file, tmp_path / "run", *pretrained, "train.max_steps=3") == 0
    assert "Across tokenizers" in (tmp_path / "run" / "report.md").read_text()
    assert AutoTokenizer.from_pretrained(tmp_path / "run" / "model").get_vocab() == tokenizer.get_vocab()
