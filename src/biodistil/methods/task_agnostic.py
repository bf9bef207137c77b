"""The `pretrain` and `distill` commands: MLM pre-training and task-agnostic distillation, end to end.

recipe -> run folder -> tokenizer and models -> corpus blocks -> engine -> exported model -> report.

`distill` across tokenizers (a student vocabulary of its own, `student.tokenizer`, or a pretrained student with
another tokenizer): the objective's terms are checked for the pair first (`methods.cross_tokenizer`), the corpus is
read as blocks of text that both tokenizers read (`data.text_blocks`), the same words are masked on both sides
(`MaskSameWords`) and the terms compare words (docs/cross-tokenizer.md).
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.config import DistillRecipe, ObjectiveConfig, PretrainRecipe, TermConfig, TokenizerTrainingConfig
from biodistil.data.batch import AsBatch
from biodistil.data.corpus import collate_blocks, iter_lines, load_corpus_splits, resolve_corpus_files
from biodistil.data.masking import MaskingVocabulary, StaticMaskedBlocks, collate_masked_blocks
from biodistil.data.shared_vocabulary import shared_vocabulary
from biodistil.data.text_blocks import AlignedTextCollate, load_text_splits
from biodistil.data.vocab import train_wordpiece
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory
from biodistil.methods.cross_tokenizer import pair_support, refuse_unsupported, term_support, tokenizer_pair
from biodistil.methods.masked_lm import MaskBatch, MaskedLMModule, MaskSameWords
from biodistil.methods.objective import Objective
from biodistil.methods.several_teachers import refuse_mixed_vocabularies, render_teacher_table
from biodistil.methods.vekd import VocabExpansionMaskBatch, expanded_student
from biodistil.models.families import head_only, position_limit
from biodistil.models.loading import check_model, load_masked_lm, load_tokenizer
from biodistil.models.saving import export_model
from biodistil.models.size import count_parameters
from biodistil.models.student import build_student, check_same_vocabulary, model_from_architecture
from biodistil.models.vocab_transfer import VocabularyTransfer, vocabulary_pieces
from biodistil.paths import recorded
from biodistil.teachers.masked_lm_cache import (
    BuildReport,
    Cache,
    CacheReader,
    CacheSpec,
    MaskedLMOutputs,
    build_cache,
    cache_spec,
)
from biodistil.teachers.signal import CachedTeacher, OnlineTeacher, TeacherSignal
from biodistil.teachers.store import store_root
from biodistil.training.engine import Collate, Engine, PrepareBatch, TrainData, TrainResult, make_accelerator
from biodistil.training.machine import dtype_note, teacher_dtype
from biodistil.training.run import Report, RunFolder, open_run

MLM_ONLY = ObjectiveConfig(temperature=1.0, terms=[TermConfig(loss="mlm", weight=1.0)])


@dataclass
class CorpusData:
    """What the engine reads: training and held-out data, how a batch is collated and masked."""

    train: Dataset
    held_out: Dataset | None
    collate: Collate
    prepare: PrepareBatch | None


def corpus_data(recipe: PretrainRecipe | DistillRecipe, tokenizer, accelerator) -> CorpusData:
    """The corpus blocks, masked per batch (`MaskBatch`) or, with `masking.duplication`, statically per block in the
    data-loading stage (`StaticMaskedBlocks`, the held-out blocks under pattern 0)."""
    with accelerator.main_process_first():
        train, held_out = load_corpus_splits(recipe.data, tokenizer)
    vocab = MaskingVocabulary.from_tokenizer(tokenizer)
    pad_id = tokenizer.pad_token_id
    first = 0 if recipe.data.eval else len(train)  # held out from the end of the training corpus, or other files
    if recipe.masking.duplication is None:
        return CorpusData(train, held_out, AsBatch(partial(collate_blocks, pad_id=pad_id)),
                          MaskBatch(vocab, recipe.masking))
    return CorpusData(StaticMaskedBlocks(train, vocab, recipe.masking),
                      None if held_out is None else StaticMaskedBlocks(held_out, vocab, recipe.masking, first),
                      AsBatch(partial(collate_masked_blocks, pad_id=pad_id)), None)


def run_pretrain(recipe: PretrainRecipe, resume: bool = False, stop_after: int | None = None) -> Path:
    """MLM pre-training from scratch (with a vocabulary trained on the corpus) or continual pre-training."""
    model_check = [(recipe.model.name_or_path, "model.name_or_path", recipe.model.trust_remote_code)]
    run, accelerator = open_run(recipe, resume, model_check if recipe.model.init == "continual" else [])
    if recipe.model.init == "continual":
        tokenizer = load_tokenizer(recipe.model.name_or_path, recipe.model.trust_remote_code)
        model = load_masked_lm(recipe.model.name_or_path, trust_remote_code=recipe.model.trust_remote_code)
    else:
        tokenizer = (load_tokenizer(recipe.model.tokenizer_name_or_path, recipe.model.trust_remote_code)
                     if recipe.model.tokenizer_name_or_path
                     else corpus_tokenizer(recipe.model.tokenizer, recipe.data.train, run, accelerator))
        model = model_from_architecture(recipe.model.architecture, tokenizer)
    module = MaskedLMModule(model, Objective(MLM_ONLY, model, None))
    data = corpus_data(recipe, tokenizer, accelerator)
    result = _train(module, data, recipe, run, accelerator, run.resume, stop_after)
    return _finish(run, module, tokenizer, result, accelerator, "MLM pre-training", stop_after)


def run_distill(recipe: DistillRecipe, resume: bool = False, stop_after: int | None = None) -> Path:
    """Task-agnostic distillation of a masked-LM teacher (or several) into a student with the recipe's objective
    (across tokenizers when the student and a teacher read different vocabularies)."""
    if recipe.student.tokenizer is not None:  # pre-flight before any work: the vocabulary to train is another one
        refuse_unsupported(pair_support("different", recipe.objective.terms))
    entries = recipe.teacher_list
    run, accelerator = open_run(recipe, resume, [(entry.name_or_path, f"{recipe.teacher_field(slot)}.name_or_path",
                                                  entry.trust_remote_code) for slot, entry in enumerate(entries)])
    tokenizers = [load_tokenizer(entry.name_or_path, entry.trust_remote_code) for entry in entries]
    tokenizer = tokenizers[0]
    teachers = [load_masked_lm(entry.name_or_path, "float32", entry.trust_remote_code) for entry in entries]
    teacher = teachers[0]
    notes = [_teacher_note(recipe, slot, model) for slot, model in enumerate(teachers)]
    shared_vocab, prepare = None, None
    if recipe.student.vocab_expansion is not None:  # VE-KD: the student reads an expanded vocabulary
        student, tokenizer, shared_vocab = expanded_student(recipe, teacher, tokenizer, run.path, accelerator)
        prepare = VocabExpansionMaskBatch(MaskingVocabulary.from_tokenizer(tokenizer), recipe.masking, shared_vocab)
        notes.append(f"Vocabulary expanded from {shared_vocab:,} to {len(tokenizer):,} tokens (VE-KD).")
        student_tokenizer = tokenizer
    else:
        student, student_tokenizer, built = _student(recipe, teacher, tokenizer, run, accelerator)
        notes += built
    pairs = [tokenizer_pair(student_tokenizer, own) for own in tokenizers]
    if shared_vocab is None and any(pair != "same" for pair in pairs):
        objective, data = _across_tokenizers(recipe, student, student_tokenizer, teachers, tokenizers, accelerator)
        notes.append(_across_note(student_tokenizer, tokenizers, objective))
    else:
        if shared_vocab is None:
            for slot, (model, own) in enumerate(zip(teachers, tokenizers, strict=True)):
                with recipe.naming_teacher(slot):
                    check_same_vocabulary(model, own, student, student_tokenizer)
        objective = Objective(recipe.objective, student, teachers, teacher_weights=recipe.teacher_weights,
                              layer_maps=[entry.layer_map for entry in entries])
        data = corpus_data(recipe, tokenizer, accelerator)
    if len(teachers) > 1:
        notes.append(_preflight(recipe, objective, pairs, accelerator.is_main_process))
    signals, corpus = [], data
    for slot, entry in enumerate(entries):
        dtype = teacher_dtype(entry.dtype, accelerator.device)
        notes.append(dtype_note(entry.dtype, dtype, accelerator.device))
        signal, data, note = _teacher_signal(recipe, slot, teachers[slot], dtype, tokenizer, objective, corpus, data,
                                             accelerator)
        teachers[slot] = None  # a cached teacher's layers are dropped: what its head needs stays with the signal
        signals.append(signal)
        notes += [note] if note else []
    del teacher
    module = MaskedLMModule(student, objective, signals if len(signals) > 1 else signals[0], shared_vocab)
    result = _train(module, replace(data, prepare=prepare or data.prepare), recipe, run, accelerator, run.resume,
                    stop_after)
    return _finish(run, module, student_tokenizer, result, accelerator, "Task-agnostic distillation", stop_after,
                   notes)


def _teacher_note(recipe: DistillRecipe, slot: int, model: PreTrainedModel) -> str:
    entry = recipe.teacher_list[slot]
    share = "" if recipe.teachers is None else f", weight λ = {recipe.teacher_weights[slot]:.3g}"
    return f"Teacher: `{entry.name_or_path}` ({count_parameters(model)['total']:,} parameters{share})."


def _preflight(recipe: DistillRecipe, objective: Objective, pairs: list[str], show: bool) -> str:
    """The table of teacher × term (what each teacher contributes, and why not where it cannot), printed before the
    corpus is read and kept for the report."""
    across = any(pair != "same" for pair in pairs)
    tokens = {"same": "the student's", "different": "its own: the words every side shares",
              "extended": "the student's, extended"}
    rows = objective.contributions([
        {"teacher": str(entry.name_or_path),
         "tokens": "the student's: the words every side shares" if across and pair == "same" else tokens[pair]}
        for entry, pair in zip(recipe.teacher_list, pairs, strict=True)])
    if show:
        print(render_teacher_table(rows), flush=True)
    return render_teacher_table(rows, markdown=True)


def _teacher_signal(recipe: DistillRecipe, slot: int, teacher: PreTrainedModel, dtype: torch.dtype, tokenizer,
                    objective: Objective, corpus: CorpusData, data: CorpusData,
                    accelerator) -> tuple[TeacherSignal, CorpusData, str]:
    """Teacher `slot`'s signal: the model on this device in `dtype`, or its cache of the `corpus` (built first where
    it lacks shards) with `data` made to attach the cached outputs to each batch (data that earlier teachers' caches
    already attach theirs to); and the report's note on the cache."""
    if recipe.teacher_cache is None:
        teacher.to(accelerator.device, dtype=dtype)
        return OnlineTeacher(teacher, slot=slot), data, ""
    # the teacher runs once per (block, pattern), before training, if at all
    caches = teacher_caches(recipe, teacher, dtype, tokenizer, objective, corpus, accelerator.num_processes, slot)
    reports = [_build(cache, teacher, dtype, tokenizer, recipe, accelerator) for cache in caches]
    head = head_only(teacher) if caches[0].cache.spec.logits == "head" else None
    signal = CachedTeacher(MaskedLMOutputs(caches[0].reader(), head),
                           MaskedLMOutputs(caches[-1].reader(), head) if data.held_out is not None else None, slot)
    train, collate = signal.data(data.train, data.collate)
    held_out = None if data.held_out is None else signal.data(data.held_out, data.collate, True)[0]
    return signal, replace(data, train=train, held_out=held_out, collate=collate), _cache_note(caches, reports)


