"""`biodistil export MODEL --out DIR`: ONNX graphs (fp32, int8) of a fine-tuned model or a masked LM; `predict` and
`serve`, which run one."""

import argparse
from pathlib import Path

from biodistil.cli.common import positive_int, probability
from biodistil.data.formats import READERS

# biodistil.documents.readers.SPAN_FORMATS, named here so that the command line imports little
SPAN_FORMATS = ("bioc", "brat", "pubtator", "span_jsonl")


def _export(args: argparse.Namespace) -> object:
    from biodistil.export.command import ExportOptions, format_export, run_export

    options = ExportOptions(int8=args.int8, int8_scheme=args.int8_scheme, fuse=not args.no_fuse, atol=args.atol,
                            task=args.task,
                            split=args.split, fold=args.fold, max_examples=args.max_examples, data_root=args.data,
                            max_int8_drop=args.max_int8_drop, int8_smooth=args.int8_smooth)
    return format_export(Path(args.out), run_export(args.model, args.out, options))


def _card(args: argparse.Namespace) -> object:
    from biodistil.training.card import write_model_card

    return write_model_card(args.folder)


def _predict(args: argparse.Namespace) -> object:
    import sys

    from biodistil.export.predict import Predictor, read_documents, write_predictions

    refuse_output_among_inputs(args.out, args.inputs)  # before anything is read: the output would replace an input
    out_format = args.out_format or (args.format if args.format in SPAN_FORMATS else "jsonl")
    predictor = Predictor(args.model, args.runtime, args.batch_size, args.threshold, args.threads, args.max_length,
                          args.device, args.int8_fallback, args.max_padding)
    if out_format != "jsonl" or args.format in SPAN_FORMATS:
        return _predict_spans(args, predictor, out_format)
    task_format = None if args.format in (None, "jsonl") else args.format
    documents = read_documents(args.inputs, args.text_field, args.pair_field, args.id_field, args.whole_files,
                               task_format=task_format)
    print(write_predictions(predictor, documents, args.out, progress=not args.quiet), file=sys.stderr, flush=True)
    return None


def _predict_spans(args: argparse.Namespace, predictor: object, out_format: str) -> None:
    """Annotated documents in and/or out (`biodistil.export.span_predict`)."""
    import sys

    from biodistil.documents.model import SpanDocument
    from biodistil.export.predict import read_documents
    from biodistil.export.span_predict import read_span_inputs, write_span_predictions

    if args.format in SPAN_FORMATS:
        documents = read_span_inputs(args.inputs, args.format)
    else:
        task_format = None if args.format in (None, "jsonl") else args.format
        documents = [SpanDocument(d.id, d.text) for d in read_documents(
            args.inputs, args.text_field, args.pair_field, args.id_field, args.whole_files, task_format=task_format)]
    if out_format == "jsonl":
        from biodistil.export.predict import Document, write_predictions

        inputs = (Document(d.id, d.text) for d in documents)
        print(write_predictions(predictor, inputs, args.out, progress=not args.quiet), file=sys.stderr, flush=True)
        return None
    print(write_span_predictions(predictor, documents, args.out, out_format), file=sys.stderr, flush=True)
    return None


