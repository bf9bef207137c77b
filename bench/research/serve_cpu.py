"""Where a served request's CPU goes on a small machine: `predict` offline against `biodistil serve` under closed-loop
load, in CPU seconds per sentence (the server's process and the load client's, measured, not inferred).

    python bench/research/serve_cpu.py STUDENT_ONNX [--threads 1 2] [--clients 32] [--seconds 20]

For each `--threads` T: (1) `Predictor` offline in this process on the first `--sentences` sentences of
corpus/biomed.txt, one window a model call (serve's `--batch-size 1`): sentences/s and CPU ms per sentence
(getrusage); (2) `biodistil serve MODEL --threads T` in its own process, driven by `--clients` closed-loop clients
(asyncio, one sentence a request; `--client`: httpx, or bench/serve.py's h11 connections) in this process for
`--seconds`: requests/s, the server's CPU ms per request (its process and children, psutil) and the client's. With
both on the same cores, requests/s cannot exceed cores × 1000 / (server ms + client ms): the ceiling the figures give,
against offline sentences/s. Prints one JSON line (`--out` writes it too).
"""

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from serve import Connection, Server  # noqa: E402


def offline(model: str, texts: list[str], threads: int) -> dict:
    from biodistil.export.predict import Predictor

    predictor = Predictor(model, threads=threads, batch_size=1)
    predictor(texts[:64])
    before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    predictor(texts)
    wall, after = time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"sentences_per_s": round(len(texts) / wall, 1), "cpu_ms_per_sentence": round(1000 * cpu / len(texts), 2)}


def cpu_seconds(process: psutil.Process) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


async def load(url: str, texts: list[str], clients: int, seconds: float, server: psutil.Process, kind: str) -> dict:
    answered = [0]
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=2 * clients)) as client:
        connections: dict[int, Connection] = {}

        async def post(worker: int, payload: dict) -> int:
            if kind == "httpx":
                return (await client.post(f"{url}/v1/predict", json=payload)).status_code
            connection = connections.setdefault(worker, Connection(url))
            return (await connection.post("/v1/predict", json.dumps(payload).encode())).status

        await post(-1, {"texts": texts[:8]})

        async def one(start: int, stop: float) -> None:
            index = start
            while time.perf_counter() < stop:
                status = await post(start, {"texts": [texts[index % len(texts)]]})
                answered[0] += status == 200  # not `+= await ...`: that reads the count before the await
                index += clients

        me, server_before = psutil.Process(), cpu_seconds(server)
        mine_before, began = sum(me.cpu_times()[:2]), time.perf_counter()
        await asyncio.gather(*(one(i, began + seconds) for i in range(clients)))
        wall = time.perf_counter() - began
        server_cpu, client_cpu = cpu_seconds(server) - server_before, sum(me.cpu_times()[:2]) - mine_before
    n = max(answered[0], 1)
    return {"requests": answered[0], "requests_per_s": round(answered[0] / wall, 1),
            "server_cpu_ms_per_request": round(1000 * server_cpu / n, 2),
            "client_cpu_ms_per_request": round(1000 * client_cpu / n, 2)}


def served(model: str, texts: list[str], threads: int, clients: int, seconds: float, kind: str) -> dict:
    server = Server(model, "auto", str(threads), [])  # bench/serve.py's: started, listening and ready
    try:
        return asyncio.run(load(server.url, texts, clients, seconds, psutil.Process(server.process.pid), kind))
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--client", choices=["httpx", "h11"], nargs="+", default=["httpx", "h11"])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    from biodistil.training.machine import cpu_line

    corpus = Path(args.data) / "corpus" / "biomed.txt"
    texts = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()][:args.sentences]
    result = {"cpu": cpu_line(), "model": args.model, "clients": args.clients, "runs": {}}
    for threads in args.threads:
        run = {"offline": offline(args.model, texts, threads)}
        for kind in args.client:
            load = served(args.model, texts, threads, args.clients, args.seconds, kind)
            cost = load["server_cpu_ms_per_request"] + load["client_cpu_ms_per_request"]
            run[f"served_{kind}"] = {**load, "ceiling_requests_per_s": round(psutil.cpu_count() * 1000 / cost, 1)}
        result["runs"][str(threads)] = run
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
