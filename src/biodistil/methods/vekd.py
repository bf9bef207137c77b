"""VE-KD (Gao et al., 2024): distillation into a student whose vocabulary is expanded with domain tokens.

Recipe switch: `student.vocab_expansion` (with `student.init: teacher_layers`). The run then
1. trains a WordPiece vocabulary on the domain corpus and appends the tokens the teacher lacks to the
   teacher's vocabulary, up to `vocab_expansion.vocab_size` (kept in <run>/tokenizer, so a resumed run
   reuses it);
2. copies the chosen teacher layers into the student and initialises each new token's embedding as the mean
   of the teacher embeddings of its pieces (`biodistil.models.vocab_expansion`);
3. tokenises the corpus with the expanded vocabulary and masks each batch with `VocabExpansionMaskBatch`:
   the teacher reads `teacher_input_ids` (every new token replaced by [MASK]) and KD terms with
   `positions: known` skip the new-token positions; the MLM covers the whole expanded vocabulary.
"""

from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.config import DistillRecipe, MaskingConfig
from biodistil.data.batch import Batch
from biodistil.data.corpus import iter_lines, resolve_corpus_files
from biodistil.data.masking import MaskingVocabulary, mask_tokens
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory
from biodistil.models.loading import load_tokenizer
from biodistil.models.student import student_from_teacher_layers
from biodistil.models.vocab_expansion import (
    expand_tokenizer,
    initialise_new_embeddings,
    select_new_tokens,
    teacher_pieces,
    train_domain_vocabulary,
    wordpiece_settings,
)


class VocabExpansionMaskBatch:
    """VE-KD masking (the engine's per-batch hook, sibling of `MaskBatch`).

    Ordinary tokens: the usual dynamic MLM masking (15% chosen, 80% [MASK] / 10% random / 10% kept), random
    replacements drawn from the teacher's vocabulary. New tokens (id ≥ |V_T|): always MLM targets, corrupted
    in the student's input by the same 80/10/10 rule. The teacher's input is the student's input with [MASK] at
    every new-token position, so the teacher never receives an id outside its vocabulary.
    Adds the teacher's `input_ids` (its payload) and the `new_tokens` mask ([B, L] bool, positions of new tokens).
    """

    def __init__(self, vocab: MaskingVocabulary, cfg: MaskingConfig, teacher_vocab_size: int):
        special = vocab.special.clone()
        special[teacher_vocab_size:] = True  # never chosen by the random draw, never a random replacement
        self.ordinary = MaskingVocabulary(vocab.mask_id, special, vocab.word_start)
        self.cfg, self.base = cfg, teacher_vocab_size

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        ids, attention = batch.input_ids, batch.attention_mask
        corrupted, labels = mask_tokens(ids, attention, self.ordinary, self.cfg, generator)
        new = (ids >= self.base) & attention.bool()
        corrupted, labels = self._corrupt_new_tokens(ids.cpu(), corrupted.cpu(), labels.cpu(), new.cpu(), generator)
        teacher_ids = corrupted.masked_fill(new.cpu() | (corrupted >= self.base), self.ordinary.mask_id)
        device = ids.device
        return batch.replace(inputs={**batch.inputs, "input_ids": corrupted.to(device)}, labels=labels.to(device),
                             masks={**batch.masks, "new_tokens": new.to(device)},
                             teachers=[{**batch.teacher, "input_ids": teacher_ids.to(device)}])

    def _corrupt_new_tokens(
        self, ids: torch.Tensor, corrupted: torch.Tensor, labels: torch.Tensor, new: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens become targets (label = id) and are replaced 80% by [MASK], 10% by a teacher token."""
        action = torch.rand(ids.shape, generator=generator)
        to_mask = new & (action < self.cfg.mask_ratio)
        to_random = new & (action >= self.cfg.mask_ratio) & (action < self.cfg.mask_ratio + self.cfg.random_ratio)
        ordinary = (~self.ordinary.special).nonzero().squeeze(1)
        corrupted = corrupted.clone()
        corrupted[to_mask] = self.ordinary.mask_id
        corrupted[to_random] = ordinary[torch.randint(len(ordinary), (int(to_random.sum()),), generator=generator)]
        return corrupted, torch.where(new, ids, labels)


def expanded_student(
    recipe: DistillRecipe, teacher: PreTrainedModel, teacher_tokenizer: PreTrainedTokenizerBase, run_dir: Path,
    accelerator: Accelerator,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, int]:
    """(student, expanded tokenizer, |V_T|): teacher layers plus new-token embeddings from teacher pieces."""
    base = len(teacher_tokenizer)
    if teacher.config.vocab_size < base:
        raise BiodistilError(f"The teacher has {teacher.config.vocab_size} embedding rows for {base} tokens")
    tokenizer = _expanded_tokenizer(recipe, teacher_tokenizer, Path(run_dir) / "tokenizer", accelerator)
    vocab = tokenizer.get_vocab()
    new_tokens = sorted((t for t, i in vocab.items() if i >= base), key=vocab.__getitem__)
    settings = wordpiece_settings(teacher_tokenizer)
    teacher_vocab = teacher_tokenizer.get_vocab()
    prefix = settings.get("continuing_subword_prefix", "##")
    pieces = [teacher_pieces(t, teacher_vocab, teacher_tokenizer.unk_token_id, prefix) for t in new_tokens]
    student = student_from_teacher_layers(teacher, recipe.student.layers)
    initialise_new_embeddings(student, teacher, pieces, base)
    return student, tokenizer, base


def _expanded_tokenizer(
    recipe: DistillRecipe, teacher_tokenizer: PreTrainedTokenizerBase, folder: Path, accelerator: Accelerator
) -> PreTrainedTokenizerBase:
    """Build the expanded tokenizer once per run (main process), then load it everywhere."""
    cfg = recipe.student.vocab_expansion
    if accelerator.is_main_process and not (folder / "tokenizer.json").is_file():
        files = resolve_corpus_files(cfg.corpus or recipe.data.train)
        domain = train_domain_vocabulary(
            iter_lines(files, cfg.max_lines), teacher_tokenizer, cfg.vocab_size, cfg.min_frequency
        )
        new_tokens = select_new_tokens(domain, teacher_tokenizer, cfg.vocab_size - len(teacher_tokenizer))
        atomic_directory(folder, expand_tokenizer(teacher_tokenizer, new_tokens).save_pretrained)
    accelerator.wait_for_everyone()
    return load_tokenizer(str(folder))
