"""Task-agnostic distillation from several teachers sharing the student's tokenizer: the mixture and per-teacher
logit terms against hand-computed values, one layer term per (teacher, layer map) with its own projection, gradients
reaching the student only, and whole runs: online teachers, cached teachers resumed, caches kept per teacher."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from distill_fixtures import cache_recipe, distill_recipe
from numerics import CLOSE, perturbed
from safetensors.torch import load_file
from test_methods_masked_lm import masked_batch

from biodistil.config import ArchitectureConfig, DistillRecipe, ObjectiveConfig, TermConfig, validate_recipe
from biodistil.errors import BiodistilError
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.methods.task_agnostic import run_cache_teacher, run_distill
from biodistil.models.student import model_from_architecture

T = 2.0


@pytest.fixture(scope="module")
def second_teacher_dir(tmp_path_factory, tokenizer):
    """A 2-layer, 48-wide BERT with the first teacher's tokenizer (random weights): another depth and width."""
    torch.manual_seed(5)
    model = model_from_architecture(ArchitectureConfig(num_layers=2, hidden_size=48, num_heads=2,
                                                       intermediate_size=96, max_position_embeddings=64), tokenizer)
    folder = tmp_path_factory.mktemp("teacher2")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def student_of(tokenizer):
    torch.manual_seed(1)
    return perturbed(model_from_architecture(ArchitectureConfig(
        num_layers=2, hidden_size=16, num_heads=2, intermediate_size=32, max_position_embeddings=64), tokenizer), 3)


def two_teachers(teacher_dir, second_teacher_dir):
    from transformers import AutoModelForMaskedLM

    return [AutoModelForMaskedLM.from_pretrained(folder).eval() for folder in (teacher_dir, second_teacher_dir)]


def objective(combine="mixture", confidence=False):
    return ObjectiveConfig(temperature=T, combine=combine, confidence=confidence, terms=[
        TermConfig(loss="logit_kl", weight=5.0), TermConfig(loss="hidden_mse", layer_map="uniform")])


def logits_and_states(model, batch):
    with torch.no_grad():
        out = model(**batch.inputs, output_hidden_states=True)
    real = batch.attention_mask.bool()
    return out.logits[real].double(), out.hidden_states


def hidden_mse_by_hand(obj, term, real, student_states, teacher_states):
    """Σ_l MSE(h_S^l·W_l, h_T^g(l)) over the real tokens, each projection the objective's own for this teacher."""
    total = 0.0
    for s, t in term.pairs:
        with torch.no_grad():
            projected = obj.project(term, s, t, student_states[s])
        total = total + F.mse_loss(projected[real], teacher_states[t][real])
    return float(total)


def kl_by_hand(teacher_probabilities, student_logits):
    log_q = F.log_softmax(student_logits / T, dim=-1)
    p = teacher_probabilities
    return float(T * T * (p * (p.clamp_min(1e-30).log() - log_q)).sum(-1).mean())


def test_the_mixture_and_one_layer_term_per_teacher_equal_their_hand_computed_values(
        tokenizer, teacher_dir, second_teacher_dir):
    teachers = two_teachers(teacher_dir, second_teacher_dir)
    student = student_of(tokenizer).eval()
    obj = Objective(objective(), student, teachers, teacher_weights=(0.25, 0.75))
    module = MaskedLMModule(student, obj, [_online(teachers[0], 0), _online(teachers[1], 1)])
    batch = masked_batch(tokenizer)
    loss, logs = module(batch)
    real = batch.attention_mask.bool()
    z_s, states_s = logits_and_states(student, batch)
    (z_1, states_1), (z_2, states_2) = (logits_and_states(teacher, batch) for teacher in teachers)
    mixture = 0.25 * F.softmax(z_1 / T, -1) + 0.75 * F.softmax(z_2 / T, -1)
    assert float(logs["loss_logit_kl"]) == pytest.approx(kl_by_hand(mixture, z_s), **CLOSE)
    hidden = [term for term in obj.terms if term.spec.reads == "hidden"]
    assert [(term.name, term.teacher, term.pairs) for term in hidden] == [
        ("loss_hidden_mse@0", 0, ((1, 2), (2, 4))), ("loss_hidden_mse@1", 1, ((1, 1), (2, 2)))]
    assert {key for key in obj.projections} == {"hidden_mse_s1_t2", "hidden_mse_s2_t4", "hidden_mse_s1_t1_k1",
                                                "hidden_mse_s2_t2_k1"}, "each teacher's pairs have their own W_l"
    by_hand = [hidden_mse_by_hand(obj, hidden[0], real, states_s, states_1),
               hidden_mse_by_hand(obj, hidden[1], real, states_s, states_2)]
    assert [float(logs["loss_hidden_mse@0"]), float(logs["loss_hidden_mse@1"])] == pytest.approx(by_hand, **CLOSE)
    expected = 5.0 * kl_by_hand(mixture, z_s) + 0.25 * by_hand[0] + 0.75 * by_hand[1]
    assert float(loss.detach()) == pytest.approx(expected, **CLOSE)
    assert obj.teacher_request(0).hidden == {2, 4} and obj.teacher_request(1).hidden == {1, 2}
    assert obj.teacher_request(0).logits and obj.teacher_request(1).logits, "both teachers give logits to mix"


