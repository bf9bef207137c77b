"""Data: plain-text corpora packed into memory-mapped blocks (`corpus`), MLM masking, dynamic or static (`masking`),
WordPiece vocabularies (`vocab`), task-file readers with file:line errors (`formats`), word ↔ sub-word alignment
(`alignment`) and the data folder (`paths`). Transfer sets live in `biodistil.kd.transfer`."""
