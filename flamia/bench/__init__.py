"""The peer benchmark suite: ``flamia bench`` (entry point ``flamia.bench.run.main``).

workloads.py  the registry of packed-document workloads and their inputs
flops.py      the FLOP model behind every TFLOP/s figure
providers.py  the registry of attention implementations (flamia and its peers)
jobs.py       the timed call of each mode (fwd, bwd, train) from a forward and a backward
timing.py     the timing protocol: CUDA graphs, paired rounds in alternating order
report.py     markdown, JSON and PNG reports, and the merge of several runs
run.py        the command line
"""
