"""Recipes of the task-agnostic tests: a tiny distillation (`distill_recipe`) and one from a teacher cache
(`cache_recipe`), shared by the single-process tests and the launched ones (test_multiprocess)."""

from biodistil.config import DistillRecipe, validate_recipe


def distill_recipe(teacher_dir, corpus_file, out, **train) -> DistillRecipe:
    return validate_recipe(DistillRecipe, {
        "run": {"output_dir": str(out), "seed": 3},
        "teacher": {"name_or_path": str(teacher_dir)},
        "student": {"init": "architecture", "architecture": {
            "num_layers": 2, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32,
            "max_position_embeddings": 64}},
        "data": {"train": [str(corpus_file)], "block_size": 32, "cache_dir": str(out.parent / "cache"),
                 "eval_fraction": 0.05},
        "objective": {"temperature": 2.0, "terms": [
            {"loss": "mlm", "weight": 2.0}, {"loss": "logit_kl", "weight": 5.0}, {"loss": "hidden_cosine"}]},
        "train": {"max_steps": 20, "batch_size": 8, "learning_rate": 3e-3, "warmup_steps": 0, "eval_every": 10,
                  "save_every": 10, "log_every": 5, "progress_bar": False, "tensorboard": False, **train},
    })


TERMS = [{"loss": "mlm", "weight": 2.0}, {"loss": "logit_kl", "weight": 5.0, "positions": "masked"},
         {"loss": "hidden_cosine"}]


def cache_recipe(teacher_dir, corpus_file, tmp_path, out="run", top_k=16, logits="top_k", **train) -> DistillRecipe:
    """DistilBERT's triple loss (KL at the masked positions) from a cache (of top-k logits unless `logits` says
    otherwise), static masks with 2 patterns; 339 blocks (322 for training: 40 batches of 8 per epoch), caches of 3
    shards per pattern."""
    return validate_recipe(DistillRecipe, {
        "run": {"output_dir": str(tmp_path / out), "seed": 3},
        "teacher": {"name_or_path": str(teacher_dir), "dtype": "float32"},
        "student": {"init": "teacher_layers", "layers": [0, 2]},
        "data": {"train": [str(corpus_file)], "block_size": 32, "cache_dir": str(tmp_path / "corpus"),
                 "eval_fraction": 0.05},
        "masking": {"duplication": 2},
        "objective": {"temperature": 2.0, "terms": TERMS},
        "teacher_cache": {"logits": logits, "top_k": top_k, "shard_blocks": 128, "dir": str(tmp_path / "cache")},
        "train": {"max_steps": 50, "batch_size": 8, "learning_rate": 3e-3, "warmup_steps": 0, "eval_every": 10,
                  "save_every": 10, "log_every": 5, "progress_bar": False, "tensorboard": False, **train},
    })
