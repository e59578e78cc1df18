"""specdec-cpu's benchmarks: one study per module, each run as ``python -m bench.<study>``
(the end-to-end suite as ``python -m bench``, bench/run.py).

bench/engines/ holds the engines the studies compare (ours, llama.cpp's tools,
llama-server, llama-cpp-python), one module each; bench/common.py what the
studies share (machine facts, CPU meter, paired runs, bootstrap intervals,
RESULTS.md sections); bench/render.py re-renders the whole of bench/RESULTS.md from
bench/results/.
"""
