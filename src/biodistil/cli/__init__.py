"""The `biodistil` command line: a thin layer that reads recipes and calls the pipeline.

`main` (the parser, task-agnostic commands and the demo), `task_commands` (finetune, kd, transfer, study),
`eval_commands` (evaluate, report, bench), `export_commands` (export, card, predict), `model_commands` (`models list`
and `models fetch`) and `common` (the `COMMAND RECIPE.yaml [key=value ...]` shape).
"""
