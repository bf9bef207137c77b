"""Synthetic data for checks that must run with no data set and no network: a corpus of biomedical-looking sentences,
a ModernBERT-style byte-level BPE tokenizer trained on it, a BERT WordPiece tokenizer of a chosen size, random
encoders of a chosen shape, and a BioBERT-format NER task. `bench/gpu_check.py`, `bench/gpu_study.py` and the tests
build their models and tasks from these; nothing here is meant to teach a model anything real."""

import json
import random
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def synthetic_corpus(words: Sequence[str], lines: int, seed: int = 0, length: tuple[int, int] = (6, 18)) -> str:
    """`lines` sentences of `words` drawn at random (`length` words each, inclusive), each ending in " .", with a blank
    line after every 5th (documents of 5 sentences)."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(*length))) + " .")
        if i % 5 == 4:
            out.append("")
    return "\n".join(out) + "\n"


def train_bpe(lines: list[str], vocab_size: int, folder: Path) -> PreTrainedTokenizerFast:
    """A ModernBERT-style tokenizer: byte-level BPE without a prefix space, [CLS] A [SEP] (B [SEP]), and no
    token_type_ids; trained on `lines` with the `tokenizers` library, saved to `folder` and loaded back as transformers
    does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(lines, trainer)
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                        model_input_names=["input_ids", "attention_mask"])
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def write_ner_task(folder: Path, name: str, entities: Sequence[str], others: Sequence[str], sizes: dict[str, int],
                   seed: int = 0, length: tuple[int, int] = (5, 30), max_length: int = 16) -> Path:
    """A one-type NER task in BioBERT TSV (a file per split of `sizes`) and its task YAML `folder/<name>.yaml`:
    words drawn from `entities` + `others`; an entity word is B, or I right after another entity."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = [*entities, *others]
    files = {}
    for split, size in sizes.items():
        lines = []
        for _ in range(size):
            previous = "O"
            for _ in range(rng.randint(*length)):
                word = rng.choice(vocabulary)
                tag = ("I" if previous != "O" else "B") if word in entities else "O"
                lines.append(f"{word}\t{tag}")
                previous = tag
            lines.append("")
        path = folder / f"{split}.tsv"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        files[split] = str(path)
    spec = folder / f"{name}.yaml"
    spec.write_text(json.dumps({"name": name, "kind": "token_classification", "format": "biobert_ner_tsv",
                                "files": files, "labels": ["O", "B", "I"], "metric": "entity_f1",
                                "max_length": max_length, "truncation": "split"}), encoding="utf-8")
    return spec


WORDS = ["the", "protein", "kinase", "gene", "expression", "cell", "tumour", "patients", "mutation", "receptor",
         "binding", "inhibitor", "disease", "cancer", "mice", "induced", "levels", "increased", "decreased",
         "activation", "pathway", "signalling", "transcription", "factor", "apoptosis", "therapy", "clinical", "trial",
         "dose", "response", "antibody", "antigen", "immune", "infection", "virus", "resistance", "cytokine", "liver",
         "renal"]
ENTITIES = ("carcinoma", "leukemia", "melanoma", "diabetes", "asthma", "fibrosis", "sarcoma", "glioma")


def biomedical_corpus(lines: int, seed: int) -> str:
    """Sentences of biomedical-looking words and filler words of `wordpiece_tokenizer`'s vocabulary, documents of 5."""
    return synthetic_corpus([*WORDS, *ENTITIES, *(f"w{i}" for i in range(600))], lines, seed, length=(8, 40))


def wordpiece_tokenizer(folder: Path, size: int):
    """An uncased BERT WordPiece tokenizer ([CLS] a [SEP] b [SEP]) of exactly `size` entries: BERT's specials, the
    synthetic words, letters and their ## forms, then filler entries; saved to `folder`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *letters, *(f"##{c}" for c in letters),
             *WORDS, *ENTITIES, *(f"w{i}" for i in range(600))]
    vocab += [f"x{i}" for i in range(size - len(vocab))]
    backend = Tokenizer(models.WordPiece({token: i for i, token in enumerate(vocab[:size])}, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]", do_lower_case=True,
                                        model_max_length=512)
    tokenizer.save_pretrained(folder)
    return tokenizer


def random_encoder(family: str, shape: tuple[int, int, int], tokenizer, seed: int, folder: Path) -> Path:
    """Random weights of `shape` (layers, width, heads) saved with `tokenizer`: a BERT masked LM, or an MPNet encoder
    without an MLM head (as mpnet-base is published)."""
    import torch
    from transformers import MPNetConfig, MPNetModel

    from biodistil.config import ArchitectureConfig
    from biodistil.models.student import model_from_architecture

    n, d, h = shape
    torch.manual_seed(seed)
    if family == "mpnet":
        model = MPNetModel(MPNetConfig(vocab_size=len(tokenizer), hidden_size=d, num_hidden_layers=n,
                                       num_attention_heads=h, intermediate_size=4 * d, max_position_embeddings=514,
                                       pad_token_id=tokenizer.pad_token_id), add_pooling_layer=False)
    else:
        model = model_from_architecture(ArchitectureConfig(num_layers=n, hidden_size=d, num_heads=h,
                                                           intermediate_size=4 * d, max_position_embeddings=512),
                                        tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
