"""The cost model: how long a message, a collective or a training step should take.

    minipar.cost.predict("all_reduce", "ring", nbytes, world_size)    # seconds, alpha-beta-gamma
    minipar.cost.traffic("all_reduce", "ring", nbytes, world_size)    # steps and bytes it moves

links.py     what a link costs (alpha, beta, gamma): datasheet presets, this machine's fitted link
model.py     each algorithm's steps and bytes, priced on a link; `auto`'s choice; the crossover
roofline.py  the least time any implementation could take on one machine's memory

Light to import: no numpy, no MPI, no torch.
"""

from minipar.cost.links import (
    BETWEEN_NODES,
    DGX_B200,
    DGX_H100,
    HBM3E,
    IB_NDR,
    INTER_LINK_ENV,
    LINK_ENV,
    NVLINK4,
    NVLINK5,
    PCIE5,
    PRESETS,
    SHARED_MEMORY,
    SHARED_WINDOW,
    SHM_LINK_ENV,
    Hierarchy,
    Link,
    default_link,
    inter_link,
    load_link,
    save_link,
    set_default_link,
    set_inter_link,
    set_shm_link,
    shm_link,
)
from minipar.cost.model import (
    SEGMENT_BYTES,
    SHM_MIN_BYTES,
    Traffic,
    all_reduce_on_cluster,
    choose,
    choose_on_nodes,
    crossover,
    pipeline_chunks,
    pipelined_all_reduce,
    predict,
    predict_on_nodes,
    predict_shm,
    prefers_shm,
    shm_traffic,
    traffic,
    traffic_on_nodes,
)

__all__ = [
    "BETWEEN_NODES",
    "DGX_B200",
    "DGX_H100",
    "HBM3E",
    "IB_NDR",
    "INTER_LINK_ENV",
    "LINK_ENV",
    "NVLINK4",
    "NVLINK5",
    "PCIE5",
    "PRESETS",
    "SEGMENT_BYTES",
    "SHARED_MEMORY",
    "SHARED_WINDOW",
    "SHM_LINK_ENV",
    "SHM_MIN_BYTES",
    "Hierarchy",
    "Link",
    "Traffic",
    "all_reduce_on_cluster",
    "choose",
    "choose_on_nodes",
    "crossover",
    "default_link",
    "inter_link",
    "load_link",
    "pipeline_chunks",
    "pipelined_all_reduce",
    "predict",
    "predict_on_nodes",
    "predict_shm",
    "prefers_shm",
    "save_link",
    "set_default_link",
    "set_inter_link",
    "set_shm_link",
    "shm_link",
    "shm_traffic",
    "traffic",
    "traffic_on_nodes",
]
