"""Issue 58: `biodistil serve` — the real server on a random localhost port, spoken to over HTTP. Its records are
`Predictor`'s for the same texts; concurrent requests batched together each get their own; limits, bad input and the
API key are answered with JSON naming what is wrong (never a stack trace); readiness waits for the model; a full
queue answers 429, a request that waits too long 504; SIGTERM under load answers every accepted request."""

import asyncio
import json
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kd_fixtures import OTHER, POSITIVE, save_teacher, write_token_task

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from biodistil import Predictor  # noqa: E402
from biodistil.cli.main import main  # noqa: E402
from biodistil.serving.app import create_app  # noqa: E402
from biodistil.serving.command import bind  # noqa: E402
from biodistil.serving.service import Service  # noqa: E402
from biodistil.serving.settings import BatchSettings, Limits, ServeSettings  # noqa: E402
from biodistil.tasks.registry import get_task  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KEY = "a-test-key-of-enough-length"


def sentences(count: int, seed: int = 0, words: tuple[int, int] = (4, 14)) -> list[str]:
    """Texts of the tiny task's words: entity words and others, so that the random head tags some."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(POSITIVE + OTHER) for _ in range(rng.randint(*words))) for _ in range(count)]


@pytest.fixture(scope="module")
def ner(tmp_path_factory, teacher_dir) -> Path:
    """A token classifier (a random head on the tiny teacher: it tags arbitrary but fixed words)."""
    root = tmp_path_factory.mktemp("serve")
    task = get_task(str(write_token_task(root / "task", sizes={"train": 8, "test": 8})))
    return save_teacher(teacher_dir, task, root / "ner-model", seed=3)


@contextmanager
def live(settings: ServeSettings, load: Callable | None = None) -> Iterator[str]:
    """The app on uvicorn in a thread of this process, on a free port: its base URL until the block ends."""
    import uvicorn

    sock = bind("127.0.0.1", 0)
    app = create_app(settings, load or (lambda: Service(settings)))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(20)


def wait_ready(url: str, headers: dict | None = None, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", headers=headers).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not ready in {seconds} s")


@pytest.fixture(scope="module")
def server(ner) -> Iterator[str]:
    """The token classifier behind an API key, with small limits and a long gathering wait (concurrent requests
    batch together for certain)."""
    settings = ServeSettings(str(ner), threads=1, batching=BatchSettings(max_wait_ms=30),
                             limits=Limits(max_body_bytes=20_000, max_documents=8, max_chars=2_000), api_key=KEY)
    with live(settings) as url:
        wait_ready(url)
        yield url


AUTH = {"Authorization": f"Bearer {KEY}"}
DEFAULTS = ServeSettings("")


def predictor_as_served(model: Path) -> Predictor:
    """A `Predictor` that batches windows as the server does by default (an int8 graph's scales follow its batch)."""
    return Predictor(model, threads=1, batch_size=DEFAULTS.batch_size, max_padding=DEFAULTS.max_padding)


def close(served: list[dict], expected: list[dict]) -> None:
    """Records equal but for the last digit of a score (another batch pads the same text otherwise)."""
    assert len(served) == len(expected)
    for mine, theirs in zip(served, expected, strict=True):
        assert mine["id"] == theirs["id"]
        assert [(e["start"], e["end"], e["text"], e["label"]) for e in mine["entities"]] == \
            [(e["start"], e["end"], e["text"], e["label"]) for e in theirs["entities"]]
        assert all(abs(a["score"] - b["score"]) <= 2e-4 for a, b in zip(mine["entities"], theirs["entities"],
                                                                       strict=True))


def test_records_are_predicts_records(server, ner):
    """One request alone is one `Predictor` call on its documents: exactly the records of a `Predictor` with the
    server's settings (--batch-size, --max-padding), ids included."""
    texts = [*sentences(6, seed=1), "  protein\tkinase — α-synuclein\n\nbinding  receptor gene "]
    expected = predictor_as_served(ner)(texts)
    response = httpx.post(f"{server}/v1/predict", json={"texts": texts}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json() == {"records": expected}
    assert sum(len(r["entities"]) for r in expected) > 0, "the random head tags some words: the check is not empty"
    documents = [{"id": f"doc-{i}", "text": text} for i, text in enumerate(texts)]
    named = httpx.post(f"{server}/v1/predict", json={"documents": documents, "format": "jsonl"}, headers=AUTH)
    assert named.json()["records"] == [{**r, "id": f"doc-{i}"} for i, r in enumerate(expected)]
    for name in ("x-total-time", "x-queue-time", "x-inference-time", "x-tokenization-time"):
        assert float(response.headers[name]) >= 0
    assert int(response.headers["x-batch-size"]) == len(texts) and int(response.headers["x-compute-tokens"]) > 0


def test_concurrent_requests_each_get_their_own_records(server, ner):
    """Thirty requests at once, of one to three documents each, run in shared batches (one model call at a time);
    each answer holds its own documents' records, in its order — every fifth asks for PubTator, and gets its own
    documents' PubTator text amid the records of the others."""
    from biodistil.documents.model import SpanDocument
    from biodistil.documents.writers import pubtator_file_text

    requests = [sentences(1 + i % 3, seed=100 + i) for i in range(30)]
    formats = ["pubtator" if i % 5 == 4 else "jsonl" for i in range(30)]
    predictor = Predictor(ner, threads=1)
    expected = [predictor(texts) if format_name == "jsonl" else pubtator_file_text(predictor.predict_documents(
        [SpanDocument(f"r{i}-{j}", text) for j, text in enumerate(texts)]))
        for i, (texts, format_name) in enumerate(zip(requests, formats, strict=True))]

    async def send() -> list:
        async with httpx.AsyncClient(headers=AUTH, timeout=60) as client:
            return await asyncio.gather(*[client.post(f"{server}/v1/predict?format={format_name}", json={
                "documents": [{"id": f"r{i}-{j}", "text": text} for j, text in enumerate(texts)]})
                for i, (texts, format_name) in enumerate(zip(requests, formats, strict=True))])

    answers = asyncio.run(send())
    assert [a.status_code for a in answers] == [200] * len(requests)
    for i, (answer, records) in enumerate(zip(answers, expected, strict=True)):
        if formats[i] == "pubtator":
            assert answer.text == records and f"r{i}-0|t|" in records
            continue
        close(answer.json()["records"], [{**r, "id": f"r{i}-{j}"} for j, r in enumerate(records)])
    batches = [int(a.headers["x-batch-size"]) for a in answers]
    assert max(batches) > 3, f"the requests were batched together: batch sizes {batches}"
    metrics = httpx.get(f"{server}/metrics", headers=AUTH).text
    assert re.search(r'biodistil_requests_total\{route="/v1/predict",status="200"\} \d+', metrics)
    assert "biodistil_batch_documents_bucket" in metrics and "biodistil_queue_depth 0.0" in metrics


@pytest.mark.parametrize(("body", "status", "named"), [
    (b'{"texts": ["a"' + b', "protein"' * 3000 + b"]}", 413, "--max-body-bytes"),
    (json.dumps({"texts": ["gene"] * 9}).encode(), 413, "--max-documents"),
    (json.dumps({"documents": [{"id": "long", "text": "gene " * 500}]}).encode(), 413, "--max-chars"),
    ('{"texts": ["caf\u00e9"]}'.encode("latin-1"), 400, "not UTF-8"),
    (b'{"texts": ["gene",', 400, "not JSON"),
    (b'{"texts": "gene"}', 422, "texts"),
    (b'{"texts": ["a"], "documents": []}', 422, "not both"),
    (b'{"texts": ["a"], "colour": 1}', 422, "colour"),
    (b'{"texts": ["a"], "format": "conll"}', 422, "formats: jsonl, brat, pubtator, bioc, span_jsonl"),
])
def test_limits_and_bad_input_are_answered_by_name(server, body, status, named):
    response = httpx.post(f"{server}/v1/predict", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == status and named in response.json()["error"], response.text
    assert "Traceback" not in response.text and set(response.json()) == {"error", "type"}


def test_the_api_key_is_asked_of_every_client_but_the_health_probes(server):
    body = {"texts": ["protein kinase"]}
    assert httpx.post(f"{server}/v1/predict", json=body).status_code == 401
    refused = httpx.post(f"{server}/v1/predict", json=body, headers={"Authorization": "Bearer wrong-key-xxxxxxxxx"})
    assert refused.status_code == 401 and "API key" in refused.json()["error"]
    assert refused.headers["www-authenticate"] == "Bearer"
    assert httpx.post(f"{server}/v1/predict", json=body, headers={"X-API-Key": KEY}).status_code == 200
    for route in ("/metrics", "/v1/model", "/openapi.json", "/docs"):
        assert httpx.get(f"{server}{route}").status_code == 401, route
    for route in ("/health", "/health/ready", "/health/live"):
        assert httpx.get(f"{server}{route}").status_code == 200, route


def test_model_facts_and_openapi(server, ner):
    facts = httpx.get(f"{server}/v1/model", headers=AUTH).json()
    assert facts["task"]["kind"] == "token_classification" and sorted(facts["task"]["labels"]) == ["B", "I", "O"]
    assert facts["runtime"] == "pytorch" and facts["model"] == str(ner)
    assert facts["formats"] == ["jsonl", "brat", "pubtator", "bioc", "span_jsonl"]
    assert facts["limits"]["max_documents"] == 8 and facts["batching"]["max_wait_ms"] == 30 and facts["batch1_ms"] > 0
    schema = httpx.get(f"{server}/openapi.json", headers=AUTH).json()
    body = schema["paths"]["/v1/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/PredictRequest"}
    assert set(schema["components"]["schemas"]["PredictRequest"]["properties"]) == {"texts", "documents", "format"}
    route = schema["paths"]["/v1/predict"]["post"]
    assert set(route["requestBody"]["content"]) == {"application/json", "text/plain", "application/xml"}
    assert route["parameters"][0]["name"] == "format" and "bioc" in route["parameters"][0]["schema"]["enum"]
    assert {"application/json", "text/plain; charset=utf-8", "application/xml; charset=utf-8",
            "application/x-ndjson; charset=utf-8"} <= set(route["responses"]["200"]["content"])
    assert {"$ref": "#/components/schemas/BratResponse"} in \
        route["responses"]["200"]["content"]["application/json"]["schema"]["oneOf"]
    assert set(schema["components"]["schemas"]["BratFile"]["properties"]) == {"id", "name", "ann"}
    assert httpx.get(f"{server}/nowhere", headers=AUTH).status_code == 404


def test_a_pair_classifier_answers_labels_and_probabilities(pair_task, teacher_dir, tmp_path):
    """A pair classifier's documents carry their second text; the records are `Predictor`'s: label and every
    class's probability."""
    model = save_teacher(teacher_dir, pair_task, tmp_path / "qa-model", seed=4)
    pairs = [("is protein binding", "the receptor binds the kinase in cells"), ("is dose therapy", "mice levels")]
    expected = predictor_as_served(model)(pairs)
    with live(ServeSettings(str(model), threads=1)) as url:
        wait_ready(url)
        documents = [{"id": str(i), "text": text, "text_pair": pair} for i, (text, pair) in enumerate(pairs)]
        served = httpx.post(f"{url}/v1/predict", json={"documents": documents}).json()["records"]
        annotated = httpx.post(f"{url}/v1/predict?format=pubtator", json={"texts": ["protein"]})
    assert served == expected and set(served[0]) == {"id", "label", "probabilities"}
    assert annotated.status_code == 422 and "answers in: jsonl" in annotated.json()["error"]


PUBTATOR = """101|t|Protein kinase binding in mice
101|a|The receptor gene binds the protein in tumour cells; kinase levels fall.
101	0	14	Protein kinase	Gene	D001

102|t|Receptor therapy
102|a|gene dose and binding receptor levels in patients with cancer
"""
MEDIA = {"pubtator": "text/plain; charset=utf-8", "bioc": "application/xml; charset=utf-8",
         "span_jsonl": "application/x-ndjson; charset=utf-8"}


def predicted(ner: Path, source: Path, out: Path, *how: str) -> None:
    """`biodistil predict` with the server's settings (its batches of windows, one thread)."""
    assert main(["predict", str(ner), str(source), *how, "--out", str(out), "--batch-size", str(DEFAULTS.batch_size),
                 "--max-padding", str(DEFAULTS.max_padding), "--threads", "1", "--quiet"]) == 0


def test_document_formats_are_what_predict_writes_for_the_same_documents(server, ner, tmp_path):
    """JSON documents asked for as brat, PubTator, BioC and span JSON lines (?format= or "format"): the answer is, byte
    for byte, the file `predict --out-format F` writes for the same documents as JSON lines (brat: each document's
    .ann, under the file name brat gives it), with the format's media type."""
    documents = [{"id": f"note/{i}", "text": text} for i, text in enumerate(sentences(3, seed=5))]
    documents.append({"id": "note-3", "text": "protein kinase\nbinding  gene — α receptor"})
    source = tmp_path / "notes.jsonl"
    source.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in documents), encoding="utf-8")
    for format_name, media in MEDIA.items():
        predicted(ner, source, tmp_path / f"out.{format_name}", "--out-format", format_name)
        answer = httpx.post(f"{server}/v1/predict?format={format_name}", json={"documents": documents}, headers=AUTH)
        assert answer.status_code == 200 and answer.headers["content-type"] == media, answer.text
        assert answer.content == (tmp_path / f"out.{format_name}").read_bytes(), format_name
    assert "\tprotein\t" in (tmp_path / "out.pubtator").read_text(), "the random head tags some words"
    predicted(ner, source, tmp_path / "brat", "--out-format", "brat")
    answer = httpx.post(f"{server}/v1/predict", json={"documents": documents, "format": "brat"}, headers=AUTH)
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["documents"] == [
        {"id": d["id"], "name": name, "ann": (tmp_path / "brat" / f"{name}.ann").read_text(encoding="utf-8")}
        for d, name in zip(documents, ["note_0", "note_1", "note_2", "note-3"], strict=True)]
    assert sorted(p.name for p in (tmp_path / "brat").iterdir()) == sorted(
        f"{name}.{suffix}" for name in ("note_0", "note_1", "note_2", "note-3") for suffix in ("ann", "txt"))


def test_a_body_in_a_document_format_is_answered_in_it_as_predict_answers_its_file(server, ner, tmp_path):
    """A PubTator file, a BioC XML collection, span JSON lines (sent with their own Content-Type and ?format=) and a
    brat .txt: read as `predict --format F` reads the file (title and abstract kept as passages, the gold spans checked
    and left out) and answered with the bytes it writes (a brat .txt: the .ann beside it)."""
    from biodistil.documents.readers import read_pubtator
    from biodistil.documents.writers import write_bioc, write_span_jsonl

    (tmp_path / "in.pubtator").write_text(PUBTATOR, encoding="utf-8")
    write_bioc(read_pubtator(tmp_path / "in.pubtator"), tmp_path / "in.bioc")
    write_span_jsonl(read_pubtator(tmp_path / "in.pubtator"), tmp_path / "in.span_jsonl")
    sent = {"pubtator": "text/plain", "bioc": "application/xml", "span_jsonl": "application/x-ndjson"}
    for format_name, content_type in sent.items():
        body = (tmp_path / f"in.{format_name}").read_bytes()
        predicted(ner, tmp_path / f"in.{format_name}", tmp_path / f"out.{format_name}", "--format", format_name)
        answer = httpx.post(f"{server}/v1/predict?format={format_name}", content=body,
                            headers={**AUTH, "Content-Type": content_type})
        assert answer.status_code == 200 and answer.headers["content-type"] == MEDIA[format_name], answer.text
        assert answer.content == (tmp_path / f"out.{format_name}").read_bytes(), format_name
    written = (tmp_path / "out.pubtator").read_text()
    assert "102|a|gene dose" in written and "D001" not in written, "passages kept, gold spans left out"
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "n1.txt").write_text("Protein kinase binding\nin mice: gene dose.\n", encoding="utf-8")
    predicted(ner, tmp_path / "txt", tmp_path / "brat", "--format", "brat")
    answer = httpx.post(f"{server}/v1/predict?format=brat", content=(tmp_path / "txt" / "n1.txt").read_bytes(),
                        headers={**AUTH, "Content-Type": "text/plain"})
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert answer.content == (tmp_path / "brat" / "n1.ann").read_bytes() and answer.text.startswith("T1\t")