def test_per_teacher_sums_one_kl_per_teacher_weighted_by_its_share(tokenizer, teacher_dir, second_teacher_dir):
    teachers = two_teachers(teacher_dir, second_teacher_dir)
    student = student_of(tokenizer).eval()
    obj = Objective(objective("per_teacher"), student, teachers, teacher_weights=(0.25, 0.75))
    module = MaskedLMModule(student, obj, [_online(teachers[0], 0), _online(teachers[1], 1)])
    batch = masked_batch(tokenizer)
    loss, logs = module(batch)
    z_s, _ = logits_and_states(student, batch)
    kls = [kl_by_hand(F.softmax(logits_and_states(teacher, batch)[0] / T, -1), z_s) for teacher in teachers]
    assert [float(logs["loss_logit_kl@0"]), float(logs["loss_logit_kl@1"])] == pytest.approx(kls, **CLOSE)
    hidden = float(logs["loss_hidden_mse@0"]) * 0.25 + float(logs["loss_hidden_mse@1"]) * 0.75
    assert float(loss.detach()) == pytest.approx(5.0 * (0.25 * kls[0] + 0.75 * kls[1]) + hidden, **CLOSE)


def test_confidence_weighs_each_teacher_per_position_by_the_original_token_or_its_certainty(
        tokenizer, teacher_dir, second_teacher_dir):
    teachers = two_teachers(teacher_dir, second_teacher_dir)
    perturbed(teachers[1], seed=7, scale=1.0)  # a sharper teacher: confidences that differ from the other's
    student = student_of(tokenizer).eval()
    obj = Objective(objective(confidence=True), student, teachers, teacher_weights=(0.5, 0.5))
    module = MaskedLMModule(student, obj, [_online(teachers[0], 0), _online(teachers[1], 1)])
    batch = masked_batch(tokenizer)
    _, logs = module(batch)
    real = batch.attention_mask.bool()
    labels = batch.labels[real]
    z_s, _ = logits_and_states(student, batch)
    probabilities, confidences = [], []
    for teacher in teachers:
        z = logits_and_states(teacher, batch)[0]
        p1 = F.softmax(z, -1)
        gold = p1.gather(-1, labels.clamp_min(0)[:, None]).squeeze(-1)
        certainty = torch.exp((p1 * p1.log()).sum(-1))
        confidences.append(torch.where(labels != -100, gold, certainty))
        probabilities.append(F.softmax(z / T, -1))
    weights = torch.stack(confidences) / torch.stack(confidences).sum(0)
    mixture = weights[0, :, None] * probabilities[0] + weights[1, :, None] * probabilities[1]
    assert float(logs["loss_logit_kl"]) == pytest.approx(kl_by_hand(mixture, z_s), **CLOSE)
    plain = 0.5 * probabilities[0] + 0.5 * probabilities[1]
    assert abs(kl_by_hand(mixture, z_s) - kl_by_hand(plain, z_s)) > 0.01, "the weighting changes the target"


