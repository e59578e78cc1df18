"""The HTTP server: OpenAI's wire format over a :class:`~specdec_cpu.BatchedDecoder`.

- :mod:`.openai_app` — the FastAPI application (routes, errors, streaming);
- :mod:`.openai_schema` — the request models it validates;
- :mod:`.responses_api` — OpenAI's Responses API, read as the chat completion it amounts to;
- :mod:`.response_store` — the responses kept for ``previous_response_id``, and those still running;
- :mod:`.embeddings_api` — ``/v1/embeddings``;
- :mod:`.prometheus` — ``/metrics`` in Prometheus' text format;
- :mod:`.http_server` — runs the application under uvicorn (``specdec-cpu serve``);
- :mod:`.ray_deployment` — the same application as a Ray Serve deployment;
- :mod:`.listen_ports` — free ports for its local cluster's listeners.

Imported only with the ``server`` (and ``ray``) extras.
"""
