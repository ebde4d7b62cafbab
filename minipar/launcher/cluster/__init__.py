"""A cluster on one machine: emulated nodes joined by a link you can throttle.

    minipar run --nodes 2 -n 4 --link 2gbit script.py     # 2 nodes of 2 ranks each

Each node is a network namespace with its own hostname (node0, node1, ...) and one interface,
eth0, plugged into a switch (a bridge in a namespace of its own); each node's cable is shaped
with tc's token bucket at the link's rate, both ways. The job is started by the MPI's real
launcher (MPICH's hydra, Open MPI's prterun) inside node0, and the launcher starts the other
nodes' proxies through a stand-in for ssh that enters a node's namespaces instead of logging in.
The MPI's network transport (TCP on eth0) carries the bytes between nodes, across the shaped
link; shared memory those inside a node. What it models: the link. What it does not: the nodes
share this machine's cores (docs/cluster.md).

link.py      the link's rate: tc's spellings (2gbit, 500mbit, unlimited), the token bucket
nodes.py     the namespaces, the switch and the cables of one job: made, and removed whole
enter.py     the stand-in for ssh: a host's address -> its node's namespaces
mpi_args.py  how each MPI's launcher is told about the nodes and the transport between them
leftovers.py what a killed job left behind, found by its owner's pid and removed
needs.py     what the emulation needs (root or user namespaces, ip, tc, nsenter, unshare): one
             refusal naming it
rootless.py  without root: the job's namespaces inside a user namespace that a holder keeps
standing.py  a cluster that stays up (minipar cluster up|shell|status|down), held by a keeper
slurm.py     Slurm on the nodes: munged, slurmctld on node0, a slurmd on every node
"""
