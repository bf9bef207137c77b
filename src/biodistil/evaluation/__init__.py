"""Evaluation: `biodistil evaluate` (models × tasks × seeds × folds, each cell a fine-tuning run: `recipe`,
`runner`), its `results.json` (`results`), reports and plots (`aggregate`, `report`, `plots`), speed (`bench`),
fine-tuned models and their ONNX exports scored without training (`deployed`) and the `export` command
(`onnx_export`). The task registry and the official metrics are in `biodistil.tasks`."""
