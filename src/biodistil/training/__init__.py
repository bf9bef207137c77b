"""Training: the one engine every stage runs on (`engine`), the order an epoch visits examples (`sampling`), its
checkpoints (`checkpoint`), run folders and stages (`run`), what a run records about itself (`provenance`) and the
model card written from those records (`card`); the machine record and the decisions made from it (`machine`),
CPU threads (`threads`), `train.compile` (`compiling`), the processes of a launch (`processes`) and runs side by
side in worker processes (`pool`)."""