def _serve(args: argparse.Namespace) -> object:
    from biodistil.errors import BiodistilError

    try:
        from biodistil.serving.command import run_serve
        from biodistil.serving.settings import BatchSettings, Limits, ServeSettings, read_api_key
    except ImportError as err:
        raise BiodistilError(f"biodistil serve needs the optional extra `serve` ({err.name} is missing): pip install "
                             "-e \".[serve]\"") from None
    settings = ServeSettings(
        args.model, args.runtime, args.host, args.port, args.threads, args.batch_size, args.max_length,
        args.threshold, args.device,
        BatchSettings(args.max_batch_tokens, args.max_wait_ms, args.max_queue),
        Limits(args.max_body_bytes, args.max_documents, args.max_chars, args.request_timeout),
        read_api_key(args.api_key_file) if args.api_key_file else None, args.max_padding)
    return run_serve(settings)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    text = "Serve a fine-tuned model or its ONNX export over HTTP, batching concurrent requests"
    parser = sub.add_parser(
        "serve", help=text,
        description=text + " (docs/deployment.md). POST /v1/predict {\"texts\": [...]} or {\"documents\": [{\"id\", "
        "\"text\"}]} answers {\"records\": [...]}, each record what `biodistil predict` writes for that text "
        "(?format=brat|pubtator|bioc|span_jsonl: the file `predict --format` writes; a body in that format is read "
        "as its input); GET "
        "/health (ready once the model is loaded and warmed up), /health/live, /v1/model, /metrics (Prometheus), "
        "/docs. Concurrent requests run together, one model call at a time: a batch takes the queued requests while "
        "their sub-words fit --max-batch-tokens. SIGTERM or Ctrl-C stops accepting, answers the requests in flight, "
        "then exits. Needs the optional extra: pip install -e \".[serve]\". Example: biodistil serve "
        "runs/ner-student/onnx --port 8000")
    parser.add_argument("model", help="model folder (a run's model/), ONNX export folder, or one .onnx file of one")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only; "
                        "0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000, help="port (8000; 0: any free port, printed)")
    parser.add_argument("--runtime", choices=["auto", "pytorch", "pytorch-bf16", "onnx", "onnx-int8"],
                        default="auto", help="as for predict: auto (default) = the fastest the folder holds")
    parser.add_argument("--threads", type=positive_int, help="CPU threads of the model call (default: the usable "
                        "cores; one call runs at a time)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where a PyTorch model runs (ONNX graphs run on the CPU)")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="windows per model call inside a "
                        "gathered batch, sorted by length (16; docs/deployment.md)")
    parser.add_argument("--max-padding", type=probability, default=0.1, help="a model call also ends before padding "
                        "would pass this share of its positions (0.1: a gathered batch mixes lengths; 1 window a call "
                        "and calls padded freely both cost more on 2 AVX2 cores, docs/deployment.md; 1: no limit)")
    parser.add_argument("--max-length", type=positive_int, help="sub-words per window (default: as predict)")
    parser.add_argument("--threshold", type=probability, default=0.5, help="multi-label: a label's probability to "
                        "keep it")
    parser.add_argument("--max-batch-tokens", type=positive_int, default=4096, help="sub-words a batch gathers from "
                        "queued requests (4096; a larger request runs alone)")
    parser.add_argument("--max-wait-ms", type=float, default=0.0, help="how long an idle model waits after a "
                        "request for others to batch with it (0 ms: under load batches gather while the model runs; "
                        "a wait only delays a lone request, docs/deployment.md)")
    parser.add_argument("--max-queue", type=positive_int, default=256, help="requests that may wait; the next is "
                        "answered 429 with Retry-After (256)")
    parser.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="largest request body (1 MiB)")
    parser.add_argument("--max-documents", type=positive_int, default=64, help="documents per request (64)")
    parser.add_argument("--max-chars", type=positive_int, default=20_000, help="characters per document (20,000)")
    parser.add_argument("--request-timeout", type=float, default=30.0, help="seconds a request may wait for its "
                        "records before it is answered 504 (30)")
    parser.add_argument("--api-key-file", help="a file whose first line is the key every client must send "
                        "(Authorization: Bearer KEY, or X-API-Key: KEY); the health probes need none")
    parser.set_defaults(run=_serve)


def refuse_output_among_inputs(out: str, inputs: list[str]) -> None:
    """Refuse `--out` when it is one of the inputs, or a .txt file inside an input folder (it would replace a
    document, or be read as one on the next run)."""
    from biodistil.errors import BiodistilError

    if out == "-":
        return
    target = Path(out).resolve()
    for given in inputs:
        source = Path(given)
        if given == "-" or not source.exists():
            continue
        if source.is_dir() and target.suffix == ".txt" and source.resolve() in target.parents:
            raise BiodistilError(f"--out {out} is inside the input folder {given}, among its .txt documents: it "
                                 "would add to or replace them; write the predictions elsewhere (e.g. --out "
                                 "predictions.jsonl)")
        if source.is_dir() and target == source.resolve():
            raise BiodistilError(f"--out {out} is the input folder {given}: the predictions would replace it; write "
                                 "them to another folder (e.g. --out predicted/)")
        if source.is_file() and (target == source.resolve() or (target.exists() and target.samefile(source))):
            raise BiodistilError(f"--out {out} is the input {given}: the predictions would replace it; choose another "
                                 "output file (e.g. --out predictions.jsonl)")


