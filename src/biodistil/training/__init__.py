"""Training: the one engine every stage runs on, its checkpoints and its logs."""
