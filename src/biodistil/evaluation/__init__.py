"""Evaluation: `biodistil evaluate` (models × tasks × seeds × folds, each cell a fine-tuning run, shared out over the
processes of a launch: `recipe`, `runner`), `evaluate --finetuned` (fine-tuned models and their ONNX exports scored
without training: `finetuned`), their `results.json` (`results`), reports and plots (`aggregate`, `report`, `plots`)
speed (`bench`) and a pipeline's `deploy` stage (export, score and time the chosen models: `deploy`). Deployed
models (ONNX export, runtime, scoring one) are in `biodistil.export`; the task registry
and the official metrics in `biodistil.tasks`."""