@pytest.mark.parametrize(("query", "body", "content_type", "status", "named"), [
    ("?format=conll", b'{"texts": ["gene"]}', "application/json", 422, "formats: jsonl, brat, pubtator, bioc"),
    ("?format=pubtator", b'{"texts": ["gene"], "format": "bioc"}', "application/json", 422, "two formats"),
    ("?format=pubtator", b'{"documents": [{"text": "a", "text_pair": "b"}]}', "application/json", 422,
     "documents.0.text_pair"),
    ("?format=brat", b'{"documents": [{"id": "a/b", "text": "x"}, {"id": "a_b", "text": "y"}]}', "application/json",
     422, "share a brat file name"),
    ("?format=pubtator", b"101|t|A title\n101\t0\tx\n", "text/plain", 400, "body:2: expected ID<TAB>start"),
    ("?format=pubtator", b"101|t|Protein kinase\n101\t0\t7\tenzyme\tGene\n", "text/plain", 400,
     "body:2: the Gene mention text 'enzyme' does not match"),
    ("?format=pubtator", "101|t|caf\u00e9".encode("latin-1"), "text/plain", 400, "send pubtator in UTF-8"),
    ("?format=span_jsonl", b'{"id": "1", "text": "gene"}\n{"id": 2, \n', "application/x-ndjson", 400,
     "body:2: invalid JSON"),
    ("?format=span_jsonl", b'{"id": "1", "text": "gene"}\n{"id": "1", "text": "dose"}\n', "text/plain", 400,
     "share an id"),
    ("?format=bioc", b"<collection><document><id>1</id>", "application/xml", 400, "not a BioC XML collection"),
])
def test_bad_formats_and_bodies_are_answered_by_name(server, query, body, content_type, status, named):
    """An unknown or doubly given format, or a request the format cannot hold, is 422; a body that is not in its
    format is 400 with the reader's message (the line, or the field); never a stack trace."""
    response = httpx.post(f"{server}/v1/predict{query}", content=body, headers={**AUTH, "Content-Type": content_type})
    assert response.status_code == status and named in response.json()["error"], response.text
    assert "Traceback" not in response.text and set(response.json()) == {"error", "type"}


