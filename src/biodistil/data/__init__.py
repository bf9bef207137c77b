"""Data: plain-text corpora packed into memory-mapped blocks (`corpus`), MLM masking, dynamic or static (`masking`),
WordPiece vocabularies (`vocab`), task-file readers with file:line errors (`formats`), word ↔ sub-word alignment
(`alignment`), the data folder (`paths`), the typed batch of every training stage (`batch`), two tokenizers of one
text aligned through its words (`token_alignment`, `shared_vocabulary`, `text_blocks`: distillation across
tokenizers) and synthetic data for checks with no data set (`synthetic`). Transfer sets live in
`biodistil.kd.transfer`."""
