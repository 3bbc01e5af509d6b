"""One node's stage, on the node (docs/architecture.md).

stage.py           `gpufleet node-stage`: the node's stage written once (lock, checks, counters, benchmarks, counters
                   again, the host document)
host_documents.py  the node's host documents: checks and benchmarks run into one document
supervised.py      each step in an engine process of its own, with a timeout
measure.py         each benchmark run until its figures can be trusted (NodeSteps, watched())
trust.py           how far a measured figure can be trusted: what a measurement asks of the next
"""
