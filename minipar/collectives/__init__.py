"""Hand-written collectives on the transport's point-to-point messages.

One file per family of algorithms (ring.py, tree.py, recursive.py, linear.py, bruck.py,
pairwise.py, double_tree.py, barrier.py); api.py is the public, torch.distributed-like surface;
registry.py lists which algorithms each collective has.
"""
