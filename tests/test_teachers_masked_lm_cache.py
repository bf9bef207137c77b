"""The teacher cache of task-agnostic distillation: the same outputs as the running teacher, keys that rebuild,
partial caches detected and completed, resume mid-cache and mid-training, two processes."""

import copy
import json

import pytest
import torch
from distill_fixtures import TERMS, cache_recipe
from numerics import CLOSE, perturbed
from safetensors.torch import load_file

from biodistil.config import DistillRecipe, validate_recipe
from biodistil.errors import BiodistilError
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.methods.task_agnostic import corpus_data, run_distill, teacher_caches
from biodistil.models.families import head_only
from biodistil.models.loading import load_masked_lm, load_tokenizer
from biodistil.models.student import build_student
from biodistil.teachers.masked_lm_cache import CacheReader, MaskedLMOutputs, build_cache
from biodistil.teachers.signal import CachedTeacher, OnlineTeacher


class Setup:
    """What a distill run builds before training: teacher, tokenizer, objective, data and its caches."""

    def __init__(self, recipe: DistillRecipe):
        from biodistil.training.engine import make_accelerator

        self.recipe = recipe
        self.accelerator = make_accelerator("no")
        self.tokenizer = load_tokenizer(recipe.teacher.name_or_path)
        self.teacher = load_masked_lm(recipe.teacher.name_or_path)
        self.student, _ = build_student(recipe.student, self.teacher, self.tokenizer)
        self.objective = Objective(recipe.objective, self.student, self.teacher)
        self.data = corpus_data(recipe, self.tokenizer, self.accelerator)
        self.caches = teacher_caches(recipe, self.teacher, torch.float32, self.tokenizer, self.objective, self.data, 1)

    def build(self, **options):
        from biodistil.data.masking import MaskingVocabulary

        corpus = self.caches[0]
        return build_cache(corpus.cache, self.teacher, corpus.blocks, MaskingVocabulary.from_tokenizer(self.tokenizer),
                           self.recipe.masking, corpus.patterns, 16, self.tokenizer.pad_token_id, progress=False,
                           **options)


def shard_bytes(cache, patterns):
    return {(p, s): cache.shard_path(p, s).read_bytes() for p in patterns for s in range(cache.shards)}


def test_cached_outputs_are_the_running_teachers(tmp_path, teacher_dir, corpus_file):
    tokenizer = load_tokenizer(str(teacher_dir))
    setup = Setup(cache_recipe(teacher_dir, corpus_file, tmp_path, top_k=len(tokenizer)))  # k = V: no tail
    setup.build()
    corpus = setup.caches[0]
    assert corpus.patterns == [0, 1] and corpus.cache.shards == 3, "50 steps of 8 over 322 blocks: 2 epochs"
    signal = CachedTeacher(MaskedLMOutputs(corpus.reader()))
    dataset, collate = signal.data(setup.data.train, setup.data.collate)
    dataset.set_epoch(1)
    items = [dataset[i] for i in (0, 5, 70, 300)]
    assert [item["pattern"] for item in items] == [1] * 4 and [item["block"] for item in items] == [0, 5, 70, 300]
    batch = collate(items)
    student = perturbed(setup.student, seed=1)  # a student clearly unlike its teacher: KL far above rounding
    cached = MaskedLMModule(student, setup.objective, signal)
    online = MaskedLMModule(student, setup.objective, OnlineTeacher(setup.teacher))
    student.eval()  # no dropout: both passes see the same student
    _, cached_logs = cached(batch)
    _, online_logs = online(batch.replace(teachers=[{}]))
    # top-k over the whole vocabulary is the full KL; hidden states stored in bfloat16 (8 bits of mantissa)
    assert cached_logs["loss_logit_kl"].item() == pytest.approx(online_logs["loss_logit_kl"].item(), rel=1e-3)
    assert cached_logs["loss_hidden_cosine"].item() == pytest.approx(online_logs["loss_hidden_cosine"].item(),
                                                                     rel=2e-2, abs=1e-4)
    assert cached_logs["loss_mlm"].item() == online_logs["loss_mlm"].item()