@pytest.mark.parametrize(("combine", "confidence"), [("mixture", False), ("mixture", True), ("per_teacher", False)])
def test_the_same_teacher_options_give_the_same_loss_and_logs_in_distill_and_kd(
        tokenizer, teacher_dir, second_teacher_dir, combine, confidence):
    """One batch, one meaning: distill's logit_kl at every real token and kd's Hinton soft term on those token rows
    read as examples (the original token as the gold label, -100 where unmasked) give one loss and per-teacher logs."""
    from biodistil.data.batch import Batch
    from biodistil.kd.objective import KDObjective
    from biodistil.kd.recipe import KDOptions
    from biodistil.models.features import classifier_features
    from biodistil.tasks.registry import get_task

    teachers = two_teachers(teacher_dir, second_teacher_dir)
    perturbed(teachers[1], seed=7, scale=1.0)  # confidences that differ between the teachers
    student = student_of(tokenizer).eval()
    options = {"temperature": T, "combine": combine, "confidence": confidence}
    distill = Objective(ObjectiveConfig(terms=[TermConfig(loss="logit_kl", weight=5.0)], **options), student,
                        teachers, teacher_weights=(0.25, 0.75))
    batch = masked_batch(tokenizer)
    with torch.no_grad():
        loss, logs = MaskedLMModule(student, distill, [_online(teachers[0], 0), _online(teachers[1], 1)])(batch)
    rows = [logits_and_states(model, batch)[0].float() for model in (student, *teachers)]
    real = batch.attention_mask.bool()
    kd = KDObjective(KDOptions(alpha=5.0, **options), get_task("bioasq"), teacher_weights=(0.25, 0.75))
    examples = Batch({"attention_mask": torch.ones(len(rows[0]), 1, dtype=torch.long)}, batch.labels[real])
    kd_loss, kd_logs = kd(classifier_features(rows[0], {}, 1), [classifier_features(z, {}, 1) for z in rows[1:]],
                          examples)
    assert float(kd_loss) == pytest.approx(float(loss), rel=1e-4)
    named = {name.replace("loss_logit_kl", "soft"): float(value) for name, value in logs.items()}
    assert named.keys() == kd_logs.keys() == ({"soft", "soft@0", "soft@1"} if combine == "per_teacher" else {"soft"})
    assert named == pytest.approx({name: float(value) for name, value in kd_logs.items()}, rel=1e-4)


def test_both_recipes_declare_the_teacher_options_once_and_refuse_confidence_without_a_mixture_alike():
    from biodistil.config import TeachersConfig
    from biodistil.kd.recipe import KDOptions

    assert issubclass(ObjectiveConfig, TeachersConfig) and issubclass(KDOptions, TeachersConfig)
    for options, section in ((objective("per_teacher", True), "objective"),
                             (KDOptions(combine="per_teacher", confidence=True), "kd")):
        for several in (True, False):
            with pytest.raises(ValueError, match=rf"{section}\.confidence weighs several teachers' shares"):
                options.check_teachers(several, section)
        options.model_copy(update={"combine": "mixture"}).check_teachers(True, section)


def test_gradients_reach_the_student_and_each_teachers_projections_never_a_teacher(
        tokenizer, teacher_dir, second_teacher_dir):
    teachers = two_teachers(teacher_dir, second_teacher_dir)
    student = student_of(tokenizer)
    obj = Objective(objective(), student, teachers, teacher_weights=(0.5, 0.5))
    module = MaskedLMModule(student, obj, [_online(teachers[0], 0), _online(teachers[1], 1)])
    loss, _ = module(masked_batch(tokenizer))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in obj.projections.parameters())
    assert student.get_input_embeddings().weight.grad.abs().sum() > 0
    assert all(p.grad is None for teacher in teachers for p in teacher.parameters())
    assert all(not p.requires_grad for teacher in teachers for p in teacher.parameters())
    assert {id(p) for p in module.parameters()}.isdisjoint(
        id(p) for teacher in teachers for p in teacher.parameters()), "no teacher is trained or checkpointed"


def _online(model, slot):
    from biodistil.teachers.signal import OnlineTeacher

    return OnlineTeacher(model, slot=slot)


def several(recipe: DistillRecipe, second, **objective) -> DistillRecipe:
    raw = recipe.model_dump(mode="json")
    first = raw.pop("teacher")
    raw["teachers"] = [first, {**first, "name_or_path": str(second), "weight": 3.0}]
    raw["objective"].update(objective)
    return validate_recipe(DistillRecipe, raw)


