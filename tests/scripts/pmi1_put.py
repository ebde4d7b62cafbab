"""A PMI-1 client by hand, as MPICH's speaks to Slurm's PMI-2 plugin under `srun --mpi=pmi2`
(tests/test_cluster_slurm.py): init, then one `put` of N bytes in all, as MPICH puts a 511-byte
piece of an address (hex: up to 1022 characters of value). Prints the plugin's answers; Slurm's
complaints go to srun's stderr."""

import os
import socket
import sys

pmi = socket.socket(fileno=int(os.environ["PMI_FD"]))


def ask(request: str) -> str:
    pmi.sendall(request.encode())
    return pmi.recv(4096).decode().strip()


print(ask("cmd=init pmi_version=1 pmi_subversion=1\n"), flush=True)
print(ask("cmd=get_maxes\n"), flush=True)
kvs = ask("cmd=get_my_kvsname\n").split("kvsname=")[1]
head = f"cmd=put kvsname={kvs} key=-allgather-1-0-seg-1/9 value="
put = head + ("A7" * 600)[: int(sys.argv[1]) - len(head) - 1] + "\n"
print(f"PUT {len(put)} bytes:", ask(put), flush=True)