def test_a_head_cache_gives_the_running_teachers_own_logits(tmp_path, teacher_dir, corpus_file):
    setup = Setup(cache_recipe(teacher_dir, corpus_file, tmp_path, logits="head"))
    setup.build()
    head = head_only(copy.deepcopy(setup.teacher))
    assert head.bert.encoder.layer[0].attention.self.query.weight.is_meta, "the teacher's layers leave memory"
    assert not head.cls.predictions.transform.dense.weight.is_meta
    assert not head.get_output_embeddings().weight.is_meta, "the tied embeddings are the decoder"
    signal = CachedTeacher(MaskedLMOutputs(setup.caches[0].reader(), head))
    dataset, collate = signal.data(setup.data.train, setup.data.collate)
    batch = collate([dataset[i] for i in (0, 5, 70, 300)])
    rows = int((batch.labels != -100).sum())
    assert batch.teacher["head_input"].shape == (rows, setup.teacher.config.hidden_size)
    assert batch.teacher["head_input"].dtype == torch.float32, "stored in the teacher's dtype"
    student = perturbed(setup.student, seed=1).eval()
    _, cached = MaskedLMModule(student, setup.objective, signal)(batch)
    _, online = MaskedLMModule(student, setup.objective, OnlineTeacher(setup.teacher))(
        batch.replace(teachers=[{}]))
    assert cached["loss_logit_kl"].item() > 1e-2
    assert cached["loss_logit_kl"].item() == pytest.approx(online["loss_logit_kl"].item(), **CLOSE), "exact logits"
    assert cached["loss_mlm"].item() == online["loss_mlm"].item()
    with pytest.raises(ValueError, match="needs the teacher's head"):
        CachedTeacher(MaskedLMOutputs(setup.caches[0].reader()))


def test_cache_distillation_trains_and_reports_the_cache(tmp_path, teacher_dir, corpus_file):
    recipe = cache_recipe(teacher_dir, corpus_file, tmp_path, max_steps=30)
    model_dir = run_distill(recipe)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"] and {"loss_logit_kl", "grad_norm"} <= set(train[0])
    assert [r["step"] for r in records if r["split"] == "eval"] == [10, 20, 30]
    assert (model_dir / "model.safetensors").is_file()
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Teacher cache" in report and "MB per million tokens" in report and "shards built here" in report
    # a second student reuses the cache: nothing is built
    again = run_distill(cache_recipe(teacher_dir, corpus_file, tmp_path, out="second", max_steps=30))
    assert "0 shards built here" in (again.parent / "report.md").read_text()


def test_a_changed_key_builds_another_cache(tmp_path, teacher_dir, corpus_file):
    first = Setup(cache_recipe(teacher_dir, corpus_file, tmp_path))
    first.build()
    for change in ({"top_k": 8}, {"masking": {"duplication": 2, "seed": 1}},
                   {"objective": {"temperature": 1.0, "terms": TERMS}}, {"top_k": 16, "logits": "head"}):
        cache_settings = {k: v for k, v in change.items() if k in ("top_k", "logits")}
        recipe = cache_recipe(teacher_dir, corpus_file, tmp_path, **cache_settings)
        recipe = recipe.model_copy(update={k: type(getattr(recipe, k)).model_validate(v)
                                           for k, v in change.items() if k not in cache_settings})
        other = Setup(recipe)
        assert other.caches[0].cache.folder != first.caches[0].cache.folder, change
        assert other.build().built == other.caches[0].cache.shards * 2, "every shard is built for the new key"
    changed = load_masked_lm(str(teacher_dir))
    with torch.no_grad():
        changed.bert.embeddings.word_embeddings.weight[5, 0] += 1.0
    changed.save_pretrained(tmp_path / "changed")
    load_tokenizer(str(teacher_dir)).save_pretrained(tmp_path / "changed")
    perturbed = Setup(cache_recipe(tmp_path / "changed", corpus_file, tmp_path))
    assert perturbed.caches[0].cache.folder != first.caches[0].cache.folder, "other teacher weights, another key"
    assert first.build().built == 0, "the first cache is still complete"
    head = [Setup(cache_recipe(teacher_dir, corpus_file, tmp_path, logits="head", top_k=k)) for k in (8, 16)]
    assert head[0].caches[0].cache.folder == head[1].caches[0].cache.folder, "k does not change a head cache"