def test_recipes_spell_several_teachers_one_way_and_refuse_what_cannot_be_mixed(
        tmp_path, teacher_dir, second_teacher_dir, corpus_file):
    recipe = several(distill_recipe(teacher_dir, corpus_file, tmp_path / "run"), second_teacher_dir)
    assert recipe.teacher_weights == [0.25, 0.75] and recipe.teacher is None
    raw = recipe.model_dump(mode="json")
    with pytest.raises(BiodistilError, match="not both"):
        validate_recipe(DistillRecipe, {**raw, "teacher": {"name_or_path": str(teacher_dir)}})
    with pytest.raises(BiodistilError, match=r"objective\.confidence .* give teachers"):
        validate_recipe(DistillRecipe, {**distill_recipe(teacher_dir, corpus_file, tmp_path / "one").model_dump(
            mode="json"), "objective": {**raw["objective"], "confidence": True}})
    cached = cache_recipe(teacher_dir, corpus_file, tmp_path).model_dump(mode="json")
    cached["objective"]["terms"] = [{"loss": "logit_kl", "positions": "masked"}]
    with pytest.raises(BiodistilError, match="top-k logits, not whole rows to mix"):
        several(validate_recipe(DistillRecipe, cached), second_teacher_dir)
    assert several(validate_recipe(DistillRecipe, cached), second_teacher_dir, combine="per_teacher").teachers


LINES = ["IL-2 induced p53-deficient cells in Müller glia (n=12).", "The café patients' TNF-α levels rose.",
         "BRCA1 mutation carriers; p53 and IL-2 pathways (±SD)."] * 10


@pytest.fixture(scope="module")
def three_tokenizers(tmp_path_factory):
    """A cased WordPiece student, an uncased WordPiece teacher with another vocabulary and a byte-level BPE teacher
    (ModernBERT's convention), with a tiny model each (the teachers without dropout)."""
    from modernbert_fixtures import modernbert_arch

    from biodistil.data.synthetic import train_bpe
    from biodistil.data.vocab import train_wordpiece

    root = tmp_path_factory.mktemp("three")
    student_tokenizer = train_wordpiece(LINES, 150, lowercase=False, min_frequency=1)
    uncased = train_wordpiece(LINES, 120, lowercase=True, min_frequency=1)
    bpe = train_bpe(LINES, 300, root / "bpe")
    torch.manual_seed(0)
    teachers = [model_from_architecture(ArchitectureConfig(num_layers=2, hidden_size=32, num_heads=2,
                                                           intermediate_size=64, max_position_embeddings=128,
                                                           dropout=0.0), uncased).eval(),
                model_from_architecture(modernbert_arch(layers=2, hidden=32, heads=2, window=4), bpe).eval()]
    student = model_from_architecture(ArchitectureConfig(num_layers=2, hidden_size=24, num_heads=2,
                                                         intermediate_size=48, max_position_embeddings=64,
                                                         dropout=0.0), student_tokenizer).eval()
    return student_tokenizer, [uncased, bpe], teachers, student


def aligned_batch(student_tokenizer, tokenizers, seed=0):
    from biodistil.config import MaskingConfig
    from biodistil.data.masking import MaskingVocabulary
    from biodistil.data.text_blocks import AlignedTextCollate
    from biodistil.methods.masked_lm import MaskSameWords

    collate = AlignedTextCollate(student_tokenizer, tokenizers[0], 48, 96,
                                 more_teachers=tuple((own, 96) for own in tokenizers[1:]))
    mask = MaskSameWords(MaskingVocabulary.from_tokenizer(student_tokenizer),
                         MaskingVocabulary.from_tokenizer(tokenizers[0]),
                         MaskingConfig(probability=0.5, random_ratio=0.0),  # no random tokens: sides comparable
                         [MaskingVocabulary.from_tokenizer(own) for own in tokenizers[1:]])
    return mask(collate([{"text": line} for line in LINES[:3]]), torch.Generator().manual_seed(seed))


def spelled(tokenizer, ids) -> str:
    """A word as a side's tokens spell it, compared without case, accents or spaces."""
    import unicodedata

    text = unicodedata.normalize("NFD", tokenizer.decode(ids).replace(" ", "").replace("##", "").lower())
    return "".join(c for c in text if unicodedata.category(c) != "Mn")


