"""A simulated cluster: the unchanged collectives on thousands of ranks in one process.

    transport.py   the Communicator interface over virtual time (what a message costs, when)
    scheduler.py   one thread per rank, one baton: deterministic, a virtual clock per rank
    network.py     alpha + n beta per link class, ports that carry one message at a time
    cluster.py     clusters as data: presets (h100, b200, pcie) and your own links
    runner.py      simulate(fn, ranks, cluster): fn on every rank, results and times
    sweep.py       an nccl-tests-style sweep of a collective over sizes and algorithms
    rings.py       NCCL's channels: a ring a NIC, as one flow-level ring or one by one
    protocols.py   NCCL's protocols (Simple, LL, LL128) priced as its tuner does, and its pick
    nvls.py        NVLink SHARP: the all-reduce the NVSwitch sums
    nccl_tree.py   NCCL's tree across nodes: a chain in each node, a double binary tree across
    published.py   published NCCL figures, each with its source
    validate.py    the simulator against them: simulated / published, geomean and worst

A mode of its own (`minipar simulate`): it never stands in for the real path in a test of it.
"""
