"""The programs of PyTorch's tutorial "Writing Distributed Applications with PyTorch", written
once for a module called `dist`, as the tutorial writes them: torch.distributed, or minipar with
`import minipar as dist` in its place. tests/test_parity.py runs both and compares.

    python tutorial.py torch|minipar OUT              the tutorial's start-up: 2 processes of
                                                      torch.multiprocessing.Process, gloo
                                                      rendezvous at MASTER_ADDR / MASTER_PORT
    mpiexec -n 4 python tutorial.py minipar OUT --mpi   its MPI recipe: init_process(0, 0, run,
                                                      backend='mpi')
    mpiexec -n 4 python tutorial.py torch OUT --mpi     the reference for it: torch's wheels have
                                                      no MPI backend, so gloo, at MPI's rank and
                                                      size, in the same job layout
    ... --programs blocking,immediate                 only these (default: all)

Each rank writes OUT/<dist>.<rank>.pkl: {program: what it computed, or ("error", type,
message)}. The programs print what the tutorial's print; the records are what is compared.
TUTORIAL_PORT names MASTER_PORT (the tutorial's '29500' would collide between test runs).

Three things are ours, not the tutorial's: its SGD trains on MNIST, here a small synthetic set
of the same shape of problem (classes from features, nll_loss over log_softmax); its batch size
`128 / float(size)` is a float, which torch's DataLoader refuses, so `128 // size`; and `run`
takes the rank and size from dist (the tutorial: MPI makes the arguments "superfluous"; its
recipe passes 0, 0 to every rank), then runs each program in turn in one process group.
"""

import os
import pickle
import sys
from math import ceil
from random import Random

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.multiprocessing import Process

if sys.argv[1] == "minipar":
    import minipar as dist
else:
    import torch.distributed as dist

OUT = sys.argv[2]
MPI = "--mpi" in sys.argv
RESULTS = {}


def keep(what, value):
    RESULTS[what] = value


# -- point-to-point --------------------------------------------------------------------------
def blocking(rank, size):
    """Blocking point-to-point communication."""
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        dist.send(tensor=tensor, dst=1)
    else:
        # Receive tensor from process 0
        dist.recv(tensor=tensor, src=0)
    print("Rank ", rank, " has data ", tensor[0])
    keep("blocking", tensor)


def immediate(rank, size):
    """Non-blocking point-to-point communication."""
    tensor = torch.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        req = dist.isend(tensor=tensor, dst=1)
        print("Rank 0 started sending")
    else:
        # Receive tensor from process 0
        req = dist.irecv(tensor=tensor, src=0)
        print("Rank 1 started receiving")
    req.wait()
    print("Rank ", rank, " has data ", tensor[0])
    keep("immediate", tensor)


# -- collectives -----------------------------------------------------------------------------
def group_all_reduce(rank, size):
    """All-Reduce example: the sum over a group of two (on 4 ranks, ranks 2 and 3 call it too,
    on a group they are not in: torch does nothing there, and so must minipar)."""
    group = dist.new_group([0, 1])
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.reduce_op.SUM, group=group)
    print("Rank ", rank, " has data ", tensor[0])
    keep("group_all_reduce", tensor)


def six_collectives(rank, size):
    """The six collectives the tutorial lists, with the arguments it names, and the barrier."""
    group = dist.new_group(list(range(size)))
    tensor = torch.tensor([rank + 1.0, 10.0 * rank])
    dist.broadcast(tensor, 0, group)
    keep("broadcast", tensor)
    tensor = torch.tensor([rank + 1.0, 2.0])
    dist.reduce(tensor, 0, dist.reduce_op.PRODUCT, group)
    keep("reduce", tensor if rank == 0 else None)  # only dst's result is defined
    for op in ("SUM", "PRODUCT", "MAX", "MIN"):
        tensor = torch.tensor([rank + 1.0, 3.0 - rank])
        dist.all_reduce(tensor, getattr(dist.reduce_op, op), group)
        keep(f"all_reduce.{op}", tensor)
    tensor = torch.zeros(2)
    scatter_list = [torch.full((2,), 100.0 + i) for i in range(size)] if rank == 0 else None
    dist.scatter(tensor, src=0, scatter_list=scatter_list, group=group)
    keep("scatter", tensor)
    tensor = torch.full((3,), float(rank))
    gather_list = [torch.zeros(3) for _ in range(size)] if rank == size - 1 else None
    dist.gather(tensor, dst=size - 1, gather_list=gather_list, group=group)
    keep("gather", gather_list)
    tensor_list = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(tensor_list, torch.tensor([rank, rank * rank]), group)
    keep("all_gather", tensor_list)
    dist.barrier(group)
    print("Rank ", rank, " done with the six collectives")