def test_several_tokenizers_share_the_words_every_side_holds_whole_and_mask_the_same_ones(three_tokenizers):
    from biodistil.data.token_alignment import align_texts
    from biodistil.methods.masked_lm import teacher_alignment
    from biodistil.methods.word_units import WordUnits

    student_tokenizer, tokenizers, _, _ = three_tokenizers
    together = align_texts(LINES[:3], student_tokenizer, tokenizers[0], more_teachers=[(tokenizers[1], None)])
    for index, text in enumerate(LINES[:3]):
        pairwise = [align_texts([text], student_tokenizer, own).alignments[0] for own in tokenizers]
        shared = set(together.alignments[index].spans) - {None}
        assert shared == set.intersection(*(set(a.spans) - {None} for a in pairwise)), text
        assert shared < set(pairwise[0].spans) or shared < set(pairwise[1].spans), "a word one side splits is out"
    plain = aligned_batch(student_tokenizer, tokenizers)
    batch = aligned_batch(student_tokenizer, tokenizers)  # the same draw: `plain` keeps the unmasked ids below
    chosen = batch.alignment.chosen
    assert chosen.any() and not (chosen & ~batch.alignment.word_mask.bool()).any()
    from biodistil.data.text_blocks import AlignedTextCollate

    original = AlignedTextCollate(student_tokenizer, tokenizers[0], 48, 96, more_teachers=((tokenizers[1], 96),))(
        [{"text": line} for line in LINES[:3]])
    sides = [(student_tokenizer, original.input_ids, batch.alignment.student_units),
             (tokenizers[0], original.payload(0)["input_ids"], batch.alignment.teacher_units),
             (tokenizers[1], original.payload(1)["input_ids"], batch.payload(1)["unit_ids"])]
    words = 0
    for row, unit in chosen.nonzero().tolist():
        texts = {spelled(own, ids[row][units[row] == unit].tolist()) for own, ids, units in sides}
        assert len(texts) == 1, texts  # the masked word's tokens spell the same word on every side
        words += 1
    assert words == int(chosen.sum()) > 0
    for slot in (0, 1):
        units = WordUnits.of(teacher_alignment(batch, slot))
        assert int(units.first_masked("teacher").sum()) == int(chosen.sum())
    assert torch.equal(plain.alignment.chosen, chosen)
    assert batch.payload(1)["unit_ids"].shape == batch.payload(1)["input_ids"].shape


def test_the_same_teacher_twice_across_tokenizers_teaches_what_it_teaches_alone(three_tokenizers):
    from biodistil.data.shared_vocabulary import shared_vocabulary

    student_tokenizer, tokenizers, teachers, student = three_tokenizers
    bpe, model = tokenizers[1], teachers[1]
    terms = ObjectiveConfig(temperature=2.0, combine="per_teacher", terms=[
        TermConfig(loss="logit_kl", positions="masked"), TermConfig(loss="hidden_mse"),
        TermConfig(loss="attention_kl", student_layer=-1, teacher_layer=-1)])
    vocabulary = shared_vocabulary(student_tokenizer, bpe, student.config.vocab_size, model.config.vocab_size)
    alone = MaskedLMModule(student, Objective(terms, student, model, vocabulary), model)
    twice = MaskedLMModule(student, Objective(terms, student, [model, model], [vocabulary, vocabulary],
                                              teacher_weights=(0.5, 0.5)), [_online(model, 0), _online(model, 1)])
    assert {key.removesuffix("_k1") for key in twice.objective.projections} == set(alone.objective.projections)
    for key, projection in twice.objective.projections.items():  # each teacher's W_l the same as alone's
        projection.load_state_dict(alone.objective.projections[key.removesuffix("_k1")].state_dict())
    batch_two = aligned_batch(student_tokenizer, [bpe, bpe])
    batch_one = aligned_batch(student_tokenizer, [bpe])
    assert torch.equal(batch_two.alignment.chosen, batch_one.alignment.chosen)
    loss_alone, logs_alone = alone(batch_one)
    loss_twice, logs_twice = twice(batch_two)
    for name in ("loss_logit_kl", "loss_hidden_mse", "loss_attention_kl"):
        assert float(logs_alone[name]) > 1e-3, name
        for k in (0, 1):
            assert float(logs_twice[f"{name}@{k}"]) == pytest.approx(float(logs_alone[name]), **CLOSE), (name, k)
    assert float(loss_twice.detach()) == pytest.approx(float(loss_alone.detach()), **CLOSE)


def test_teachers_of_several_vocabularies_are_not_mixed(tmp_path, teacher_dir, corpus_file, three_tokenizers):
    _, tokenizers, teachers, _ = three_tokenizers
    folder = tmp_path / "bpe-teacher"
    teachers[1].save_pretrained(folder)
    tokenizers[1].save_pretrained(folder)
    recipe = several(distill_recipe(teacher_dir, corpus_file, tmp_path / "run"), folder)
    with pytest.raises(BiodistilError, match=r"teachers\[1\] \(.*bpe-teacher\): .*logit_kl: positions: all"):
        run_distill(recipe)  # the pre-flight of each teacher's tokenizer pair, the teacher named
    raw = recipe.model_dump(mode="json")
    raw["objective"]["terms"][1]["positions"] = "masked"
    with pytest.raises(BiodistilError, match=r"would mix several teachers' vocabularies.*combine: per_teacher"):
        run_distill(validate_recipe(DistillRecipe, raw))
    assert not (tmp_path / "run" / "model").exists()


