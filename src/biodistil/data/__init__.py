"""Data: corpora, masking, transfer sets and task-file readers."""
