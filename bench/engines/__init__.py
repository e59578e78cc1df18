"""The engines the studies compare, one adapter module each: ``ours_single`` (SpeculativeDecoder),
``ours_batched`` (BatchedDecoder, direct or behind our HTTP server), ``llama_cli`` (llama.cpp's
tools, and their build), ``llama_server`` (llama-server), ``llama_cpp_python`` (its ``Llama``
and server).  ``base`` holds what they share, :class:`~bench.engines.base.Engine` first.
"""
