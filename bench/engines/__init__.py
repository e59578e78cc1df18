"""The engines the studies compare, one adapter module each (ours: ``ours_single``, ``ours_batched``;
llama.cpp: ``llama_cli``, ``llama_server``, ``llama_cpp_python``); ``base`` holds what they share."""