def _student(recipe: DistillRecipe, teacher, tokenizer, run: RunFolder,
             accelerator) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, list[str]]:
    """The student, its tokenizer (a vocabulary trained on the corpus with `student.tokenizer`, kept in
    <run>/tokenizer) and the report's notes on how its embeddings were made."""
    own = recipe.student.tokenizer
    student_tokenizer = None if own is None else corpus_tokenizer(own, recipe.data.train, run, accelerator)
    student, student_tokenizer = build_student(recipe.student, teacher, tokenizer, student_tokenizer)
    notes = []
    if own is not None:
        notes.append(f"Student vocabulary: WordPiece of {len(student_tokenizer):,} tokens trained on data.train "
                     f"({'uncased' if own.lowercase else 'cased'}).")
    if own is not None and recipe.student.init == "teacher_layers":
        pieces = vocabulary_pieces(student_tokenizer, tokenizer)
        notes.append(VocabularyTransfer.of(pieces, tokenizer.unk_token_id).note())
    return student, student_tokenizer, notes


def _across_tokenizers(recipe: DistillRecipe, student, student_tokenizer, teachers: list[PreTrainedModel],
                       tokenizers: list, accelerator) -> tuple[Objective, CorpusData]:
    """Across tokenizers: the pre-flight (each refused term named, per teacher), the objective with the strings the
    student's and each teacher's vocabularies share, and the corpus as text blocks every tokenizer reads, masked word
    by word on every side (several teachers: the words all of them share)."""
    for slot, own in enumerate(tokenizers):
        with recipe.naming_teacher(slot):
            refuse_unsupported(term_support(student_tokenizer, own, recipe.objective.terms))
    if recipe.teacher_cache is not None or recipe.masking.duplication is not None or recipe.train.group_by_length:
        raise BiodistilError("teacher_cache, masking.duplication (static masks) and train.group_by_length are not "
                             "supported across tokenizers: blocks are text, the same words are masked on both sides "
                             "batch by batch and the teacher reads its own tokens online; remove them, or give the "
                             "student the teacher's tokenizer")
    refuse_mixed_vocabularies(recipe.objective, [term.loss for term in recipe.objective.terms], len(teachers))
    vocabularies = [shared_vocabulary(student_tokenizer, own, student.config.vocab_size, model.config.vocab_size)
                    for own, model in zip(tokenizers, teachers, strict=True)]
    objective = Objective(recipe.objective, student, teachers, vocabularies, teacher_weights=recipe.teacher_weights,
                          layer_maps=[entry.layer_map for entry in recipe.teacher_list])
    with accelerator.main_process_first():
        train, held_out = load_text_splits(recipe.data, student_tokenizer)
    block = recipe.data.block_size
    collate = AlignedTextCollate(student_tokenizer, tokenizers[0], block, teacher_length(teachers[0].config, block),
                                 more_teachers=tuple((own, teacher_length(model.config, block))
                                                     for own, model in zip(tokenizers[1:], teachers[1:], strict=True)))
    prepare = MaskSameWords(MaskingVocabulary.from_tokenizer(student_tokenizer),
                            MaskingVocabulary.from_tokenizer(tokenizers[0]), recipe.masking,
                            [MaskingVocabulary.from_tokenizer(own) for own in tokenizers[1:]])
    return objective, CorpusData(train, held_out, collate, prepare)


