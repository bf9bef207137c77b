"""Records/s of `biodistil predict` writing annotated documents (brat, PubTator, BioC, span JSON lines) against
writing JSON lines, on the same documents with the same model.

    python bench/research/predict_formats.py runs/kd-bc5cdr-pubtator/onnx \
        ../shared/data/ner/bc5cdr_pubtator/devel.pubtator

Reads the PubTator file's documents (`--documents N`, default all), then for each output runs the command's writer
(`write_predictions` for JSON lines, fed the documents' texts; `write_span_predictions` for a span format, fed the
documents) into a temporary folder, `--rounds` times round robin, each output's fastest round kept. Prints one row per
output (records/s, ratio to JSON lines) and, last, one JSON line. Tests never assert on these timings.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from biodistil.documents.readers import read_span_documents
from biodistil.export.predict import Document, Predictor, write_predictions
from biodistil.export.span_predict import write_span_predictions

OUTPUTS = {"jsonl": "x.jsonl", "brat": "brat", "pubtator": "x.pubtator", "bioc": "x.xml", "span_jsonl": "s.jsonl"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("pubtator")
    parser.add_argument("--documents", type=int)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runtime", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    documents = read_span_documents("pubtator", args.pubtator)[: args.documents]
    predictor = Predictor(args.model, args.runtime, threads=args.threads)
    best = {name: float("inf") for name in OUTPUTS}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for name, target in OUTPUTS.items():
                out = str(Path(folder) / f"{_}-{target}")
                started = time.perf_counter()
                if name == "jsonl":
                    write_predictions(predictor, [Document(d.id, d.text) for d in documents], out, progress=False)
                else:
                    write_span_predictions(predictor, documents, out, name)
                best[name] = min(best[name], time.perf_counter() - started)
    rates = {name: len(documents) / seconds for name, seconds in best.items()}
    print(f"{len(documents)} documents, {predictor.description}")
    for name, rate in rates.items():
        print(f"{name:<12} {rate:8.1f} records/s  {rate / rates['jsonl']:6.1%} of JSON lines")
    print(json.dumps({"documents": len(documents), "records_per_second": rates,
                      "ratio_to_jsonl": {name: rate / rates["jsonl"] for name, rate in rates.items()}}))


if __name__ == "__main__":
    main()