@pytest.mark.slow
def test_an_int8_export_serves_predicts_records(ner, tmp_path):
    """The export folder (its int8 graph, as `predict --runtime auto` picks): its records are those of a `Predictor`
    with the server's settings, exactly (an int8 graph's activation scales follow the batch); the model's facts name
    the runtime and the export's source."""
    assert main(["export", str(ner), "--out", str(tmp_path / "onnx"), "--int8"]) == 0
    texts = sentences(5, seed=11)
    expected = predictor_as_served(tmp_path / "onnx")(texts)
    with live(ServeSettings(str(tmp_path / "onnx"), threads=1)) as url:
        wait_ready(url)
        assert httpx.post(f"{url}/v1/predict", json={"texts": texts}).json() == {"records": expected}
        facts = httpx.get(f"{url}/v1/model").json()
    assert (facts["runtime"], facts["precision"]) == ("onnxruntime", "int8")
    assert facts["provenance"]["export_of"] == str(ner)


def test_the_batcher_keeps_to_the_token_budget_and_answers_what_is_left_over():
    """Five requests of 4 sub-words queued behind a model call, a budget of 10: batches of two requests at most
    (8 sub-words), one model call at a time, every request answered with its own records though nothing else
    arrives."""
    from biodistil.serving.batching import Batcher

    calls, running = [], []

    def run(documents):
        running.append(1)
        assert len(running) == 1, "one model call at a time"
        time.sleep(0.05)
        calls.append(list(documents))
        running.pop()
        return [{"id": d} for d in documents]

    async def main() -> list:
        batcher = Batcher(run, BatchSettings(max_batch_tokens=10, max_wait_ms=0))
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(["first"], 4))
        await asyncio.sleep(0.01)  # the first is in the model call; the others queue behind it
        rest = [asyncio.ensure_future(batcher.submit([f"r{i}a", f"r{i}b"], 4)) for i in range(4)]
        answers = await asyncio.gather(first, *rest)
        await batcher.stop()
        return answers

    answers = asyncio.run(main())
    assert [a.records for a in answers] == [[{"id": "first"}], *[[{"id": f"r{i}a"}, {"id": f"r{i}b"}]
                                                                   for i in range(4)]]
    assert [len(call) for call in calls] == [1, 4, 4], "two requests (8 sub-words) a batch under a budget of 10"
    assert [a.batch_documents for a in answers] == [1, 4, 4, 4, 4]