def teacher_length(config, block_size: int) -> int:
    """The teacher's truncation across tokenizers: twice the student's block (a text of block_size − 2 student
    tokens rarely needs more teacher tokens), within its position embeddings (`position_limit`)."""
    return min(2 * block_size, position_limit(config, default=2 * block_size))


def _across_note(student_tokenizer, tokenizers: list, objective: Objective) -> str:
    if len(tokenizers) == 1:
        return (f"Across tokenizers: student {len(student_tokenizer):,} tokens, teacher {len(tokenizers[0]):,}; terms "
                f"compare the words both tokenizations hold whole; the logit terms read the first token of each "
                f"masked word ({objective.vocabulary.size:,} strings both vocabularies name).")
    sizes = ", ".join(f"{len(own):,}" for own in tokenizers)
    shared = ", ".join(f"{vocabulary.size:,}" for vocabulary in objective.vocabularies)
    return (f"Across tokenizers: student {len(student_tokenizer):,} tokens, teachers {sizes}; terms compare the words "
            f"every tokenization holds whole; the logit terms read the first token of each masked word, per teacher "
            f"over the strings its vocabulary and the student's both name ({shared}).")


def run_cache_teacher(recipe: DistillRecipe) -> Path:
    """`biodistil cache-teacher`: build (or complete) the teacher cache a distill recipe with `teacher_cache` reads
    (one per teacher), every process writing its own shards; returns the first teacher's training-corpus cache."""
    if recipe.teacher_cache is None:
        raise BiodistilError("cache-teacher needs a recipe with a teacher_cache section (and masking.duplication)")
    entries = recipe.teacher_list
    for slot, entry in enumerate(entries):
        check_model(entry.name_or_path, f"{recipe.teacher_field(slot)}.name_or_path", entry.trust_remote_code)
    accelerator = make_accelerator("no", device=recipe.train.device)
    tokenizer = load_tokenizer(entries[0].name_or_path, entries[0].trust_remote_code)
    teachers = [load_masked_lm(entry.name_or_path, "float32", entry.trust_remote_code) for entry in entries]
    student, student_tokenizer = build_student(recipe.student, teachers[0], tokenizer)
    for slot, model in enumerate(teachers):
        own = tokenizer if slot == 0 else load_tokenizer(entries[slot].name_or_path, entries[slot].trust_remote_code)
        with recipe.naming_teacher(slot):
            check_same_vocabulary(model, own, student, student_tokenizer)
    objective = Objective(recipe.objective, student, teachers, teacher_weights=recipe.teacher_weights,
                          layer_maps=[entry.layer_map for entry in entries])
    data = corpus_data(recipe, tokenizer, accelerator)
    first = None
    for slot, (entry, teacher) in enumerate(zip(entries, teachers, strict=True)):
        dtype = teacher_dtype(entry.dtype, accelerator.device)
        caches = teacher_caches(recipe, teacher, dtype, tokenizer, objective, data, accelerator.num_processes, slot)
        reports = [_build(cache, teacher, dtype, tokenizer, recipe, accelerator, verify=True) for cache in caches]
        if accelerator.is_main_process:
            print(_cache_note(caches, reports))
        first = first or caches[0].cache.folder
    return first