def _add_predict(sub: argparse._SubParsersAction) -> None:
    text = "Run a fine-tuned model or its ONNX export on documents: entities with character offsets, or labels"
    parser = sub.add_parser(
        "predict", help=text,
        description=text + ". Example: biodistil predict runs/ner-student/onnx notes/ --out entities.jsonl. Inputs: "
        "plain text files (a document per line; --whole-files: a document per file), folders of .txt files, JSON "
        "lines (.jsonl/.json, --text-field), - for standard input, or task files (--format). Output: one JSON line "
        "per document with its id: token classifiers give {start, end, text, label, score} per entity (character "
        "offsets into the document; long documents are read in windows of whole words); classifiers give the label "
        "and every class's probability (multi-label: the labels over --threshold). Written atomically; - writes to "
        "standard output.")
    parser.add_argument("model", help="model folder (a run's model/), ONNX export folder, or one .onnx file of one")
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="text file, folder of .txt files, .jsonl, or -")
    parser.add_argument("--out", required=True, help="JSON-lines output file, or - for standard output; a folder "
                        "for brat, a file for the other span formats")
    parser.add_argument("--runtime", choices=["auto", "pytorch", "pytorch-bf16", "onnx", "onnx-int8"],
                        default="auto", help="auto (default): the fastest the folder holds (int8, then fp32 ONNX, "
                        "then PyTorch float32); pytorch-bf16: a model folder under bf16 autocast, for a GPU or a CPU "
                        "with bf16 instructions (amx_bf16, avx512_bf16; docs/deployment.md: its speed and agreement)")
    parser.add_argument("--text-field", default="text", help="JSON lines: the field holding the text (text)")
    parser.add_argument("--pair-field", help="JSON lines: the field holding a pair classifier's second text")
    parser.add_argument("--id-field", default="id", help="JSON lines: the field holding the record's id (id)")
    parser.add_argument("--whole-files", action="store_true", help="one document per text file, not per line")
    parser.add_argument("--format", choices=["jsonl", *sorted(READERS), *SPAN_FORMATS], help="jsonl (default): plain "
                        "inputs, JSON lines out; brat, pubtator, bioc, span_jsonl: annotated documents of that format "
                        "in (brat: a folder of .txt, .ann not needed; their spans unused) and the predicted ones out in"
                        " "
                        "the same format, character offsets into the original text (brat: one .ann beside each .txt); "
                        "a task format (biobert_ner_tsv, ...): the inputs are task files (their sentences; labels "
                        "unused)")
    parser.add_argument("--out-format", choices=["jsonl", *SPAN_FORMATS], help="write the predictions in this format "
                        "instead (default: --format when it is a span format, else jsonl); e.g. plain .txt inputs "
                        "--out-format pubtator")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="windows per batch (64, as evaluation "
                        "scores), grouped by length")
    parser.add_argument("--max-padding", type=probability, help="a batch also ends before padding would pass this "
                        "share of its positions (as `serve --max-padding`; default: none)")
    parser.add_argument("--threshold", type=probability, default=0.5,
                        help="multi-label: a label's probability to keep it")
    parser.add_argument("--max-length", type=positive_int, help="sub-words per window (default: the length the "
                        "model's run was fine-tuned with, from its run folder; else the model's limit, at most 512)")
    parser.add_argument("--threads", type=positive_int, help="CPU threads for ONNX Runtime (default: torch's)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where a PyTorch model runs: auto (default) = a CUDA GPU when one is visible; ONNX graphs "
                        "run on the CPU (ONNX Runtime's CPU provider)")
    parser.add_argument("--int8-fallback", type=probability, metavar="MARGIN", help="with an int8 graph: predict again "
                        "with the export's fp32 graph every window whose int8 prediction is unsure — a word's two most "
                        "probable tags (a classifier's two classes) closer than MARGIN in probability, e.g. 0.1 "
                        "(docs/deployment.md: how much agreement it buys and what it costs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=_predict)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `export`, `card`, `predict` and `serve` subcommands to the `biodistil` parser."""
    _add_predict(sub)
    _add_serve(sub)
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
    parser.add_argument("--int8-scheme", choices=["auto", "per-tensor", "per-channel", "blockwise"], default="auto",
                        help="per-tensor or per-channel: int8 weights with one scale per tensor or per column, "
                        "activations per tensor (fast); blockwise: weights and activations in blocks of 128 (closer "
                        "to fp32, slower); auto (default) makes per-tensor and per-channel and ships the one the "
                        "accuracy gate picks (with --task: the smaller drop; without: the smaller logit drift "
                        "against PyTorch)")
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
    parser.add_argument("--int8-smooth", type=float, metavar="ALPHA",
                        help="before quantising, move the activations' outlier channels into the weights "
                        "(SmoothQuant, migration strength ALPHA in (0, 1), e.g. 0.8), calibrated on the task's dev "
                        "split (its training split when --split dev); needs --task and per-column weights (auto then "
                        "makes per-channel alone). Keeps the dynamic int8 kernels' speed, and some of the agreement "
                        "they lose")
    parser.set_defaults(run=_export)
    card = sub.add_parser("card", help="Write a run's model card (model/README.md) again from its records",
                          description="Write the model card of a run folder (DIR/model/README.md: the Hub's YAML "
                          "header with base_model, pipeline_tag, tags, datasets, license and model-index, then how the "
                          "model was made, its evaluation, provenance and limitations) from the run's config.yaml, "
                          "metrics and provenance.json. Runs that export a model write it themselves.")
    card.add_argument("folder", metavar="DIR", help="run folder (or its model/ folder)")
    card.set_defaults(run=_card)
