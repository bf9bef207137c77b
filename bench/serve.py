"""Load test of `biodistil serve`: the server on a free localhost port, driven over HTTP, beside `predict` offline.

    python bench/serve.py runs/ner-student/onnx --threads 2 --seconds 20 --soak-seconds 600 --out serve-bench.json

Reads the first `--sentences` sentences of corpus/biomed.txt (as bench/predict.py), then:
1. offline: `Predictor` in this process on all of them (batches of 64, as `predict`): sentences/s, and the model's
   batch-1 latency (the median of one sentence at a time);
2. starts `biodistil serve MODEL --port 0` (its own process, `--threads` or `--serve-threads`, `--server-arg` passed
   on) and, each phase for `--seconds`, sends one sentence a request: closed loops of 1, 8 and 32 clients (each sends
   its next request when the last is answered), then an open loop at `--rate` requests/s (sent on schedule whatever
   the answers; the latency counts from the scheduled time, so a server that falls behind shows it);
3. a soak: 8 clients for `--soak-seconds` (600), the server's RSS sampled every `--rss-every` seconds;
4. SIGTERM under load: 32 clients, the signal after a second; `lost` is the requests the server says it accepted (its
   closing line) less the answers the clients received over the whole run (a refused connection after the signal was
   not accepted; `disconnected` counts requests cut off).
Per phase: requests/s, documents/s, p50/p95/p99 latency (ms), errors (non-200 or transport errors), mixed records
(a record whose id or entity offsets do not fit the text sent), the mean batch size (the x-batch-size header), and the
share of records whose entities (or labels) are the offline ones (an int8 graph's activation scales follow the batch:
near-ties may fall otherwise). The client (`Connection`) runs in this process and takes CPU from the server on a small
machine: said in the heading with the load average (`--client-cpus` pins it). Prints a table and, last, one JSON line.
Tests never assert on these timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import h11

REPO = Path(__file__).resolve().parents[1]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model folder, export folder or .onnx file (as `biodistil serve`)")
    parser.add_argument("--runtime", default="auto")
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2, help="the model's CPU threads offline, and served unless "
                        "--serve-threads says otherwise")
    parser.add_argument("--serve-threads", default=None, metavar="N|auto", help="the server's --threads (default: "
                        "--threads); auto: none given, the server's default (the usable cores)")
    parser.add_argument("--client-cpus", type=int, nargs="+", metavar="CPU", help="pin this process (the load client) "
                        "to these CPUs once the server has started (the server keeps every core)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each load phase")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="closed-loop client counts")
    parser.add_argument("--rate", type=float, default=50.0, help="open loop: requests per second")
    parser.add_argument("--soak-seconds", type=float, default=600.0, help="the soak at 8 clients (0: none)")
    parser.add_argument("--rss-every", type=float, default=10.0, help="soak: seconds between RSS samples")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="passed to `biodistil serve` (repeat: --server-arg=--max-wait-ms --server-arg=5)")
    parser.add_argument("--data", help="data folder (default: $BIODISTIL_DATA, else ../shared/data)")
    parser.add_argument("--texts", help="a text file of sentences (one a line) instead of corpus/biomed.txt")
    parser.add_argument("--out", help="also write the JSON record here")
    return parser.parse_args(argv)


def read_texts(args: argparse.Namespace) -> list[str]:
    if args.texts:
        lines = [line.strip() for line in Path(args.texts).read_text(encoding="utf-8").splitlines() if line.strip()]
        return lines[: args.sentences]
    from predict import sentences

    return sentences(args.data, args.sentences)


def offline(model: str, runtime: str, texts: list[str], threads: int) -> tuple[dict, list[dict]]:
    """`predict`'s speed on `texts` in this process, the model's batch-1 latency, and its records."""
    import torch

    from biodistil.export.predict import Predictor

    torch.set_num_threads(threads)
    predictor = Predictor(model, runtime=runtime, threads=threads)
    predictor(texts[:64])  # warm-up
    began = time.perf_counter()
    records = predictor(texts)
    seconds = time.perf_counter() - began
    single = []
    for text in texts[:200]:
        began_one = time.perf_counter()
        predictor([text])
        single.append(time.perf_counter() - began_one)
    return {"model": predictor.description, "sentences": len(texts), "sentences_per_s": round(len(texts) / seconds, 1),
            "batch1_ms": round(1000 * statistics.median(single), 2)}, records


class Server:
    """`biodistil serve` in a process of its own on a free port."""

    def __init__(self, model: str, runtime: str, threads: str, extra: list[str]):
        """`threads`: the server's --threads, or "auto" (none given: the server's default)."""
        env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        threaded = [] if threads == "auto" else ["--threads", threads]
        command = [sys.executable, "-m", "biodistil", "serve", model, "--port", "0", "--runtime", runtime,
                   *threaded, *extra]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.signalled, self.url, line = False, "", ""
        while "Ready: " not in line:  # logged when the model is loaded and warm: GET /health answers 200 from then
            line = self.process.stderr.readline()
            if not line and self.process.poll() is not None:
                raise RuntimeError(f"biodistil serve exited ({self.process.returncode}) before it was ready")
            self.url = self.url or next(iter(re.findall(r"http://[\d.]+:\d+", line)), "")

    def rss_mib(self) -> float:
        """The server's resident memory (MiB)."""
        from biodistil.evaluation.bench import current_rss
        return current_rss(self.process.pid) / 2**20

    def send(self, number: int = signal.SIGTERM) -> None:
        """Signal it once (a second SIGTERM after its graceful stop would interrupt its closing line)."""
        if not self.signalled and self.process.poll() is None:
            self.process.send_signal(number)
            self.signalled = True

    def stop(self, number: int = signal.SIGTERM, timeout: float = 60) -> tuple[int, str]:
        """Signal it (unless done already); its exit code and closing line."""
        self.send(number)
        code = self.process.wait(timeout)
        return code, self.process.stdout.read().strip()