@pytest.mark.slow
def test_a_wordpiece_and_a_bpe_teacher_distil_into_one_student_across_tokenizers(
        tmp_path, teacher_dir, corpus_file, three_tokenizers):
    from modernbert_fixtures import save_modernbert

    from biodistil.data.synthetic import train_bpe

    bpe = train_bpe(corpus_file.read_text().splitlines(), 400, tmp_path / "bpe")
    other = save_modernbert(bpe, tmp_path / "bpe-teacher", dropout=0.0)
    out = tmp_path / "run"
    recipe = several(distill_recipe(teacher_dir, corpus_file, out, max_steps=30), other, combine="per_teacher")
    raw = recipe.model_dump(mode="json")
    raw["objective"]["terms"] = [{"loss": "mlm"}, {"loss": "hidden_mse", "weight": 5.0},
                                 {"loss": "minilm_relations", "num_relation_heads": 2}]
    run_distill(validate_recipe(DistillRecipe, raw))
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert {"loss_hidden_mse@0", "loss_hidden_mse@1", "loss_minilm_relations@0", "loss_minilm_relations@1"} <= set(
        train[0])
    first, last = (sum(r["loss"] for r in rows) / 3 for rows in (train[:3], train[-3:]))
    assert last < first, (first, last)
    report = (out / "report.md").read_text()
    assert "teachers 200, 400" in report and "its own: the words every side shares" in report


@pytest.mark.slow
def test_two_online_teachers_lower_the_loss_and_the_report_names_both(
        tmp_path, teacher_dir, second_teacher_dir, corpus_file):
    out = tmp_path / "run"
    run_distill(several(distill_recipe(teacher_dir, corpus_file, out, max_steps=30), second_teacher_dir))
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    assert {"loss_logit_kl", "loss_hidden_cosine@0", "loss_hidden_cosine@1"} <= set(train[-1])
    report = (out / "report.md").read_text()
    assert str(teacher_dir) in report and str(second_teacher_dir) in report and "λ = 0.75" in report
    weights = load_file(str(out / "model" / "model.safetensors"))
    assert not [key for key in weights if "projection" in key]


@pytest.mark.slow
def test_two_cached_teachers_resume_exactly_and_keep_their_own_caches(
        tmp_path, teacher_dir, second_teacher_dir, corpus_file):
    one = cache_recipe(teacher_dir, corpus_file, tmp_path, out="one", max_steps=4)
    run_distill(one)
    stamps = {path: path.stat().st_mtime_ns for path in (tmp_path / "cache").rglob("shard-*.arrow")}
    assert stamps
    full = several(cache_recipe(teacher_dir, corpus_file, tmp_path, out="full", max_steps=20), second_teacher_dir,
                   combine="per_teacher")
    run_cache_teacher(full)  # `biodistil cache-teacher`: each teacher's cache, the first one's only checked
    run_distill(full)
    assert all(path.stat().st_mtime_ns == stamp for path, stamp in stamps.items()), "the first cache's shards stay"
    caches = {path.parents[1] for path in (tmp_path / "cache").rglob("shard-*.arrow")}
    assert len(caches) == 2, "the second teacher has a cache of its own"
    cut = several(cache_recipe(teacher_dir, corpus_file, tmp_path, out="cut", max_steps=20), second_teacher_dir,
                  combine="per_teacher")
    run_distill(cut, stop_after=10)
    run_distill(cut, resume=True)
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    report = (tmp_path / "full" / "report.md").read_text()
    assert report.count("Teacher cache") == 2 and report.count(" 0 shards built here") == 2, "both were built before"


