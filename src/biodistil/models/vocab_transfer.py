"""A student made of teacher layers that reads a vocabulary of its own: its embeddings from the teacher's.

Each student token gets the teacher's embedding (and MLM output bias) of the text it stands for, read through the
teacher's vocabulary:

- **special tokens** by role: the student's [CLS], [SEP], [PAD], [MASK], [UNK] take the teacher's token of the same
  role (its cls / bos, sep / eos ...), or its unknown token;
- **copied**: a token whose string the teacher's vocabulary holds ("cell", "##ase" in two WordPiece vocabularies), or
  whose text the teacher writes as one token (a cased "Protein" beside an uncased teacher's "protein"; "protein"
  beside a byte-level BPE's "Ġprotein"), takes that token's row;
- **averaged**: any other token takes the mean of the rows of the pieces the teacher splits its text into (VE-KD's
  rule for new tokens, `biodistil.models.vocab_expansion`): a WordPiece teacher splits it with its own greedy
  longest-match (continuation pieces for a "##" token), after its normaliser (lowercasing, accents); another teacher
  tokenizes the text, with the leading space a byte-level BPE writes before a word ("Ġ") unless the token continues
  a word;
- a token the teacher can only read as its unknown token takes the teacher's unknown row.

The transformer layers, positions and the head's transform stay the teacher's; the decoder follows the embeddings
(tied) or gets the same rows (untied).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass

from tokenizers import Tokenizer
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from biodistil.models.vocab_expansion import initialise_new_embeddings, teacher_pieces

ROLES = (("cls_token_id", "bos_token_id"), ("sep_token_id", "eos_token_id"), ("pad_token_id",), ("mask_token_id",),
         ("unk_token_id",), ("bos_token_id", "cls_token_id"), ("eos_token_id", "sep_token_id"))


@dataclass(frozen=True)
class VocabularyTransfer:
    """How the student's rows were made: tokens copied from one teacher row, averaged over several, or unknown."""

    copied: int
    averaged: int
    unknown: int

    @classmethod
    def of(cls, pieces: list[list[int]], unknown: int | None) -> "VocabularyTransfer":
        """The counts of `vocabulary_pieces`' answer (`unknown`: the teacher's unknown token id)."""
        return cls(sum(len(p) == 1 and p[0] != unknown for p in pieces), sum(len(p) > 1 for p in pieces),
                   sum(p == [unknown] for p in pieces))

    def note(self) -> str:
        total = self.copied + self.averaged + self.unknown
        return (f"Student vocabulary of {total:,} tokens: {self.copied:,} embeddings copied from the teacher's token "
                f"of the same text, {self.averaged:,} averaged over the teacher's pieces of it, {self.unknown:,} from "
                "its unknown token.")


def transfer_vocabulary(student: PreTrainedModel, teacher: PreTrainedModel,
                        student_tokenizer: PreTrainedTokenizerBase,
                        teacher_tokenizer: PreTrainedTokenizerBase) -> VocabularyTransfer:
    """Give `student` (teacher layers, teacher vocabulary) the vocabulary of `student_tokenizer`: its embedding rows
    and MLM output bias as the module docstring says, its config's special-token ids the student tokenizer's."""
    pieces = vocabulary_pieces(student_tokenizer, teacher_tokenizer)
    initialise_new_embeddings(student, teacher, pieces, 0)
    embeddings = student.get_input_embeddings()
    embeddings.padding_idx = student_tokenizer.pad_token_id
    for name in ("pad_token_id", "cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id", "mask_token_id"):
        if hasattr(student.config, name) and getattr(student_tokenizer, name, None) is not None:
            setattr(student.config, name, getattr(student_tokenizer, name))
    return VocabularyTransfer.of(pieces, teacher_tokenizer.unk_token_id)


def vocabulary_pieces(student_tokenizer: PreTrainedTokenizerBase,
                      teacher_tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """For every student token id 0..|V_S|−1, the teacher token ids whose rows it takes (one: copied)."""
    vocab = student_tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = _special_map(student_tokenizer, teacher_tokenizer)
    split = _teacher_splitter(teacher_tokenizer)
    prefix = _continuation_prefix(student_tokenizer)
    teacher_vocab = teacher_tokenizer.get_vocab()
    pieces = []
    for token in tokens:
        if vocab[token] in special:
            pieces.append([special[vocab[token]]])
        elif token in teacher_vocab:
            pieces.append([teacher_vocab[token]])
        else:
            continuation = bool(prefix) and token.startswith(prefix) and len(token) > len(prefix)
            pieces.append(split(token[len(prefix):] if continuation else token, continuation))
    return pieces


def _special_map(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> dict[int, int]:
    """Student special-token id → the teacher's token of the same role (its unknown token when it has none)."""
    mapping = {}
    for names in ROLES:
        student_id = getattr(student, names[0], None)
        teacher_ids = [getattr(teacher, name, None) for name in names]
        found = next((i for i in teacher_ids if i is not None), teacher.unk_token_id)
        if student_id is not None and student_id not in mapping and found is not None:
            mapping[student_id] = found
    for student_id in student.all_special_ids:
        mapping.setdefault(student_id, teacher.unk_token_id)
    return mapping


def _continuation_prefix(tokenizer: PreTrainedTokenizerBase) -> str:
    model = json.loads(tokenizer.backend_tokenizer.to_str()).get("model") or {}
    return model.get("continuing_subword_prefix") or "" if model.get("type") == "WordPiece" else ""


def _teacher_splitter(teacher: PreTrainedTokenizerBase) -> Callable[[str, bool], list[int]]:
    """(text, continues a word) → the teacher's pieces of the text (module docstring)."""
    spec = json.loads(teacher.backend_tokenizer.to_str())
    unknown = teacher.unk_token_id
    if (spec.get("model") or {}).get("type") == "WordPiece":
        vocab, prefix = teacher.get_vocab(), _continuation_prefix(teacher)
        normalizer = teacher.backend_tokenizer.normalizer

        def wordpiece(text: str, continuation: bool) -> list[int]:
            text = normalizer.normalize_str(text) if normalizer is not None else text
            return teacher_pieces(prefix + text if continuation else text, vocab, unknown, prefix) if text \
                else [unknown]

        return wordpiece
    backend = Tokenizer.from_str(teacher.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    space = "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))

    def encoded(text: str, continuation: bool) -> list[int]:
        ids = backend.encode(text if continuation or not space else f" {text}", add_special_tokens=False).ids
        return ids or [unknown]

    return encoded