class Gated:
    """A loaded service whose model calls wait for `gate`, and fail on a text holding "poison"."""

    def __init__(self, service: Service, gate: threading.Event):
        self.service, self.gate = service, gate

    def __call__(self, documents):
        self.gate.wait(30)
        if any("poison" in d.text for d in documents):
            raise RuntimeError("a failure deep in the model")
        return self.service(documents)

    def __getattr__(self, name):
        return getattr(self.service, name)


def test_readiness_waits_for_the_model_and_a_full_queue_or_a_long_wait_is_answered(ner):
    """Before the model is loaded: live, not ready, predictions 503. Then, with the model held in a call: the queue's
    next request 429 with Retry-After; requests that wait longer than --request-timeout 504 (answered, not dropped);
    a batch that fails answers only the request that broke it with the error, and no stack trace."""
    loaded, gate = threading.Event(), threading.Event()
    settings = ServeSettings(str(ner), threads=1, batching=BatchSettings(max_wait_ms=0, max_queue=2),
                             limits=Limits(request_timeout=1.5))

    def load():
        loaded.wait(30)
        return Gated(Service(settings), gate)

    async def crowd(url: str, first: str, then: list[str], last: str | None, release: float | None) -> list:
        """`first` held in the model call, `then` queued behind it, `last` sent to the full queue; the gate opened
        after `release` seconds."""
        async with httpx.AsyncClient(timeout=30) as client:
            def post(text):
                return asyncio.ensure_future(client.post(f"{url}/v1/predict", json={"texts": [text]}))

            held = post(first)
            await asyncio.sleep(0.3)
            queued = [post(text) for text in then]
            await asyncio.sleep(0.3)
            refused = [await client.post(f"{url}/v1/predict", json={"texts": [last]})] if last else []
            if release is not None:
                await asyncio.sleep(release)
                gate.set()
            return [*refused, await held, *await asyncio.gather(*queued)]

    with live(settings, load) as url:
        assert httpx.get(f"{url}/health/live").status_code == 200
        waiting = httpx.get(f"{url}/health")
        assert waiting.status_code == 503 and waiting.json() == {"status": "loading"}
        early = httpx.post(f"{url}/v1/predict", json={"texts": ["gene"]})
        assert early.status_code == 503 and early.headers["retry-after"] == "1"
        loaded.set()
        wait_ready(url)

        refused, held, *queued = asyncio.run(crowd(url, "protein one", ["gene two", "cell three"], "kinase", None))
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "--max-queue" in refused.json()["error"]
        assert [a.status_code for a in (held, *queued)] == [504] * 3 and "--request-timeout" in held.json()["error"]
        gate.set()
        time.sleep(0.2)
        gate.clear()

        held, poisoned, fine = asyncio.run(crowd(url, "protein one", ["poison gene", "protein kinase"], None, 0.2))
        assert held.status_code == fine.status_code == 200 and fine.json()["records"][0]["id"] == "0"
        assert poisoned.status_code == 500 and poisoned.json()["type"] == "internal"
        assert "Traceback" not in poisoned.text and "deep in the model" not in poisoned.text
        metrics = httpx.get(f"{url}/metrics").text
        assert 'biodistil_request_errors_total{kind="overloaded"} 1.0' in metrics
        assert 'biodistil_request_errors_total{kind="timeout"} 3.0' in metrics


