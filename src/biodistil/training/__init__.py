"""Training: the one engine every stage runs on (`engine`), its checkpoints (`checkpoint`), run folders and stages
(`run`), what a run records about itself (`provenance`) and the model card written from those records (`card`)."""