class Tally:
    """What one phase's requests got."""

    def __init__(self, texts: list[str], expected: list[dict], stopping: bool = False):
        """`stopping`: the server is told to stop during the phase, so a connection closed before the request was
        read is a request not accepted (the server's own count, in its closing line, says whether it read it)."""
        self.texts, self.expected, self.stopping = texts, expected, stopping
        self.latencies: list[float] = []
        self.sent, self.ok, self.errors, self.mixed, self.same, self.refused, self.disconnected = 0, 0, 0, 0, 0, 0, 0
        self.batches: list[int] = []
        self.kinds: dict[str, int] = {}

    def count(self, index: int, seconds: float, response: Answer | None, error: Exception | None) -> None:
        if error is not None:
            if isinstance(error, Refused):
                self.refused += 1  # not accepted (the server had stopped listening)
                return
            self.disconnected += 1
            self.errors += not self.stopping
            self.kinds[type(error).__name__] = self.kinds.get(type(error).__name__, 0) + 1
            return
        self.latencies.append(seconds)
        if response.status != 200:
            self.errors += 1
            self.kinds[str(response.status)] = self.kinds.get(str(response.status), 0) + 1
            return
        self.ok += 1
        (record,) = json.loads(response.body)["records"]
        self.mixed += not fits(record, self.texts[index])
        self.same += spans(record) == spans(self.expected[index])
        self.batches.append(int(response.headers.get("x-batch-size", 1)))

    def summary(self, name: str, seconds: float) -> dict:
        answered = len(self.latencies)
        ms = sorted(1000 * s for s in self.latencies) or [float("nan")]
        return {"phase": name, "requests": answered, "requests_per_s": round(answered / seconds, 1),
                "documents_per_s": round(answered / seconds, 1),
                "p50_ms": round(percentile(ms, 50), 2), "p95_ms": round(percentile(ms, 95), 2),
                "p99_ms": round(percentile(ms, 99), 2), "errors": self.errors, "error_kinds": self.kinds,
                "mixed_records": self.mixed, "same_as_offline": round(self.same / max(self.ok, 1), 4),
                "mean_batch": round(statistics.fmean(self.batches), 2) if self.batches else None}


def spans(record: dict) -> list:
    """What a record says, but for scores: its entities' (start, end, label), or its label(s)."""
    if "entities" in record:
        return [(e["start"], e["end"], e["label"]) for e in record["entities"]]
    return [record.get("label"), record.get("labels")]


def fits(record: dict, text: str) -> bool:
    """Whether a record belongs to `text`: id "0" (one text a request) and every entity's text at its offsets."""
    if record.get("id") != "0":
        return False
    return all(text[e["start"]:e["end"]] == e["text"] for e in record.get("entities", []))