def test_a_model_that_cannot_load_is_not_ready_and_says_why(ner):
    settings = ServeSettings(str(ner))

    def load():
        raise RuntimeError("weights unreadable")

    with live(settings, load) as url:
        deadline = time.monotonic() + 10
        while (health := httpx.get(f"{url}/health").json())["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert health == {"status": "failed", "error": "RuntimeError: weights unreadable"}


def test_serve_refuses_a_missing_model_a_busy_port_and_an_empty_key(ner, tmp_path, capsys):
    assert main(["serve", str(tmp_path / "absent")]) == 2
    assert "absent" in capsys.readouterr().err
    (tmp_path / "key").write_text("\n")
    assert main(["serve", str(ner), "--api-key-file", str(tmp_path / "key")]) == 2
    assert "empty" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", str(ner), "--port", str(taken.getsockname()[1])]) == 2
        assert "--port" in capsys.readouterr().err


@pytest.mark.slow
def test_the_serve_bench_runs_at_tiny_settings_and_sigterm_under_load_loses_nothing(ner, tmp_path, monkeypatch):
    """bench/serve.py for a second a phase against `biodistil serve` in its own process: every phase answered without
    errors or mixed records (each record fits the text sent), the soak's RSS sampled; SIGTERM with requests in flight:
    every request the server accepted was answered to its client, then it stopped listening and exited 0."""
    import torch

    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import serve as serve_bench

    (tmp_path / "texts.txt").write_text("\n".join(sentences(40, seed=7)), encoding="utf-8")
    threads = torch.get_num_threads()
    try:
        result = serve_bench.main([str(ner), "--texts", str(tmp_path / "texts.txt"), "--threads", "1", "--seconds",
                                   "1", "--clients", "1", "4", "--rate", "20", "--soak-seconds", "1.5",
                                   "--rss-every", "0.5", "--out", str(tmp_path / "bench.json")])
    finally:
        torch.set_num_threads(threads)
    assert [p["phase"] for p in result["phases"]] == ["closed 1", "closed 4", "open 20/s", "soak 8"]
    for phase in [*result["phases"], result["sigterm"]]:
        assert phase["errors"] == 0 and phase["mixed_records"] == 0 and phase["requests"] > 0, phase
    term = result["sigterm"]
    assert term["in_flight_at_signal"] > 0 and term["refused_after_signal"] > 0
    assert term["lost"] == 0 and term["server_accepted"] == term["client_received"] and term["exit_code"] == 0
    assert "Stopped on SIGTERM" in term["closing_line"]
    assert len(result["rss_mib"]) >= 3 and result["offline"]["sentences_per_s"] > 0
    assert json.loads((tmp_path / "bench.json").read_text())["sigterm"]["lost"] == 0