def test_a_partial_cache_is_detected_and_completed(tmp_path, teacher_dir, corpus_file):
    setup = Setup(cache_recipe(teacher_dir, corpus_file, tmp_path))
    cache, patterns = setup.caches[0].cache, setup.caches[0].patterns
    assert setup.build(stop_after_shards=2).built == 2, "an interrupted build (as after kill -9)"
    with pytest.raises(BiodistilError, match="no complete pattern 0"):
        CacheReader(cache, patterns)
    assert setup.build().built == 2 * cache.shards - 2, "a second build writes only what is missing"
    complete = shard_bytes(cache, patterns)
    CacheReader(cache, patterns)
    # damage: a truncated shard and a missing one are named, and rebuilding restores exactly those
    truncated, missing = cache.shard_path(1, 0), cache.shard_path(0, 2)
    truncated.write_bytes(truncated.read_bytes()[:100])
    with pytest.raises(BiodistilError, match=r"pattern-1/shard-00000\.arrow holds 100 bytes, [\d,]+ were written"):
        CacheReader(cache, patterns)
    missing.unlink()
    with pytest.raises(BiodistilError, match=r"pattern-0/shard-00002\.arrow is missing"):
        CacheReader(cache, patterns)
    for pattern in patterns:
        (cache.folder / f"pattern-{pattern}" / "complete.json").unlink()
    with pytest.raises(BiodistilError, match="no complete pattern"):
        CacheReader(cache, patterns)
    (cache.folder / "pattern-0" / ".shard-00001.arrow.123.tmp").write_bytes(b"partial write")  # left by a crash
    assert setup.build().built == 2
    assert shard_bytes(cache, patterns) == complete, "the rebuilt shards equal the first build's"
    CacheReader(cache, patterns)


def test_a_damaged_shard_of_a_complete_cache_is_found_and_rebuilt(tmp_path, teacher_dir, corpus_file):
    setup = Setup(cache_recipe(teacher_dir, corpus_file, tmp_path))
    cache, patterns = setup.caches[0].cache, setup.caches[0].patterns
    setup.build()
    complete = shard_bytes(cache, patterns)
    truncated = cache.shard_path(0, 1)
    truncated.write_bytes(truncated.read_bytes()[:-10])
    assert setup.build().built == 1, "a complete pattern's truncated shard is built again, not skipped"
    assert shard_bytes(cache, patterns) == complete
    flipped = cache.shard_path(1, 0)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same footer: only the checksum sees it
    flipped.write_bytes(bytes(data))
    reader = CacheReader(cache, patterns)
    with pytest.raises(BiodistilError, match=r"pattern-1/shard-00000\.arrow does not match its checksum.*found 1 of "
                                             r".*Run the same command again"):
        reader.entry(0, 1)
    assert not cache.complete(1) and not flipped.exists(), "deleted and marked for rebuilding"
    assert setup.build().built == 1 and shard_bytes(cache, patterns) == complete
    flipped.write_bytes(bytes(data))
    assert setup.build().built == 0, "without verification a same-size shard passes the quick checks"
    assert setup.build(verify=True).built == 1, "cache-teacher verifies every checksum and rebuilds"
    assert shard_bytes(cache, patterns) == complete