def percentile(sorted_values: list[float], share: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(share / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


class Refused(ConnectionError):
    """No connection: the server does not listen (the request was not accepted)."""


class Dropped(ConnectionError):
    """The connection closed (or timed out) before the whole answer came."""


class Connection:
    """One keep-alive HTTP/1.1 connection to the server, opened on first use and again after the server closes it:
    asyncio streams framed by h11, the parser under httpx without its layers (0.48 against 8.69 ms of client CPU a
    request: docs/results/serve-cpu-clients.json)."""

    def __init__(self, url: str, timeout: float = 60.0):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port, self.timeout = host, int(port), timeout
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.protocol = h11.Connection(h11.CLIENT)

    async def post(self, target: str, body: bytes) -> Answer:
        if self.streams is None:
            try:
                self.streams = await asyncio.open_connection(self.host, self.port)
            except OSError as error:
                raise Refused(str(error)) from error
            self.protocol = h11.Connection(h11.CLIENT)
        headers = [("host", f"{self.host}:{self.port}"), ("content-type", "application/json"),
                   ("content-length", str(len(body)))]
        try:
            answer = await asyncio.wait_for(self._exchange(h11.Request(method="POST", target=target, headers=headers),
                                                           body), self.timeout)
        except (OSError, EOFError, TimeoutError, h11.ProtocolError) as error:
            self.close()
            raise Dropped(f"{type(error).__name__}: {error}") from error
        if self.protocol.our_state is h11.DONE and self.protocol.their_state is h11.DONE:
            self.protocol.start_next_cycle()
        else:  # the server said it closes the connection
            self.close()
        return answer

    async def _exchange(self, request: h11.Request, body: bytes) -> Answer:
        reader, writer = self.streams
        send = self.protocol.send
        writer.write(send(request) + send(h11.Data(data=body)) + send(h11.EndOfMessage()))
        await writer.drain()
        status, headers, chunks = 0, {}, []
        while True:
            event = self.protocol.next_event()
            if event is h11.NEED_DATA:
                self.protocol.receive_data(await reader.read(65536))  # b"": the server closed the connection
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return Answer(status, headers, b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                raise EOFError("the server closed the connection before answering")

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


async def _post(connection: Connection, text: str) -> tuple[Answer | None, Exception | None]:
    try:
        return await connection.post("/v1/predict", json.dumps({"texts": [text]}).encode()), None
    except ConnectionError as error:
        return None, error


async def closed_loop(url: str, tally: Tally, clients: int, seconds: float, stop_early: asyncio.Event | None = None
                      ) -> float:
    """`clients` loops, each sending its next sentence when the last is answered, for `seconds`."""
    end = time.perf_counter() + seconds
    position = iter(range(10**9))

    async def client_loop() -> None:
        connection = Connection(url)
        while time.perf_counter() < end and not (stop_early and stop_early.is_set()):
            index = next(position) % len(tally.texts)
            began = time.perf_counter()
            tally.sent += 1
            response, error = await _post(connection, tally.texts[index])
            tally.count(index, time.perf_counter() - began, response, error)
            if isinstance(error, Refused) and stop_early is not None:
                stop_early.set()
        connection.close()

    began = time.perf_counter()
    await asyncio.gather(*[client_loop() for _ in range(clients)])
    return time.perf_counter() - began


async def open_loop(url: str, tally: Tally, rate: float, seconds: float) -> float:
    """A request every 1/`rate` s for `seconds`, sent on schedule; latency from the scheduled time."""
    count = int(rate * seconds)
    began = time.perf_counter()

    idle: list[Connection] = []  # a request takes an idle connection, else opens one

    async def one(number: int) -> None:
        scheduled = began + number / rate
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        index = number % len(tally.texts)
        connection = idle.pop() if idle else Connection(url)
        response, error = await _post(connection, tally.texts[index])
        tally.count(index, time.perf_counter() - scheduled, response, error)
        idle.append(connection)

    await asyncio.gather(*[one(n) for n in range(count)])
    for connection in idle:
        connection.close()
    return time.perf_counter() - began


async def soak(server: Server, tally: Tally, seconds: float, every: float) -> tuple[float, list[list[float]]]:
    """8 clients for `seconds`, the server's RSS every `every` seconds: (seconds, [[t, MiB], ...])."""
    samples = [[0.0, round(server.rss_mib(), 1)]]
    began = time.perf_counter()

    async def sample() -> None:
        while time.perf_counter() - began < seconds:
            await asyncio.sleep(min(every, max(0.0, seconds - (time.perf_counter() - began))))
            samples.append([round(time.perf_counter() - began, 1), round(server.rss_mib(), 1)])

    took, _ = await asyncio.gather(closed_loop(server.url, tally, 8, seconds), sample())
    return took, samples


async def sigterm_under_load(server: Server, tally: Tally, after: float = 1.0) -> tuple[float, int, str, int]:
    """32 clients; SIGTERM after `after` s; the clients stop at their first refused connection. Also returns the
    requests sent and not yet answered when the signal went."""
    stopped = asyncio.Event()

    async def signal_later() -> int:
        await asyncio.sleep(after)
        pending = tally.sent - len(tally.latencies) - tally.disconnected - tally.refused
        server.send(signal.SIGTERM)
        return pending

    took, pending = await asyncio.gather(closed_loop(server.url, tally, 32, after + 60, stopped), signal_later())
    code, line = await asyncio.to_thread(server.stop)
    return took, code, line, pending


def run(args: argparse.Namespace) -> dict:
    """Every phase; the record."""
    from biodistil.training.machine import cpu_line

    texts = read_texts(args)
    baseline, records = offline(args.model, args.runtime, texts, args.threads)
    serve_threads = args.serve_threads or str(args.threads)
    server = Server(args.model, args.runtime, serve_threads, args.server_arg)
    if args.client_cpus:
        os.sched_setaffinity(0, args.client_cpus)
    phases, tallies, rss = [], [], []

    def phase(stopping: bool = False) -> Tally:
        tallies.append(Tally(texts, records, stopping))
        return tallies[-1]

    try:
        for clients in args.clients:
            tally = phase()
            phases.append(tally.summary(f"closed {clients}", asyncio.run(closed_loop(server.url, tally, clients,
                                                                                     args.seconds))))
        tally = phase()
        phases.append(tally.summary(f"open {args.rate:g}/s", asyncio.run(open_loop(server.url, tally, args.rate,
                                                                                 args.seconds))))
        if args.soak_seconds > 0:
            tally = phase()
            took, rss = asyncio.run(soak(server, tally, args.soak_seconds, args.rss_every))
            phases.append(tally.summary("soak 8", took))
        tally = phase(stopping=True)
        took, code, line, pending = asyncio.run(sigterm_under_load(server, tally))
    finally:
        if server.process.poll() is None:
            server.stop()
    found = re.search(r"([\d,]+) prediction requests accepted, ([\d,]+) answered", line)
    accepted = int(found.group(1).replace(",", "")) if found else None
    received = sum(len(t.latencies) for t in tallies)
    shutdown = {**tally.summary("sigterm 32", took), "in_flight_at_signal": pending,
                "refused_after_signal": tally.refused,
                "disconnected": tally.disconnected, "server_accepted": accepted, "client_received": received,
                "lost": accepted - received if accepted is not None else None, "exit_code": code, "closing_line": line}
    growth = (rss[-1][1] - rss[0][1]) / rss[0][1] if len(rss) > 1 else None
    return {"offline": baseline, "phases": phases, "sigterm": shutdown, "rss_mib": rss,
            "rss_growth": round(growth, 4) if growth is not None else None, "threads": args.threads,
            "serve_threads": serve_threads, "client_cpus": args.client_cpus, "server_args": args.server_arg,
            "seconds": args.seconds, "cpu": cpu_line(), "load_1min": os.getloadavg()[0]}


def report(result: dict) -> None:
    base = result["offline"]
    pinned = f"pinned to CPUs {result['client_cpus']}" if result["client_cpus"] else "on every core"
    print(f"{base['sentences']:,} sentences, offline {result['threads']} thread(s), served --threads "
          f"{result['serve_threads']}; CPU: {result['cpu']}; load {result['load_1min']:.2f} (the client shares this "
          f"machine, {pinned})")
    print(f"  offline predict: {base['sentences_per_s']:,.1f} sentences/s; batch-1 latency {base['batch1_ms']:.2f} ms "
          f"[{base['model']}]")
    for phase in [*result["phases"], result["sigterm"]]:
        share = phase["documents_per_s"] / base["sentences_per_s"]
        print(f"  {phase['phase']:12s} {phase['requests_per_s']:8,.1f} req/s ({share:5.1%} of offline)  p50 "
              f"{phase['p50_ms']:7.2f}  p95 {phase['p95_ms']:7.2f}  p99 {phase['p99_ms']:7.2f} ms  errors "
              f"{phase['errors']}  mixed {phase['mixed_records']}  batch {phase['mean_batch']}  same as offline "
              f"{phase['same_as_offline']:.1%}")
    term = result["sigterm"]
    print(f"  SIGTERM under load ({term['in_flight_at_signal']} requests in flight): the server accepted "
          f"{term['server_accepted']} requests in all, the clients received "
          f"{term['client_received']} answers: {term['lost']} lost; {term['disconnected']} closed before being read, "
          f"{term['refused_after_signal']} refused after the signal; exit {term['exit_code']}: {term['closing_line']}")
    if result["rss_mib"]:
        print(f"  soak RSS: {result['rss_mib'][0][1]:,.1f} → {result['rss_mib'][-1][1]:,.1f} MiB "
              f"({result['rss_growth']:+.1%}), max {max(m for _, m in result['rss_mib']):,.1f} MiB")


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    result = run(args)
    report(result)
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(line + "\n", encoding="utf-8")
    print(line)
    return result


if __name__ == "__main__":
    main()
