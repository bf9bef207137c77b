"""`biodistil export MODEL --out DIR`: ONNX graphs (fp32, int8) of a fine-tuned model or a masked LM."""

import argparse
from pathlib import Path


def _export(args: argparse.Namespace) -> object:
    from biodistil.export.command import ExportOptions, format_export, run_export

    options = ExportOptions(int8=args.int8, int8_scheme=args.int8_scheme, fuse=not args.no_fuse, atol=args.atol,
                            task=args.task,
                            split=args.split, fold=args.fold, max_examples=args.max_examples, data_root=args.data,
                            max_int8_drop=args.max_int8_drop)
    return format_export(Path(args.out), run_export(args.model, args.out, options))


def _card(args: argparse.Namespace) -> object:
    from biodistil.training.card import write_model_card

    return write_model_card(args.folder)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `export` subcommand to the `biodistil` parser."""
    text = "Export a fine-tuned model (or a masked LM) to ONNX, optionally int8, checked against PyTorch"
    parser = sub.add_parser(
        "export", help=text,
        description=text + ". BERT-family graphs (BERT, RoBERTa, DistilBERT) are fused by ONNX Runtime's transformer "
        "optimizer (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization); other families are "
        "exported unfused, with a note. The fp32 graph's outputs must match PyTorch's at several lengths before "
        "anything is written; with --task, PyTorch fp32, ONNX fp32 and both int8 graphs (per-tensor, per-channel) are "
        "scored side by side and the accuracy gate picks the int8 graph that ships (none, if neither is within "
        "--max-int8-drop). Needs the optional extra: pip install -e \".[export]\". Example: biodistil export "
        "runs/ner-student/model --out runs/ner-student/onnx --int8 --task ncbi_disease --split dev "
        "--max-int8-drop 0.01",
    )
    parser.add_argument("model", help="fine-tuned model folder (token, sequence or multi-label classifier) or a "
                        "masked-LM folder")
    parser.add_argument("--out", required=True, help="export folder (written atomically; an earlier export there is "
                        "replaced)")
    parser.add_argument("--int8", action="store_true", help="also write model.int8.onnx (dynamic int8 quantisation)")
    parser.add_argument("--int8-scheme", choices=["auto", "per-tensor", "per-channel"], default="auto",
                        help="int8 weights' scales: one per tensor or one per column; auto (default) makes both and "
                        "ships the one the accuracy gate picks (with --task: the smaller drop; without: the smaller "
                        "logit drift against PyTorch)")
    parser.add_argument("--no-fuse", action="store_true", help="export the unfused graph (dynamo exporter) even "
                        "where ONNX Runtime's transformer optimizer could fuse it")
    parser.add_argument("--atol", type=float, default=1e-3,
                        help="bound on the largest |ONNX fp32 - PyTorch| logit difference (1e-3)")
    parser.add_argument("--task", help="score PyTorch fp32, ONNX fp32 and ONNX int8 on this task (built-in name or "
                        "task YAML)")
    parser.add_argument("--split", choices=["dev", "test"], default="test", help="the task's split (test)")
    parser.add_argument("--fold", type=int, help="cross-validation tasks: the fold")
    parser.add_argument("--max-examples", type=int, help="score a fixed subset of the split (quick checks)")
    parser.add_argument("--data", help="data folder (default: $BIODISTIL_DATA, else ../shared/data)")
    parser.add_argument("--max-int8-drop", type=float, metavar="DROP",
                        help="ship no int8 graph scoring more than DROP below PyTorch fp32 on the task (headline "
                        "metric, 0-1 scale: 0.01 = 1 point); when neither scheme passes, only the fp32 graph is "
                        "written")
    parser.set_defaults(run=_export)
    card = sub.add_parser("card", help="Write a run's model card (model/README.md) again from its records",
                          description="Write the model card of a run folder (DIR/model/README.md: the Hub's YAML "
                          "header with base_model, pipeline_tag, tags, datasets, license and model-index, then how the "
                          "model was made, its evaluation, provenance and limitations) from the run's config.yaml, "
                          "metrics and provenance.json. Runs that export a model write it themselves.")
    card.add_argument("folder", metavar="DIR", help="run folder (or its model/ folder)")
    card.set_defaults(run=_card)