def test_a_teacher_without_an_mlm_head_teaches_the_layer_terms_only_and_the_table_says_so(
        tmp_path, tokenizer, teacher_dir, second_teacher_dir):
    from transformers import AutoModel

    from biodistil.models.loading import load_masked_lm

    folder = tmp_path / "encoder-only"  # like minilm-l6 and mpnet-base: an encoder without its MLM head
    AutoModel.from_pretrained(teacher_dir).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    teachers = [load_masked_lm(str(folder), "float32").eval(), two_teachers(teacher_dir, second_teacher_dir)[1]]
    student = student_of(tokenizer).eval()
    obj = Objective(objective(), student, teachers, teacher_weights=(0.25, 0.75))
    rows = obj.contributions()
    assert rows[0]["terms"]["logit_kl"].startswith("— no trained MLM head")
    assert rows[1]["terms"]["logit_kl"] == "mixture of softmax probabilities (weight 1.00)"
    assert rows[0]["terms"]["hidden_mse"] == "its own term × 0.25 (own projections)"
    assert not obj.teacher_request(0).logits and obj.teacher_request(1).logits
    module = MaskedLMModule(student, obj, [_online(teachers[0], 0), _online(teachers[1], 1)])
    batch = masked_batch(tokenizer)
    _, logs = module(batch)
    z_s, _ = logits_and_states(student, batch)
    alone = F.softmax(logits_and_states(teachers[1], batch)[0] / T, -1)
    assert float(logs["loss_logit_kl"]) == pytest.approx(kl_by_hand(alone, z_s), **CLOSE)
    per_teacher = Objective(objective("per_teacher"), student, teachers, teacher_weights=(0.25, 0.75))
    assert [t.name for t in per_teacher.terms if t.spec.reads == "logits"] == ["loss_logit_kl@1"]
    assert [t.cfg.weight for t in per_teacher.terms if t.spec.reads == "logits"] == [5.0]
    with pytest.raises(BiodistilError, match="no trained MLM head"):
        Objective(objective(), student, [teachers[0], teachers[0]], teacher_weights=(0.5, 0.5))