def test_many_damaged_shards_are_all_found_at_the_first_and_rebuilt_in_one_pass(tmp_path, teacher_dir, corpus_file):
    """Bytes flipped in every shard: the first read checks them all, deletes every damaged one and says how many, so
    one build (the next run's) repairs the whole cache, not one shard per run."""
    setup = Setup(cache_recipe(teacher_dir, corpus_file, tmp_path))
    cache, patterns = setup.caches[0].cache, setup.caches[0].patterns
    setup.build()
    complete = shard_bytes(cache, patterns)
    shards = [cache.shard_path(p, s) for p in patterns for s in range(cache.shards)]
    assert len(shards) >= 4
    for path in shards:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    reader = CacheReader(cache, patterns)  # the quick checks (size, footer) pass
    with pytest.raises(BiodistilError, match=rf"found {len(shards)} of {len(shards)} damaged .*Run the same command "
                                             r"again: it rebuilds all of them first.*cache-teacher"):
        reader.entry(0, patterns[0])
    assert not any(path.exists() for path in shards) and not any(cache.complete(p) for p in patterns)
    assert setup.build().built == len(shards) and shard_bytes(cache, patterns) == complete, "one pass repairs all"


@pytest.mark.parametrize("logits", ["top_k", "head"])
def test_resume_from_cache_equals_an_uninterrupted_run(tmp_path, teacher_dir, corpus_file, logits):
    full = run_distill(cache_recipe(teacher_dir, corpus_file, tmp_path, out="full", logits=logits, max_steps=50))
    cut = cache_recipe(teacher_dir, corpus_file, tmp_path, out="cut", logits=logits, max_steps=50)
    run_distill(cut, stop_after=30)  # past the first epoch (40 batches): pattern 1 is read after resuming
    resumed = run_distill(cut, resume=True)
    a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_terms_a_cache_cannot_serve_are_refused(tmp_path, teacher_dir, corpus_file):
    recipe = cache_recipe(teacher_dir, corpus_file, tmp_path)
    for terms, message in (([{"loss": "attention_mse", "student_layer": 1, "teacher_layer": 2}], "needs the running"),
                           ([{"loss": "logit_kl", "positions": "all"}], "positions: all")):
        changed = recipe.model_copy(update={"objective": recipe.objective.model_copy(
            update={"terms": [type(recipe.objective.terms[0]).model_validate(t) for t in terms]})})
        with pytest.raises(BiodistilError, match=message):
            run_distill(changed.model_copy(update={"run": changed.run.model_copy(
                update={"output_dir": str(tmp_path / message[:5])})}))
    with pytest.raises(BiodistilError, match=r"masking\.duplication"):
        validate_recipe(DistillRecipe, {**recipe.model_dump(mode="json"), "masking": {}})


def test_the_distilbert_recipe_distils_from_a_cache_on_the_command_line(tmp_path, teacher_dir, corpus_file):
    from recipe_fixtures import RECIPES, TRAIN

    from biodistil.cli.main import main

    overrides = [str(RECIPES / "distilbiobert.yaml"), f"teacher.name_or_path={teacher_dir}", "teacher.dtype=float32",
                 f"data.train=[{corpus_file}]", "data.block_size=32", f"data.cache_dir={tmp_path / 'corpus'}",
                 "masking.duplication=2", "teacher_cache.top_k=16", f"teacher_cache.dir={tmp_path / 'cache'}", *TRAIN]
    assert main(["cache-teacher", *overrides]) == 0
    assert main(["distill", *overrides, "--out", str(tmp_path / "run")]) == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "0 shards built here" in report and (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_the_cache_holds_draws_from_the_teachers_tail(tmp_path, teacher_dir, corpus_file):
    setup = Setup(cache_recipe(teacher_dir, corpus_file, tmp_path))  # top-16 of 200 tokens, 64 draws of the rest
    setup.build()
    signal = CachedTeacher(MaskedLMOutputs(setup.caches[0].reader()))
    dataset, collate = signal.data(setup.data.train, setup.data.collate)
    batch = collate([dataset[i] for i in range(8)])
    rows = int((batch.labels != -100).sum())
    assert batch.teacher["topk_ids"].shape == (rows, 16) and batch.teacher["tail_ids"].shape == (rows, 64)
    top, draws = batch.teacher["topk_ids"], batch.teacher["tail_ids"]
    assert not (draws.unsqueeze(-1) == top.unsqueeze(1)).any(), "draws come from outside the top-k"
    assert (batch.teacher["tail_logits"].float() <= batch.teacher["topk_logits"][:, -1:].float()).all()
