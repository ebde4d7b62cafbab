"""What a rank runs before the user's program, as `python -m minipar.launcher WHAT ...`:

    relay FOLDER -- program ...   point stdout and stderr at this rank's pipes, then become the
                                  program (relay.py: whole lines per rank)
    notebook FOLDER               load a pickled function, run it, write its result (notebook.py)
    enter [-x] HOST word ...      the stand-in for ssh on emulated nodes (cluster/enter.py)
    hold                          PID 1 of a rootless job's namespaces (cluster/rootless.py)
    keep NODES LINK slurm|-       the keeper of a standing cluster (cluster/standing.py)

A module of its own so that `-m` runs it after the package is imported, not a module the package
has imported already.
"""

import sys

if __name__ == "__main__":
    what, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if what == "relay":  # every rank of `minipar run` passes here: import nothing it does not use
        from minipar.launcher import relay

        relay.rank_main(rest)
    elif what == "notebook" and len(rest) == 1:
        from minipar.launcher import notebook

        sys.exit(notebook.rank_main(rest[0]))
    elif what == "enter":
        from minipar.launcher.cluster import enter

        sys.exit(enter.main(rest))
    elif what == "hold":
        from minipar.launcher.cluster import rootless

        sys.exit(rootless.hold())
    elif what == "keep" and len(rest) == 3:
        from minipar.launcher.cluster import standing

        sys.exit(standing.keep(int(rest[0]), rest[1], rest[2] == "slurm"))
    else:
        sys.exit(
            "usage: python -m minipar.launcher relay FOLDER -- program ... | notebook FOLDER"
            " | enter HOST word ... | hold"
        )