def test_the_throughput_bench_measures_two_teachers_against_one(tmp_path, monkeypatch):
    """`bench/throughput.py --teachers 2` at tiny shapes: each teacher mode's twin with two teachers runs, and the
    costs it reports are the ratios of its own per-round rates."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import throughput

    args = throughput.parse(["--teachers", "2", "--teacher-layers", "2", "--hidden", "32", "--heads", "2", "--vocab",
                             "300", "--seq", "16", "--batch", "2", "--repeats", "1", "--warmup", "0", "--compile",
                             "false", "--device", "cpu", "--modes", "mlm", "live-masked", "cache-top-k"])
    result = throughput.measure(args)
    assert set(result["tokens_per_s"]) == {"mlm", "live-masked", "cache-top-k", "live-masked-x2", "cache-top-k-x2",
                                           "forward-2"}
    rates = result["tokens_per_s"]
    costs = result["two_teachers"]
    assert set(costs) == {"live-masked-x2", "cache-top-k-x2"} and "two_over_one_plus_forward" in costs["live-masked-x2"]
    assert costs["cache-top-k-x2"]["two_over_one"] == pytest.approx(rates["cache-top-k"] / rates["cache-top-k-x2"],
                                                                    rel=0.01)


def test_mixed_rows_form_the_mixture_a_chunk_at_a_time_as_the_dense_mixture(monkeypatch):
    from biodistil.losses import distillation
    from biodistil.losses.distillation import linear_soft_kl_loss, soft_kl_loss
    from biodistil.losses.multi_teacher import MixedRows

    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(shape, generator=generator) for shape in ((7, 5), (11, 5), (11,)))
    dense = 3 * torch.randn(7, 11, generator=generator)
    shares = torch.tensor([[0.2] * 7, [0.8] * 7])
    shares[:, 3] = torch.tensor([0.9, 0.1])
    mixed = MixedRows(((x, weight, bias), dense), shares, 2.0)
    p = shares[0, :, None] * F.softmax((x @ weight.T + bias) / 2, -1) + shares[1, :, None] * F.softmax(dense / 2, -1)
    assert torch.allclose(mixed.logits(), 2 * p.log(), atol=1e-5)
    rows = torch.tensor([True, False, True, True, False, False, True])
    assert torch.allclose(mixed.select(rows).logits(), 2 * p[rows].log(), atol=1e-5)
    student = torch.randn(7, 11, generator=generator)
    by_hand = 4 * (p * (p.log() - F.log_softmax(student / 2, -1))).sum(-1).mean()
    monkeypatch.setattr(distillation, "KL_CHUNK_ELEMENTS", 22)  # chunks of 2 rows: the mixture formed per chunk
    assert float(soft_kl_loss(student, mixed, 2.0)) == pytest.approx(float(by_hand), rel=1e-5)
    h = torch.randn(7, 5, generator=generator)
    w = torch.randn(11, 5, generator=generator)
    fused = linear_soft_kl_loss(h, w, None, mixed, 2.0)
    assert float(fused) == pytest.approx(float(soft_kl_loss((h @ w.T), 2 * p.log(), 2.0)), rel=1e-5)
    with pytest.raises(ValueError, match=r"temperature 2\.0 read at 1\.0"):
        soft_kl_loss(student, mixed, 1.0)


@pytest.mark.parametrize("compiled", [False, True], ids=["row-function", "compiled"])
def test_a_row_kernel_mixes_the_teachers_in_its_own_pass(compiled, monkeypatch):
    """With a row kernel, the mixture reaches it unmixed (each teacher's z_k/T and log w_k) and the kernel forms
    log Σ_k w_k·softmax(z_k/T) itself: the same loss and student gradient as the mixture formed by hand."""
    from biodistil.losses import distillation
    from biodistil.losses.distillation import linear_soft_kl_loss, soft_kl_loss
    from biodistil.losses.multi_teacher import MixedRows
    from biodistil.training.compiling import cpp_compiler

    if compiled and cpp_compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    kernel = distillation.compiled_kl_rows() if compiled else distillation._kl_rows_fused
    generator = torch.Generator().manual_seed(1)
    x, weight, bias = (torch.randn(shape, generator=generator) for shape in ((7, 5), (11, 5), (11,)))
    dense = 3 * torch.randn(7, 11, generator=generator)
    for shares in (torch.tensor([0.3, 0.7]), torch.rand(2, 7, generator=generator).softmax(0)):
        per_row = shares[:, :, None] if shares.dim() == 2 else shares[:, None, None]
        p = per_row[0] * F.softmax((x @ weight.T + bias) / 2, -1) + per_row[1] * F.softmax(dense / 2, -1)
        mixed = MixedRows(((x, weight, bias), dense), shares, 2.0)
        student = torch.randn(7, 11, generator=generator, requires_grad=True)
        monkeypatch.setattr(distillation, "KL_CHUNK_ELEMENTS", 22)  # chunks of 2 rows
        loss = soft_kl_loss(student, mixed, 2.0, kernel=kernel)
        loss.backward()
        log_s = F.log_softmax(student.detach() / 2, -1)
        assert loss.item() == pytest.approx(float(4 * (p * (p.log() - log_s)).sum(-1).mean()), rel=1e-5)
        assert torch.allclose(student.grad, 2 * (log_s.exp() - p) / 7, atol=1e-6)
        h = torch.randn(7, 5, generator=generator, requires_grad=True)
        w = torch.randn(11, 5, generator=generator)
        fused = linear_soft_kl_loss(h, w, None, mixed, 2.0, kernel=kernel)
        fused.backward()
        log_s = F.log_softmax(h.detach() @ w.T / 2, -1)
        assert fused.item() == pytest.approx(float(4 * (p * (p.log() - log_s)).sum(-1).mean()), rel=1e-5)
        assert torch.allclose(h.grad, (2 * (log_s.exp() - p) / 7) @ w, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True], ids=["row-function", "compiled"])
def test_a_row_kernel_keeps_the_kl_finite_where_the_mixture_underflows(compiled):
    """The kernel sums the teachers' probabilities and takes the log of the sum floored at 1e-12: where both teachers
    give a class a probability that underflows float32 (logit gaps of 300), the KL stays finite and equals the sum
    over the classes the mixture keeps, worked out by hand: p = (0.5, 0.5, 0, 0) against a uniform student."""
    from biodistil.losses import distillation
    from biodistil.training.compiling import cpp_compiler

    if compiled and cpp_compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    kernel = distillation.compiled_kl_rows() if compiled else distillation._kl_rows_fused
    first, second = torch.tensor([[300.0, 0.0, 0.0, 0.0]]), torch.tensor([[0.0, 300.0, 0.0, 0.0]])
    student = torch.zeros(1, 4)
    log_weights = torch.tensor([0.5, 0.5]).log().view(2, 1, 1)
    kl, grad = kernel(student, (first, second), log_weights, 1.0)
    # Σ p·(log p − log q) = 2 · 0.5 · (log 0.5 − log 0.25) = log 2; the two empty classes add 0
    assert kl.item() == pytest.approx(math.log(2), abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[0.25 - 0.5, 0.25 - 0.5, 0.25, 0.25]]), atol=1e-6)
