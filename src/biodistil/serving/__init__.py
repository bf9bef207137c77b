"""`biodistil serve`: a student behind HTTP — a thin layer over `export.predict.Predictor`.

    settings.py   ServeSettings: limits, batching and the listening address (no web framework)
    batching.py   Batcher: concurrent requests gathered into one `Predictor` call at a time (asyncio, no web framework)
    service.py    Service: the loaded, warmed-up Predictor, its token counts and the model's facts
    metrics.py    the Prometheus metrics of one app (its own registry)
    formats.py    the answer's format: JSON records, or brat / PubTator / BioC / span JSON lines as `predict --format`
                  writes them (the same writers), and their media types (no web framework)
    app.py        the FastAPI app: routes, limits, API key, errors without stack traces
    command.py    run_serve: uvicorn on a socket, the model loaded behind readiness, graceful shutdown

The web framework (FastAPI, uvicorn, prometheus_client: the optional extra `serve`) is imported only in this package,
and the CLI imports the package only when `serve` runs, so `import biodistil` and every other command stay light.
"""
