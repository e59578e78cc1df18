"""The engines the studies compare, one module each, with the adapters the
studies drive them through.

- ``ours_single``: ``SpeculativeDecoder`` (one stream) and ``DecoderPool``;
- ``ours_batched``: ``BatchedDecoder``, called directly or behind our HTTP
  server (``specdec-cpu serve``, optionally through Ray Serve);
- ``llama_cli``: llama.cpp's command-line tools (``llama-completion``,
  ``llama-speculative``, ``llama-speculative-simple``), and the build of
  every llama.cpp binary from the sources the pinned llama-cpp-python vendors;
- ``llama_server``: llama.cpp's ``llama-server`` and its HTTP API;
- ``llama_cpp_python``: llama-cpp-python's ``Llama`` (plain or with prompt
  lookup) and its server.

``base`` holds what the adapters share: the one interface the studies drive
an engine through (:class:`~bench.engines.base.Engine`: started for K
sequences at once, it serves the serving studies one streamed
:class:`~bench.engines.base.Request` per client, and the exactness audit one
:class:`~bench.engines.base.Sample` per :class:`~bench.engines.base.Job`).
The suite (bench/run.py) calls the engines' functions directly:
``llama_cli.run_plain`` / ``run_speculative``, ``llama_server.run_server``,
``llama_cpp_python.LcpRunner`` and ``ours_single.generation_record``.
"""