# -- distributed training --------------------------------------------------------------------
class Partition:
    """Dataset partitioning helper."""

    def __init__(self, data, index):
        self.data = data
        self.index = index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        data_idx = self.index[index]
        return self.data[data_idx]


class DataPartitioner:
    def __init__(self, data, sizes=(0.7, 0.2, 0.1), seed=1234):
        self.data = data
        self.partitions = []
        rng = Random()
        rng.seed(seed)
        data_len = len(data)
        indexes = [x for x in range(0, data_len)]
        rng.shuffle(indexes)
        for frac in sizes:
            part_len = int(frac * data_len)
            self.partitions.append(indexes[0:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


def synthetic_dataset():
    """In MNIST's place: 512 samples of 16 features, the class the largest of the first 4."""
    features = torch.randn(512, 16, generator=torch.Generator().manual_seed(0))
    return list(zip(features, features[:, :4].argmax(1)))


def partition_dataset():
    """Partitioning the data set: one equal share per rank, 128 samples a step in all."""
    dataset = synthetic_dataset()
    size = dist.get_world_size()
    bsz = 128 // size
    partition_sizes = [1.0 / size for _ in range(size)]
    partition = DataPartitioner(dataset, partition_sizes)
    partition = partition.use(dist.get_rank())
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=True)
    return train_set, bsz


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def average_gradients(model):
    """Gradient averaging."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.reduce_op.SUM)
        param.grad.data /= size


def sgd(rank, size):
    """Distributed Synchronous SGD Example."""
    torch.manual_seed(1234)
    train_set, bsz = partition_dataset()
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    num_batches = ceil(len(train_set.dataset) / float(bsz))
    losses = []
    for epoch in range(10):
        epoch_loss = 0.0
        for data, target in train_set:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            optimizer.step()
        print("Rank ", dist.get_rank(), ", epoch ", epoch, ": ", epoch_loss / num_batches)
        losses.append(epoch_loss / num_batches)
    keep("sgd.losses", losses)
    keep("sgd.parameters", [p.detach().clone() for p in model.parameters()])


# -- our own ring all-reduce -----------------------------------------------------------------
def allreduce(send, recv):
    """Implementation of a ring-reduce with addition."""
    rank = dist.get_rank()
    size = dist.get_world_size()
    send_buff = send.clone()
    recv_buff = send.clone()
    accum = send.clone()

    left = ((rank - 1) + size) % size
    right = (rank + 1) % size

    for i in range(size - 1):
        if i % 2 == 0:
            # Send send_buff
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            # Send recv_buff
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def ring(rank, size):
    send = torch.arange(5, dtype=torch.float32) * (rank + 1)
    recv = torch.zeros(5)
    allreduce(send, recv)
    print("Rank ", rank, " has the ring's sum ", recv)
    keep("ring", recv)


PROGRAMS = {
    f.__name__: f for f in (blocking, immediate, group_all_reduce, six_collectives, sgd, ring)
}


def chosen():
    if "--programs" in sys.argv:
        return sys.argv[sys.argv.index("--programs") + 1].split(",")
    return list(PROGRAMS)


def run(rank, size):
    """Every chosen program in turn; a program that raises is recorded and the next one runs."""
    rank, size = dist.get_rank(), dist.get_world_size()  # MPI's recipe passes 0, 0
    for name in chosen():
        try:
            PROGRAMS[name](rank, size)
        except Exception as error:
            keep(name, ("error", type(error).__name__, str(error)))
    with open(os.path.join(OUT, f"{sys.argv[1]}.{rank}.pkl"), "wb") as f:
        pickle.dump(RESULTS, f)


def init_process(rank, size, fn, backend="gloo"):
    """Initialize the distributed environment."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("TUTORIAL_PORT", "29500")
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


if __name__ == "__main__":
    if MPI and dist.__name__ == "minipar":
        init_process(0, 0, run, backend="mpi")
    elif MPI:  # torch's reference in the same job: gloo at the rank and size MPI gave
        init_process(int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"]), run)
    else:
        size = 2
        processes = []
        for rank in range(size):
            p = Process(target=init_process, args=(rank, size, run))
            p.start()
            processes.append(p)

        for p in processes:
            p.join()
        sys.exit(max(p.exitcode for p in processes))