@dataclass
class CorpusCache:
    """A teacher cache over one corpus (training, or held-out files), the patterns a run reads from it, and the
    corpus's blocks by index."""

    cache: Cache
    patterns: list[int]
    blocks: Callable[[int], list[int]]

    def reader(self) -> CacheReader:
        return CacheReader(self.cache, self.patterns)


def teacher_caches(recipe: DistillRecipe, teacher, dtype: torch.dtype, tokenizer, objective: Objective,
                   data: CorpusData, processes: int, slot: int = 0) -> list[CorpusCache]:
    """The caches a run reads of teacher `slot`: the training corpus's (patterns 0 .. min(D, epochs of the run) − 1;
    pattern 0 of the held-out blocks at its end too) and, when the held-out blocks come from other files, theirs
    (pattern 0). Each teacher's cache is keyed by what it is: adding a teacher never rebuilds another's."""
    cfg, request = recipe.teacher_cache, objective.cache_request(slot)
    name = recipe.teacher_list[slot].name_or_path
    root = store_root(cfg.dir)
    train, held_out = data.train.blocks, data.held_out.blocks if data.held_out is not None else None

    def spec(files: list[str], max_lines: int | None, blocks: int) -> CacheSpec:
        return cache_spec(name, teacher.config, dtype, tokenizer, files, max_lines,
                          recipe.data.block_size, recipe.masking, request, cfg, recipe.objective.temperature, blocks)

    per_epoch = max(1, len(train) // (recipe.train.batch_size * processes))
    epochs = -(-recipe.train.max_steps * recipe.train.grad_accumulation // per_epoch)
    patterns = list(range(min(recipe.masking.duplication, epochs)))
    if recipe.data.eval:
        caches = [CorpusCache(Cache(root, spec(recipe.data.train, recipe.data.max_lines, len(train))), patterns,
                              lambda b: train[b]["input_ids"])]
        if held_out is not None:
            caches.append(CorpusCache(Cache(root, spec(recipe.data.eval, None, len(held_out))), [0],
                                      lambda b: held_out[b]["input_ids"]))
        return caches
    size = len(train) + (len(held_out) if held_out is not None else 0)

    def block(b: int) -> list[int]:
        return train[b]["input_ids"] if b < len(train) else held_out[b - len(train)]["input_ids"]

    return [CorpusCache(Cache(root, spec(recipe.data.train, recipe.data.max_lines, size)), patterns, block)]


def _build(corpus: CorpusCache, teacher, dtype: torch.dtype, tokenizer, recipe: DistillRecipe,
           accelerator, verify: bool = False) -> BuildReport:
    """Build what the cache misses (with `verify`, also the shards whose checksum fails), the teacher on this
    process's device in `dtype` for the time of it."""
    teacher.to(accelerator.device, dtype=dtype).eval()
    return build_cache(
        corpus.cache, teacher, corpus.blocks, MaskingVocabulary.from_tokenizer(tokenizer), recipe.masking,
        corpus.patterns, recipe.teacher_cache.batch_size, tokenizer.pad_token_id, accelerator.process_index,
        accelerator.num_processes, accelerator.wait_for_everyone, recipe.train.progress_bar, verify=verify,
    )


def _cache_note(caches: list[CorpusCache], reports: list[BuildReport]) -> str:
    parts = []
    for corpus, report in zip(caches, reports, strict=True):
        spec = corpus.cache.spec
        size = corpus.cache.size_bytes(corpus.patterns)
        tokens = spec.blocks * spec.block_size * len(corpus.patterns)  # every block but the last is full
        parts.append(f"`{corpus.cache.folder}` (patterns {corpus.patterns}, {report.built} shards built here, "
                     f"{report.reused} reused; {size / 2**20:,.1f} MiB, {size / tokens:,.0f} MB per million tokens and "
                     "pattern)")
    stored = {"head": "the head's input at the masked positions, the head forming the teacher's logits",
              "top_k": "top-k logits at the masked positions", "": "hidden states"}[caches[0].cache.spec.logits]
    return f"Teacher cache ({stored}; instead of the teacher's layers): " + "; ".join(parts) + "."


def corpus_tokenizer(cfg: TokenizerTrainingConfig, corpus: list[str], run: RunFolder,
                     accelerator) -> PreTrainedTokenizerBase:
    """Train the WordPiece vocabulary of `cfg` on the corpus files once per run (kept in <run>/tokenizer, so a resumed
    run reuses it): pretrain's model from scratch, or a distilled student's own vocabulary."""
    folder = run.path / "tokenizer"
    if accelerator.is_main_process and not (folder / "tokenizer.json").is_file():
        files = resolve_corpus_files(corpus)
        tokenizer = train_wordpiece(iter_lines(files, cfg.max_lines), cfg.vocab_size, cfg.lowercase, cfg.min_frequency)
        atomic_directory(folder, tokenizer.save_pretrained)
    accelerator.wait_for_everyone()
    return load_tokenizer(str(folder))


def _train(module, data: CorpusData, recipe, run: RunFolder, accelerator, resume: bool,
           stop_after: int | None) -> TrainResult:
    """Train on the corpus data (`corpus_data`), masked by `data.prepare` or statically."""
    engine = Engine(recipe.train, run.path, recipe.run.seed, accelerator)
    return engine.fit(module, TrainData(data.train, data.collate, data.prepare, data.held_out), resume=resume,
                      stop_after=stop_after)


def _finish(run: RunFolder, module: MaskedLMModule, tokenizer, result: TrainResult, accelerator, title: str,
            stop_after: int | None, notes: list[str] = ()) -> Path:
    if not accelerator.is_main_process:
        return run.model_dir
    finished = stop_after is None or result.steps >= run.recipe.train.max_steps
    sizes = count_parameters(module.student)
    summary = {"result": asdict(result), "student_parameters": sizes, "finished": finished}
    save_model = None
    if finished and run.recipe.export.enabled:
        save_model = lambda folder: export_model(module.student, tokenizer, folder)  # noqa: E731
        summary["model_dir"] = recorded(run.model_dir, run.path)
    rows = {
        "steps": result.steps,
        "parameters (total / non-embedding)": f"{sizes['total']:,} / {sizes['non_embedding']:,}",
        "training throughput": f"{result.tokens_per_second:,.0f} tokens/s",
        "wall time": _training_time(result),
        **{f"final train {k}": f"{v:.4f}" for k, v in result.final_train.items() if k.startswith("loss")},
        **{f"held-out {k}": f"{v:.4f}" for k, v in result.final_eval.items()},
        "model": f"`{run.model_dir}`" if finished else "not exported (run stopped early; use --resume)",
    }
    return run.finish(summary, Report(title, rows, list(notes), result), save_model=save_model)


def _training_time(result: TrainResult) -> str:
    """The run's training time; a resumed run's adds the segments before the checkpoint it resumed."""
    total = f"{result.training_seconds:.1f} s"
    return f"{total} ({result.earlier_seconds:.1f} s of it before the resumed checkpoint)" if result.earlier_seconds \
        else total
