"""Vocabulary expansion (VE-KD): domain WordPiece tokens the teacher lacks, appended to the student's vocabulary.

The expanded vocabulary keeps every teacher id unchanged and gives the new tokens the ids |V_T|, |V_T| + 1, ...,
so "id ≥ |V_T|" is exactly "new token", and the first |V_T| logit columns of the student are the teacher's
vocabulary. A new token's embedding starts as the mean of the teacher's embeddings of the pieces the teacher's
WordPiece splits it into.
"""

import json
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from biodistil.errors import BiodistilError

SPECIAL_KEYS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "bos_token", "eos_token")


def wordpiece_settings(tokenizer: PreTrainedTokenizerBase) -> dict:
    """The teacher's WordPiece model description (vocab, unk token, continuation prefix); fails for BPE etc."""
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    if model.get("type") != "WordPiece":
        raise BiodistilError(
            f"Vocabulary expansion needs a WordPiece teacher tokenizer (BERT family); this one is "
            f"{model.get('type')}"
        )
    return model


def train_domain_vocabulary(
    lines: Iterable[str], teacher_tokenizer: PreTrainedTokenizerBase, vocab_size: int, min_frequency: int = 2
) -> list[str]:
    """Tokens of a WordPiece vocabulary trained on `lines` with the teacher's normaliser and pre-tokeniser,
    in the trainer's id order (special tokens, alphabet, then merges)."""
    settings = wordpiece_settings(teacher_tokenizer)
    prefix = settings.get("continuing_subword_prefix", "##")
    tokenizer = Tokenizer(models.WordPiece(unk_token=settings["unk_token"], continuing_subword_prefix=prefix))
    backend = teacher_tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        tokenizer.normalizer = backend.normalizer
    if backend.pre_tokenizer is not None:
        tokenizer.pre_tokenizer = backend.pre_tokenizer
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(teacher_tokenizer.all_special_tokens),
        continuing_subword_prefix=prefix,
    )
    tokenizer.train_from_iterator((line for line in lines if line.strip()), trainer=trainer)
    vocab = tokenizer.get_vocab()
    return sorted(vocab, key=vocab.__getitem__)


def select_new_tokens(
    domain_tokens: Iterable[str], teacher_tokenizer: PreTrainedTokenizerBase, count: int
) -> list[str]:
    """The first `count` domain tokens that are neither in the teacher's vocabulary nor special."""
    known = set(teacher_tokenizer.get_vocab()) | set(teacher_tokenizer.all_special_tokens)
    return [token for token in domain_tokens if token not in known][: max(count, 0)]


def expand_tokenizer(teacher_tokenizer: PreTrainedTokenizerBase, new_tokens: list[str]) -> PreTrainedTokenizerFast:
    """The teacher's tokenizer with `new_tokens` appended to its WordPiece vocabulary (ids |V_T|, |V_T|+1, ...).

    New tokens join the WordPiece vocabulary itself (not "added tokens"), so greedy longest-match splitting
    uses them inside words exactly like the original pieces.
    """
    data = json.loads(teacher_tokenizer.backend_tokenizer.to_str())
    wordpiece_settings(teacher_tokenizer)
    vocab: dict[str, int] = data["model"]["vocab"]
    base = len(teacher_tokenizer)
    if max(vocab.values(), default=-1) >= base:
        raise BiodistilError(f"The teacher's vocabulary has ids beyond its size {base}; cannot append tokens")
    for offset, token in enumerate(new_tokens):
        vocab[token] = base + offset
    specials = {key: getattr(teacher_tokenizer, key) for key in SPECIAL_KEYS if getattr(teacher_tokenizer, key)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        model_max_length=teacher_tokenizer.model_max_length, **specials,
    )


def teacher_pieces(token: str, vocab: Mapping[str, int], unk_id: int, prefix: str = "##") -> list[int]:
    """Greedy longest-match-first WordPiece split of one vocabulary entry with the teacher's vocabulary.

    A continuation entry ("##ocyte") is split into continuation pieces only; an entry that cannot be
    split becomes [UNK], as WordPiece does for a whole word.
    """
    continuation = token.startswith(prefix) and len(token) > len(prefix)
    word = token[len(prefix):] if continuation else token
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = (prefix if start > 0 or continuation else "") + word[start:end]
            if piece in vocab:
                pieces.append(vocab[piece])
                start = end
                break
        else:
            return [unk_id]
    return pieces or [unk_id]


def initialise_new_embeddings(
    student: PreTrainedModel, teacher: PreTrainedModel, pieces: list[list[int]], base: int
) -> None:
    """Resize the student to base + len(pieces) rows and set row base + i to mean_p E_T[p] over the teacher
    pieces p of new token i (also the untied output rows and the MLM output bias, when the model has them)."""
    student.resize_token_embeddings(base + len(pieces), mean_resizing=False)
    if not pieces:
        return
    flat = torch.tensor([p for ids in pieces for p in ids], dtype=torch.long)
    offsets = torch.tensor([0, *torch.tensor([len(ids) for ids in pieces]).cumsum(0)[:-1].tolist()])
    rows = torch.arange(base, base + len(pieces))
    with torch.no_grad():
        _set_rows(student.get_input_embeddings().weight, teacher.get_input_embeddings().weight, flat, offsets, rows)
        s_out, t_out = student.get_output_embeddings(), teacher.get_output_embeddings()
        if s_out is not None and t_out is not None:
            if s_out.weight is not student.get_input_embeddings().weight:
                _set_rows(s_out.weight, t_out.weight, flat, offsets, rows)
            if getattr(s_out, "bias", None) is not None and getattr(t_out, "bias", None) is not None:
                _set_rows(s_out.bias[:, None], t_out.bias[:, None], flat, offsets, rows)


def _set_rows(target: torch.Tensor, source: torch.Tensor, flat: torch.Tensor, offsets: torch.Tensor,
              rows: torch.Tensor) -> None:
    """target[rows[i]] = mean of source[flat[offsets[i]:offsets[i + 1]]] (an embedding bag in mean mode)."""
    means = F.embedding_bag(flat, source.detach().float(), offsets, mode="mean")
    target[rows] = means.to(target.dtype)
