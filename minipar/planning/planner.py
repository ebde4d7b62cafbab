"""The layout planner: which (dp, tp, pp, micro-batches) fit a model on a cluster, and how fast.

    model = ModelSpec.preset("7b", seq_len=2048, global_batch=256)
    layouts = plan_layouts(model, CLUSTERS["dgx-h100"], gpus=8, zero=1)
    best = layouts[0]          # feasible ones first, fastest first; best.memory, best.time

Memory per GPU (bytes), with P the parameters this GPU's model shard holds, P = params/(tp pp):
- mixed precision with Adam (the ZeRO paper's accounting, Rajbhandari et al. 2020): 2P of 16-bit
  weights, 2P of 16-bit gradients, 12P of fp32 optimizer state (master weights, m, v): 16P.
  In fp32: 4P + 4P + 8P. ZeRO stage 1 divides the optimizer state by dp, stage 2 also the
  gradients, stage 3 (FSDP) also the weights.
- activations of one layer for one micro-batch of b sequences of s tokens, hidden h, a heads,
  tensor parallel t, 16-bit with dropout (Korthikanti et al. 2022, no sequence parallelism):
  s b h (10 + 24/t + 5 a s / (h t)) bytes; selective recomputation (of the attention core)
  drops the 5 a s / (h t); full recomputation keeps only the layer's input, 2 s b h. The same
  terms are written out per value (`layer_activations`), so a model without dropout (minipar's
  GPT, the "tiny" preset: no masks, no dropout outputs) and 4-byte values (the "cpu" cluster)
  get s b h (16 + 48/t + 4 a s / (h t)): minipar/models/memory.py's formula, measured to the
  byte, less its LayerNorm statistics (4 s b values: 0.3% of the tiny GPT's layer). 1F1B keeps
  at most pp micro-batches in flight on the first stage, which holds L/pp layers:
  min(m, pp) * L/pp layers' worth (GPipe would keep all m).

Step time on one GPU, the sum of:
- compute: the training FLOPs (Narayanan et al. 2021: 72 B s L h^2 (1 + s/(6h) + V/(12 L h)),
  96 B s L h^2 (1 + s/(6h) + V/(16 L h)) with full recomputation; selective adds one forward
  of the attention core, 4 B s^2 h L: a s/(18h) beside the 1), divided evenly over the GPUs, at
  `efficiency` times the GPU's peak rate, plus a fixed cost per kernel (`op_overhead`, ~36
  kernels per layer per micro-batch): the term that makes many tiny micro-batches slow;
- bubble: the pipeline fills and drains, idle for (p-1)/m of the compute, i.e. a fraction
  (p-1)/(m+p-1) of the pipeline's time (Megatron-LM 2021, the same for GPipe and 1F1B). With
  more ranks than cores (calibrated_cpu: `core_share` < 1 of a core per rank) an idle stage
  leaves its core to the working ones, and only the fill and drain at a whole core's speed is
  lost: (p-1)/m of the compute times core_share; and nothing when the ranks of one stage of
  every pipeline (1/p of them, all that run at the fill's first slot) outnumber the cores
  (core_share x p <= 1: 4 ranks of pp 2 on 2 cores), for then no core ever idles (nor
  while a stage waits its neighbour's turn for a hop: no `step_wait` on the pipeline's hops);
- tensor-parallel communication, exposed: 4 all-reduces of the b s h activations per layer per
  micro-batch (2 forward, 2 backward; 6 with full recomputation), and the vocabulary-parallel
  embedding's (forward) and the head's (backward) on the stages that hold them, as
  step_messages counts them, on the critical path;
- pipeline communication, exposed: a send of b s h activations forward and of their gradient
  backward in each of the m + p - 1 slots of the schedule;
- data-parallel communication, exposed: the gradient all-reduce (ZeRO 1-2: reduce-scatter plus
  all-gather, the same bytes; ZeRO-3: two all-gathers and a reduce-scatter, 1.5 times that;
  hybrid sharding, `dp_shard`: those three inside the shard group, one all-reduce of the
  gradient shard across; node_traffic.py) less what hides behind the backward pass (assumed:
  up to 2/3 of the compute; on the "cpu" cluster nothing when the gradients fit one 25 MiB
  bucket of minipar's DDP, which starts only after the whole backward, nor of minipar's
  FSDP, whose gathers block).
Each collective is priced with minipar.cost on the link its group spans: a group of g ranks
`stride` apart on nodes of k lies on ceil(g / (k/stride)) nodes (tp innermost, then cp, dp,
pp, as DeviceMesh lays them), or with `fill="cyclic"` (rank r on node r mod N, `minipar run
--fill cyclic`) on min(g, N / gcd(stride, N)) nodes, at NVLink's rate on one node,
InfiniBand's on more; a node's ranks whose messages cross at once share its links when they
outnumber them (`nics_per_node`; node_traffic.senders: block fill, min(stride, k) rings leave a
node; cyclic, every rank's hop crosses); the layout records where each axis runs (`nodes`) and
the bytes a node sends across per step (`across_bytes`). A cluster that runs minipar's own
collectives (`minipar_collectives`: the "cpu" preset) prices FSDP's gathers and reduce-scatters
and tp's all-reduces across nodes as the two-level ones `auto` picks there (DDP's bucket is
two-level across nodes on every cluster).
- waits, only where ranks outnumber cores (the cluster's `step_wait` > 0; 0 for the GPU
  presets): a rank that waits for a peer the scheduler is not running waits its turn, so every
  message-step on the critical path costs `step_wait` more than the link's alpha. The steps
  are minipar.planning.step_messages': the tp all-reduces of the busiest stage (4 per block, the
  embedding's, the head's, the loss's 2, per micro-batch, in the steps of the algorithm `auto`
  runs) times m + p - 1 slots, 2 hops per slot plus 2 small collectives on the pipeline, and
  the dp group's gradient buckets, `used` map and loss. Each axis's waits are added to its comm
  term. calibrated_cpu sets `step_wait` from a measurement (minipar.bench.step_latency: ring
  all-reduces on that many ranks), and from the same measurement a slower per-byte cost.
On a CPU no datasheet gives the compute terms either: measure_flops (a matmul's rate),
measure_compute (efficiency and per-op cost, fitted to dense steps of the tiny GPT) and
step_latency's compute_share (the share of a core each rank gets) calibrate them.
Context parallelism (cp: each sequence over cp ranks, ring or Ulysses) and expert parallelism
(ep: MoE layers every other block, experts over ep of the dp ranks) are priced in axes.py: the
activations divide by cp, the ring's K/V traffic per layer (what its block products do not
hide) or Ulysses' four all-to-alls each way go into `cp_comm`, the MoE layers' four
all-to-alls into `ep_comm`, the experts' memory divides by ep and their gradient all-reduce
(over dp x cp / ep ranks) joins the data-parallel term. A layout is then dp x cp x tp x pp
GPUs; ZeRO shards over the dp x cp ranks that average gradients (Megatron's distributed
optimizer over the data-and-context-parallel group).
These are estimates for choosing a layout, not promises: real kernels, overlap and memory
fragmentation move every term.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from minipar import cost
from minipar.models.config import RunSpec
from minipar.planning import axes, node_traffic, step_messages

GB = 1e9


@dataclass(frozen=True)
class ModelSpec:
    """A GPT-shaped model: layers, hidden, heads, vocabulary, and the batch trained per step."""

    layers: int
    hidden: int
    heads: int
    seq_len: int = 2048
    global_batch: int = 256  # sequences per optimizer step
    vocab: int = 50_304
    ffn: int = 0  # 0: 4 * hidden
    tied_head: bool = False  # the output projection shares the token embedding
    name: str = ""
    dropout: bool = True  # the papers' GPT has dropout (its masks are activations); minipar's not
    experts: int = 0  # 0: dense; E: every other block's MLP a mixture of E experts
    top_k: int = 2  # experts per token in those blocks

    @property
    def moe_layers(self) -> int:
        """Blocks whose MLP is a mixture of experts: 1, 3, 5, ... (minipar.models' GPT)."""
        return self.layers // 2 if self.experts else 0

    @property
    def expert_params(self) -> int:
        """The experts' parameters in all: E MLPs in each MoE layer."""
        h, f = self.hidden, self.ffn or 4 * self.hidden
        return self.moe_layers * self.experts * (2 * h * f + f + h)

    @property
    def params(self) -> int:
        """Block weights 12 L h^2 (with ffn = 4h) plus biases and norms, embeddings, final norm
        and head; an MoE block has E MLPs and a router (E x h) instead of one MLP (the same
        count as minipar.models.GPTConfig.n_params)."""
        h, f = self.hidden, self.ffn or 4 * self.hidden
        block = 4 * h * h + 2 * h * f + 9 * h + f
        moe = self.moe_layers * ((self.experts - 1) * (2 * h * f + f + h) + self.experts * h)
        head = 2 * h + (0 if self.tied_head else self.vocab * h)
        return self.layers * block + moe + (self.vocab + self.seq_len) * h + head

    @staticmethod
    def preset(name: str, **overrides) -> ModelSpec:
        if name not in MODELS:
            raise ValueError(f"no model preset {name!r}; the presets are {', '.join(MODELS)}")
        return replace(MODELS[name], **overrides)

    @staticmethod
    def from_params(params: float, seq_len: int = 2048, global_batch: int = 256) -> ModelSpec:
        """A shape for a parameter count, with hidden ~ 128 x layers as in Llama/GPT-3 models."""
        if not params >= 1e6:
            raise ValueError(f"params must be at least 1e6, got {params!r}")
        hidden = max(128, round((params * 128 / 12) ** (1 / 3) / 128) * 128)
        layers = max(1, round(params / (12 * hidden * hidden)))
        return ModelSpec(layers, hidden, hidden // 128, seq_len, global_batch, name=f"{params:.3g}")

    def train_flops(self, recompute=False) -> float:
        """FLOPs of one training step on the global batch (Narayanan et al. 2021); recompute:
        "none" (or False), "selective" (the attention core's forward again: its two products,
        4 B s^2 h per layer) or "full" (or True: every layer's forward again); plus an MoE
        model's top_k - 1 more MLPs per token in its MoE layers (axes.moe_extra_flops)."""
        B, s, L, h, V = self.global_batch, self.seq_len, self.layers, self.hidden, self.vocab
        policy = recompute_policy(recompute)
        extra = axes.moe_extra_flops(self, policy == "full")
        if policy == "full":
            return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)) + extra
        core = s / (18 * h) if policy == "selective" else 0.0
        return 72 * B * s * L * h * h * (1 + s / (6 * h) + core + V / (12 * L * h)) + extra


def recompute_policy(recompute) -> str:
    """ "none", "selective" or "full" from a policy name or a bool (True: full)."""
    if recompute is True or recompute is False:
        return "full" if recompute else "none"
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be none, selective or full, got {recompute!r}")
    return recompute


MODELS = {
    # minipar train's default tiny GPT (minipar.models.GPTConfig), 8 sequences a step
    "tiny": ModelSpec(8, 64, 8, seq_len=64, global_batch=8, vocab=256, name="tiny", dropout=False),
    "1.3b": ModelSpec(24, 2048, 16, name="1.3b"),
    "7b": ModelSpec(32, 4096, 32, name="7b"),
    "13b": ModelSpec(40, 5120, 40, name="13b"),
    "70b": ModelSpec(80, 8192, 64, name="70b"),
}


OPS_PER_LAYER = 36  # kernels one block runs per micro-batch, forward and backward (an estimate)
OPS_OUTSIDE = 20  # kernels per micro-batch outside the blocks: embedding, head, loss
OPTIMIZER_OPS = 10  # a foreach/fused optimizer's kernels per step


@dataclass(frozen=True)
class Cluster:
    """Nodes of `per_node` accelerators: their memory, peak rate, and the links between them."""

    name: str
    hierarchy: cost.Hierarchy
    memory: float  # bytes per GPU
    peak_flops: float  # per GPU, dense, at the training precision
    efficiency: float = 0.5  # the fraction of peak that real kernels reach (an assumption)
    precision: str = "bf16"  # "bf16" (mixed, with fp32 master weights) or "fp32"
    op_overhead: float = 5e-6  # seconds each kernel (one torch op) costs besides its FLOPs
    source: str = ""
    # seconds each message-step on the critical path costs besides the link's alpha: 0 with a
    # core (or GPU) per rank; with more ranks than cores, the wait for a peer the scheduler is
    # not running (measured: calibrated_cpu)
    step_wait: float = 0.0
    ops_per_layer: int = OPS_PER_LAYER  # kernels per block per micro-batch, forward + backward
    ops_outside: int = OPS_OUTSIDE  # kernels per micro-batch outside the blocks
    optimizer_ops_per_tensor: float = 0.0  # 0: a foreach/fused optimizer, OPTIMIZER_OPS a step
    core_share: float = 1.0  # of a core (GPU) per rank; < 1: ranks outnumber cores
    ddp_bucket_bytes: float = 0.0  # gradients within one bucket hide nothing (0: not modelled)
    # the links out of a node, shared by its ranks' concurrent crossing messages; 0: one per GPU
    # (cost.Hierarchy's assumption); 1: an emulated node's one veth (minipar.cluster)
    nics_per_node: int = 0
    # the collectives minipar's runtime runs across nodes (True: the cpu preset): what `auto`
    # picks on nodes, the two-level ones, for FSDP's vectors and tp's all-reduces (and DDP's
    # buckets, ddp.reduction_algorithm); False: a two-level DDP all-reduce, FSDP's and tp's
    # rings, as NCCL's tree and ring across nodes are priced
    minipar_collectives: bool = False


CLUSTERS = {
    "dgx-b200": Cluster(  # NVIDIA DGX B200 datasheet: 8 GPUs, 1,440 GB HBM3e in all
        "dgx-b200", cost.DGX_B200, 180 * GB, 2.25e15, source="B200: 2.25 PFLOP/s dense BF16"
    ),
    "dgx-h100": Cluster(  # NVIDIA H100 SXM datasheet: 80 GB, 989 TFLOP/s dense BF16
        "dgx-h100", cost.DGX_H100, 80 * GB, 989e12, source="H100 SXM: 989 TFLOP/s dense BF16"
    ),
    "cpu": Cluster(  # minipar's ranks on one laptop-class machine; `--flops` for a measured rate
        "cpu",
        cost.Hierarchy(cost.SHARED_MEMORY, cost.SHARED_MEMORY, 1 << 20),
        8 * GB,
        10e9,
        efficiency=1.0,
        op_overhead=20e-6,  # eager torch on a CPU: tens of microseconds of Python per op
        precision="fp32",
        source="assumed: 10 GFLOP/s and 20 us per op per rank, shared-memory link from cost; "
        "ops counted with torch.profiler on the tiny GPT",
        ops_per_layer=86,  # aten ops of a block, forward and backward (torch.profiler)
        ops_outside=36,  # embedding, head and loss
        optimizer_ops_per_tensor=9,  # torch's AdamW on a CPU loops over the tensors
        ddp_bucket_bytes=step_messages.BUCKET_BYTES,  # minipar's DistributedDataParallel's
        minipar_collectives=True,
    ),
}

# bytes per parameter: (weights, gradients, optimizer state), Adam
_STATE_BYTES = {"bf16": (2, 2, 12), "fp32": (4, 4, 8)}


@dataclass
class Layout:
    dp: int
    tp: int
    pp: int
    micro_batch: int  # sequences per micro-batch
    microbatches: int  # per data-parallel rank per step
    memory: dict = field(default_factory=dict)  # bytes per GPU: weights, grads, optimizer, ...
    time: dict = field(default_factory=dict)  # seconds: compute, tp_comm, pp_comm, dp_comm, ...
    problems: list = field(default_factory=list)  # why it is not feasible; empty: feasible
    cp: int = 1  # context parallel: each sequence over cp ranks
    ep: int = 1  # expert parallel: the experts over ep of the dp ranks
    cp_variant: str = "ring"  # or "ulysses"
    dp_shard: int = 0  # hybrid sharding: ZeRO-3 inside groups of dp_shard ranks; 0: over all dp
    nodes: dict = field(default_factory=dict)  # {axis: nodes one of its groups spans}
    across_bytes: float = 0.0  # bytes one node sends over the link between nodes per step
    zero: int = 0  # the ZeRO stage it was priced with
    fill: str = "block"  # ranks on nodes: "block" (consecutive) or "cyclic" (dealt round)

    @property
    def dp_mode(self) -> str:
        """ "hybrid", "full" (ZeRO-3 over all dp) or "ddp" (ZeRO 0-2: one all-reduce's bytes)."""
        return "hybrid" if self.dp_shard else ("full" if self.zero >= 3 else "ddp")

    @property
    def gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def feasible(self) -> bool:
        return not self.problems

    @property
    def step_time(self) -> float:
        return self.time["total"]

    @property
    def bubble_fraction(self) -> float:
        """(p-1)/(m+p-1): the share of the pipeline's time a stage sits idle."""
        return (self.pp - 1) / (self.microbatches + self.pp - 1)


def state_memory(params_local: float, dp: int, zero: int, precision: str) -> dict:
    """Weights, gradients and optimizer state per GPU, in bytes, for ZeRO stage 0-3."""
    w, g, o = (b * params_local for b in _STATE_BYTES[precision])
    return {
        "weights": w / dp if zero >= 3 else w,
        "grads": g / dp if zero >= 2 else g,
        "optimizer": o / dp if zero >= 1 else o,
    }


def layer_activations(
    m: ModelSpec, tp: int, micro: int, recompute, value_bytes: int, cp: int = 1
) -> float:
    """Bytes one layer keeps for backward for one micro-batch, term by term (Korthikanti et al.
    2022, Table 2), values of `value_bytes`, dropout masks of one byte, for this rank's s/cp
    tokens (context parallelism; its block-wise attention keeps no s x s scores):

        replicated: the two LayerNorms' inputs, the qkv and fc1 inputs    4 s b h values
                    (dropout: the two dropout masks after attention and the MLP, 2 s b h bytes)
        split by t: q, k, v, proj's input, GELU's input, fc2's input      (4h + 2f) s b / t
        attention:  the softmax's output                                  a s^2 b / t values
                    (dropout: its mask, a s^2 b / t bytes, and its output, a s^2 b / t values)

    16-bit with dropout and f = 4h: s b h (10 + 24/t + 5 a s / (h t)), the paper's. Selective
    recomputation drops the attention terms, full keeps the layer's input: s b h values."""
    policy = recompute_policy(recompute)
    s, b, h, a, f = m.seq_len / cp, micro, m.hidden, m.heads, m.ffn or 4 * m.hidden
    if policy == "full":
        return value_bytes * s * b * h
    replicated = 4 * s * b * h * value_bytes + (2 * s * b * h if m.dropout else 0)
    split = (4 * h + 2 * f) * s * b * value_bytes / tp
    core = 0.0
    if policy == "none" and cp == 1:
        core = a * s * s * b / tp * (value_bytes + (1 + value_bytes if m.dropout else 0))
    return replicated + split + core


def activation_memory(
    m: ModelSpec,
    tp: int,
    pp: int,
    micro: int,
    n_micro: int,
    recompute,
    precision: str,
    cp: int = 1,
) -> float:
    """Bytes of stored activations on the first pipeline stage (the one holding the most): its
    L/pp layers for each of the min(m, pp) micro-batches 1F1B keeps in flight there. Context
    parallelism gives each rank s/cp tokens, and its block-wise attention (the ring's online
    softmax, Ulysses' flash attention on a GPU) never stores the s x s scores
    (layer_activations). An MoE layer keeps top_k experts' hidden activations per token where a
    dense one keeps one MLP's (fc1's output and its GELU, 2 f s b values, not split by tp):
    (top_k - 1) times that more, unless the whole layer is recomputed."""
    value_bytes = 4 if precision == "fp32" else 2
    per_layer = layer_activations(m, tp, micro, recompute, value_bytes, cp)
    total = per_layer * m.layers / pp
    if m.experts and recompute_policy(recompute) != "full":
        f = m.ffn or 4 * m.hidden
        tokens = m.seq_len / cp * micro
        total += (m.top_k - 1) * 2 * f * tokens * value_bytes * m.moe_layers / pp
    return total * min(n_micro, pp)


def step_time(m: ModelSpec, c: Cluster, lay: Layout, zero: int, recompute: bool) -> dict:
    """Seconds of one training step, split into compute, bubble and exposed communication."""
    h, gpus = c.hierarchy, lay.gpus
    value_bytes = 4 if c.precision == "fp32" else 2
    flops = m.train_flops(recompute) / gpus / (c.peak_flops * c.efficiency)
    compute = flops + ops_per_step(m, lay, c) * c.op_overhead
    # a stage idle in the fill or drain leaves its core to the working ones: with a share of a
    # core per rank (ranks > cores), only the fill and drain at a whole core's speed is lost,
    # and nothing when one stage of every pipeline (1/pp of the ranks) fills the cores alone
    share = c.core_share
    hidden = share < 1 and share * lay.pp <= 1
    bubble = 0.0 if hidden else compute * share * (lay.pp - 1) / lay.microbatches
    tokens = lay.micro_batch * m.seq_len / lay.cp  # one micro-batch's tokens on this rank
    act = tokens * m.hidden * value_bytes  # their activations: b s h / cp
    per_layer = 6 if recompute_policy(recompute) == "full" else 4  # full: g's again in backward
    ends = 2 if lay.pp == 1 else 1  # the embedding's all-reduce, the head's (the busiest stage)
    tp_calls = (per_layer * (m.layers / lay.pp) + ends) * lay.microbatches
    tp_comm = tp_calls * tp_all_reduce_time(c, lay, act)
    cp_comm = (m.layers / lay.pp) * lay.microbatches * cp_layer_time(m, c, lay, value_bytes)
    ep_link = axis_link(c, lay, "ep")
    ep_layer = axes.expert_time(tokens, m.hidden, m.top_k, lay.ep, value_bytes, ep_link)
    ep_comm = (m.moe_layers / lay.pp) * lay.microbatches * ep_layer
    pp_link = axis_link(c, lay, "pp")
    hop = pp_link.alpha + act * pp_link.beta
    pp_comm = 2 * (lay.microbatches + lay.pp - 1) * hop if lay.pp > 1 else 0.0
    grads = (m.params - m.expert_params) / (lay.tp * lay.pp) * value_bytes
    ranks = lay.dp * lay.cp  # the replicated parameters' gradients average over dp x cp
    # DDP, full sharding or hybrid, each collective at the rate of the link its group spans
    dp_per_node, shard = max(1, h.per_node // lay.tp), lay.dp_shard * lay.cp
    dp_total = node_traffic.sharding_time(
        grads, ranks, dp_per_node, lay.dp_mode, shard, h, c.nics_per_node,
        dp_where(c, lay, lay.tp), c.minipar_collectives,
    )  # fmt: skip
    lay.across_bytes = across_bytes(lay, grads, act, tp_calls, h.per_node, c.minipar_collectives)
    if m.expert_params:  # the experts' gradients: summed over the ranks sharing each expert
        expert_grads = m.expert_params / (lay.ep * lay.pp) * value_bytes
        stride = lay.tp * (lay.ep if lay.cp == 1 else 1)  # how far apart those ranks lie
        dp_total += node_traffic.sharding_time(
            expert_grads, ranks // lay.ep, 0, "ddp", 0, h, c.nics_per_node, dp_where(c, lay, stride)
        )
    # DDP launches a bucket when its gradients are ready: with a single bucket (a model that
    # small) that is after the whole backward, and nothing hides
    # minipar's FSDP (the clusters that model minipar's runtime: ddp_bucket_bytes) gathers and
    # reduces in blocking calls: nothing of ZeRO-3's traffic hides either
    one_bucket = c.ddp_bucket_bytes and (grads <= c.ddp_bucket_bytes or zero >= 3)
    dp_comm = dp_total if one_bucket else max(0.0, dp_total - 2 / 3 * compute)
    waits = {}
    if c.step_wait:  # every message-step on the critical path waits for its peer's turn
        steps = step_messages.message_steps(m, lay, zero, value_bytes)
        waits = {axis: n * c.step_wait for axis, n in steps.items()}
        if hidden:  # a stage waiting for its neighbour's turn leaves the core to the others
            waits["pp"] = 0.0
    tp_comm, pp_comm = tp_comm + waits.get("tp", 0.0), pp_comm + waits.get("pp", 0.0)
    cp_comm, ep_comm = cp_comm + waits.get("cp", 0.0), ep_comm + waits.get("ep", 0.0)
    dp_comm += waits.get("dp", 0.0) + waits.get("expert_dp", 0.0)
    total = compute + bubble + tp_comm + cp_comm + ep_comm + pp_comm + dp_comm
    return {
        "compute": compute,
        "bubble": bubble,
        "tp_comm": tp_comm,
        "cp_comm": cp_comm,
        "ep_comm": ep_comm,
        "pp_comm": pp_comm,
        "dp_comm": dp_comm,
        "dp_total": dp_total,
        "waits": sum(waits.values()),  # already inside the comm terms
        "total": total,
    }


def across_bytes(
    lay: Layout, grads: float, act: float, tp_calls: float, per_node: int, minipar: bool = False
) -> float:
    """Bytes one node sends over the link between nodes per step: the data-parallel traffic
    (node_traffic.sharding_bytes), the tp groups' all-reduces when they span nodes (a ring's
    crossing hops, `senders` of them a node: 2(tp-1)/tp of the activations per call each) and
    the pipeline's activations and their gradients when consecutive stages sit on different
    nodes (2 m b s h per step at a boundary, for each of the node's senders). cp's and ep's
    messages are priced on their link, not counted here. `minipar`: the cluster's
    minipar_collectives (FSDP's and tp's two-level collectives across nodes)."""
    dp_per_node, shard = max(1, per_node // lay.tp), lay.dp_shard * lay.cp
    dp = node_traffic.sharding_bytes(
        grads, lay.dp * lay.cp, dp_per_node, lay.dp_mode, shard, placed(lay, per_node, lay.tp),
        minipar,
    )  # fmt: skip
    total = dp["across"]
    if lay.nodes.get("tp", 1) > 1 and minipar:  # the two-level all-reduce, as for DDP's bytes
        tp = node_traffic.sharding_bytes(act, lay.tp, 0, "ddp", 0, placed(lay, per_node, 1))
        total += tp_calls * tp["across"]
    elif lay.nodes.get("tp", 1) > 1:
        total += senders(lay, per_node, "tp") * tp_calls * 2 * (lay.tp - 1) / lay.tp * act
    if lay.nodes.get("pp", 1) > 1:
        total += senders(lay, per_node, "pp") * 2 * lay.microbatches * act
    return total


def senders(lay: Layout, per_node: int, axis: str) -> int:
    """Ranks of a node whose `axis` messages cross to another node at once (node_traffic)."""
    size, stride = node_traffic.strides(lay.dp, lay.tp, lay.pp, lay.cp, lay.ep)[axis]
    nodes = node_traffic.n_nodes(lay.gpus, per_node)
    return node_traffic.senders(size, stride, per_node, lay.fill, nodes)


def tp_all_reduce_time(c: Cluster, lay: Layout, act: float) -> float:
    """One tp all-reduce of `act` bytes: a ring on the link the tp group spans; on a cluster of
    minipar_collectives across nodes the two-level all-reduce `auto` picks there (each node's
    ranks of the group reduce-scatter, the k-th crosses, all-gather: node_traffic's "ddp")."""
    if lay.nodes.get("tp", 1) == 1 or not c.minipar_collectives:
        return cost.predict("all_reduce", "ring", act, lay.tp, axis_link(c, lay, "tp"))
    h = c.hierarchy
    where = placed(lay, h.per_node, 1)
    return node_traffic.sharding_time(act, lay.tp, 0, "ddp", 0, h, c.nics_per_node, where)


def axis_link(c: Cluster, lay: Layout, axis: str) -> cost.Link:
    """The link `axis`'s groups run at: the node's own when a group fits one, else the link
    between nodes, its rate shared by the node's ranks that cross at once when they outnumber
    its links (`nics_per_node`)."""
    h = c.hierarchy
    if lay.nodes.get(axis, 1) == 1:
        return h.intra
    share = node_traffic.link_share(senders(lay, h.per_node, axis), c.nics_per_node)
    return node_traffic.shared(h.inter, share)


def placed(lay: Layout, per_node: int, stride: int) -> node_traffic.Where:
    """Where a group `stride` ranks apart sits, on this layout's nodes of per_node and fill."""
    return node_traffic.Where(per_node, stride, lay.fill, node_traffic.n_nodes(lay.gpus, per_node))


def dp_where(c: Cluster, lay: Layout, stride: int) -> node_traffic.Where:
    """Where a data-parallel group `stride` ranks apart sits, on the cluster's nodes."""
    return placed(lay, c.hierarchy.per_node, stride)


def cp_layer_time(m: ModelSpec, c: Cluster, lay: Layout, value_bytes: int) -> float:
    """Exposed seconds of one attention layer's context-parallel messages, forward and
    backward, for one micro-batch (axes.py): the ring's or Ulysses'."""
    if lay.cp == 1:
        return 0.0
    link = axis_link(c, lay, "cp")
    shape = (lay.micro_batch, m.seq_len, m.hidden, lay.tp, lay.cp, value_bytes)
    if lay.cp_variant == "ulysses":
        return axes.ulysses_time(*shape, link)
    return axes.ring_time(*shape, link, c.peak_flops * c.efficiency)


def ops_per_step(m: ModelSpec, lay: Layout, c: Cluster | None = None) -> float:
    """Kernels one GPU launches in a step: its L/pp blocks for each of the m micro-batches, the
    embedding, head and loss, and the optimizer. Each costs a fixed overhead besides its FLOPs:
    what makes tiny micro-batches and tiny models slow. The counts are the cluster's (default
    the GPU presets': 36 a block, ~20 outside the blocks, ~10 foreach optimizer kernels); the
    "cpu" cluster's were counted with torch.profiler on the tiny GPT: 86 aten ops a block, 36
    outside, and AdamW's loop over the tensors, 9 ops per parameter tensor."""
    layer, outside = (c.ops_per_layer, c.ops_outside) if c else (OPS_PER_LAYER, OPS_OUTSIDE)
    per_tensor = c.optimizer_ops_per_tensor if c else 0.0
    optimizer = float(OPTIMIZER_OPS)
    if per_tensor:
        tensors = max(step_messages.stage_params(m, lay.tp, lay.pp, s)[1] for s in range(lay.pp))
        optimizer = per_tensor * tensors
    return (layer * m.layers / lay.pp + outside) * lay.microbatches + optimizer


def _problems(m: ModelSpec, c: Cluster, lay: Layout, tp_across_nodes: bool) -> list[str]:
    out = _axis_problems(m, lay)
    if lay.tp > c.hierarchy.per_node and not tp_across_nodes:
        out.append(f"tp={lay.tp} crosses nodes of {c.hierarchy.per_node}")
    if m.heads % lay.tp:
        out.append(f"heads={m.heads} not divisible by tp={lay.tp}")
    if m.layers % lay.pp:
        out.append(f"layers={m.layers} not divisible by pp={lay.pp}")
    if lay.memory["total"] > c.memory:
        out.append(f"needs {lay.memory['total'] / GB:.1f} GB > {c.memory / GB:.0f} GB")
    return out


def _axis_problems(m: ModelSpec, lay: Layout) -> list[str]:
    """Why the cp and ep degrees do not fit the model, if they do not."""
    out = []
    if lay.cp > 1 and m.seq_len % (2 * lay.cp):
        out.append(f"seq={m.seq_len} not divisible by 2cp={2 * lay.cp}")
    if lay.cp_variant == "ulysses" and (m.heads // lay.tp) % lay.cp:
        out.append(f"heads/tp={m.heads}/{lay.tp} not divisible by cp={lay.cp} (Ulysses)")
    if lay.dp % lay.ep:
        out.append(f"ep={lay.ep} does not divide dp={lay.dp}")
    if lay.ep > 1 and not m.experts:
        out.append(f"ep={lay.ep} without experts")
    elif m.experts % lay.ep:
        out.append(f"experts={m.experts} not divisible by ep={lay.ep}")
    return out


def evaluate(
    m: ModelSpec,
    c: Cluster,
    dp: int,
    tp: int,
    pp: int,
    micro_batch: int,
    zero: int = 0,
    recompute: bool = False,
    tp_across_nodes: bool = False,
    cp: int = 1,
    ep: int = 1,
    cp_variant: str = "ring",
    dp_shard: int = 0,
    fill: str = "block",
) -> Layout:
    """Memory and time of one layout; `problems` says why it is infeasible, if it is.
    dp_shard: hybrid sharding (needs zero=3): states sharded over dp_shard consecutive dp ranks
    (a node's with block fill), replicated across; 0: over all dp. fill: how ranks lie on the
    cluster's nodes, "block" (consecutive ranks a node, as launchers do) or "cyclic" (rank r on
    node r mod nodes: `minipar run --fill cyclic`)."""
    node_traffic.check_fill(fill)
    if m.global_batch % (dp * micro_batch):
        raise ValueError(
            f"global_batch={m.global_batch} is not divisible by dp={dp} x micro_batch={micro_batch}"
        )
    if cp_variant not in ("ring", "ulysses"):
        raise ValueError(f"cp_variant must be 'ring' or 'ulysses', got {cp_variant!r}")
    n_micro = m.global_batch // (dp * micro_batch)
    if dp_shard:
        check_hybrid(dp, dp_shard, zero)
    lay = Layout(dp, tp, pp, micro_batch, n_micro, cp=cp, ep=ep, cp_variant=cp_variant)
    lay.dp_shard, lay.zero, lay.fill = dp_shard, zero, fill
    lay.nodes = node_traffic.placement(dp, tp, pp, cp, ep, c.hierarchy.per_node, fill)
    sharded_over = (dp_shard or dp) * cp
    dense = state_memory((m.params - m.expert_params) / (tp * pp), sharded_over, zero, c.precision)
    experts = state_memory(m.expert_params / (ep * pp), max(1, dp * cp // ep), zero, c.precision)
    lay.memory = {key: dense[key] + experts[key] for key in dense}
    lay.memory["activations"] = activation_memory(
        m, tp, pp, micro_batch, n_micro, recompute, c.precision, cp
    )
    lay.memory["total"] = sum(lay.memory.values())
    lay.time = step_time(m, c, lay, zero, recompute)
    lay.problems = _problems(m, c, lay, tp_across_nodes)
    return lay


def check_hybrid(dp: int, dp_shard: int, zero: int) -> None:
    """Hybrid sharding is ZeRO-3 inside shard groups that divide dp (clear errors if not)."""
    if zero != 3:
        raise ValueError(
            f"dp_shard={dp_shard} (--dp-shard) is hybrid sharding: "
            f"it needs zero=3 (--zero 3), got {zero}"
        )
    node_traffic.check_shard(dp, dp_shard)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_layouts(
    model: ModelSpec,
    cluster: Cluster,
    gpus: int,
    zero: int = 0,
    recompute: bool = False,
    micro_batches=None,
    tp_across_nodes: bool = False,
    cp: int = 1,
    ep: int = 1,
    cp_variant: str = "ring",
    dp_shard: int = 0,
    fill: str = "block",
) -> list[Layout]:
    """Every (dp, tp, pp) with dp cp tp pp = gpus (cp and ep fixed; ep dividing dp), and every
    micro-batch size (powers of two, or those given) dividing the per-rank batch: feasible
    layouts first, each group fastest first."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {zero!r}")
    for name, value in (("cp", cp), ("ep", ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if gpus % cp:
        raise ValueError(f"gpus={gpus} is not divisible by cp={cp}")
    if dp_shard:
        check_hybrid(dp_shard, dp_shard, zero)
    node_traffic.check_fill(fill)
    out = []
    for dp in _divisors(gpus // cp):
        if model.global_batch % dp or dp % ep or (dp_shard and dp % dp_shard):
            continue
        for tp in _divisors(gpus // (cp * dp)):
            pp = gpus // (cp * dp * tp)
            per_rank = model.global_batch // dp
            sizes = micro_batches or [1 << k for k in range(per_rank.bit_length())]
            for micro in sizes:
                if per_rank % micro == 0:
                    out.append(
                        evaluate(
                            model,
                            cluster,
                            dp,
                            tp,
                            pp,
                            micro,
                            zero,
                            recompute,
                            tp_across_nodes,
                            cp,
                            ep,
                            cp_variant,
                            dp_shard,
                            fill,
                        )  # fmt: skip
                    )
    if not out:
        raise ValueError(
            f"no layout of {gpus} GPUs (cp={cp}, ep={ep}"
            + (f", dp_shard={dp_shard}" if dp_shard else "")
            + " dividing dp) divides "
            f"global_batch={model.global_batch}"
        )
    out.sort(key=lambda lay: (not lay.feasible, lay.step_time))
    return out


def best(layouts: list[Layout]) -> Layout | None:
    """The fastest feasible layout, or None."""
    feasible = [lay for lay in layouts if lay.feasible]
    return min(feasible, key=lambda lay: lay.step_time) if feasible else None


def bubble_fraction(pp: int, microbatches: int) -> float:
    """(p-1)/(m+p-1) (Megatron-LM 2021)."""
    return (pp - 1) / (microbatches + pp - 1)


def with_peak(
    cluster: Cluster,
    peak_flops: float | None = None,
    memory: float | None = None,
    efficiency: float | None = None,
) -> Cluster:
    """A cluster preset with a measured or different peak rate, memory or efficiency."""
    changes = {"peak_flops": peak_flops, "memory": memory, "efficiency": efficiency}
    return replace(cluster, **{k: v for k, v in changes.items() if v is not None})


def fmt_seconds(t: float) -> str:
    if t == 0:
        return "0"
    if t < 1e-3:
        return f"{t * 1e6:.3g} us"
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def measure_flops(rows: int = 512, hidden: int = 64, repeats: int = 50) -> float:
    """FLOP/s this process reaches on a float32 matmul of the tiny GPT's MLP shape (rows tokens
    x hidden -> 4 hidden): a measured `peak_flops` for the "cpu" cluster. Median of `repeats`,
    each timed in this thread's CPU seconds: other jobs sharing the core do not count."""
    import statistics
    import time

    import torch

    a, b = torch.randn(rows, hidden), torch.randn(hidden, 4 * hidden)
    times = []
    for _ in range(repeats + 1):
        t0 = time.thread_time()
        a @ b
        times.append(time.thread_time() - t0)
    return 2 * rows * hidden * 4 * hidden / statistics.median(times[1:])


def measure_compute(rate: float, steps: int = 4) -> dict:
    """This CPU's `efficiency` and `op_overhead` for the tiny GPT, from one process: the CPU
    seconds (time.process_time: other jobs' load does not count) of dense training steps of
    minipar.models' default GPT with 1 and with 8 micro-batches (the fastest of `steps` each),
    solved for the two unknowns of compute = FLOPs / (rate x efficiency) + kernels x overhead
    (kernels: ops_per_step). `rate`: measure_flops'. Loads torch."""
    import time

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.models import training
    from minipar.models.data import Batches, load_tokens
    from minipar.models.gpt import build_gpt

    spec, seconds = RunSpec(), {}
    model = build_gpt(spec.model, spec.seed)
    opt = training.make_optimizer(model, spec.lr)
    inputs, targets = Batches(load_tokens(), spec.batch_size, spec.model.seq_len, 0).get(0)
    for m in (1, spec.batch_size):
        times = []
        for _ in range(steps + 1):  # the first warms up
            start = time.process_time()
            training.accumulate(model, inputs, targets, m, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.process_time() - start)
        seconds[m] = min(times[1:])
    tiny = MODELS["tiny"]
    cpu = CLUSTERS["cpu"]
    ops = {m: ops_per_step(tiny, Layout(1, 1, 1, tiny.global_batch // m, m), cpu) for m in seconds}
    (m1, t1), (m2, t2) = sorted(seconds.items())
    overhead = max(0.0, (t2 - t1) / (ops[m2] - ops[m1]))
    flops_seconds = max(t1 - ops[m1] * overhead, 0.05 * t1)  # noise must not make it negative
    efficiency = min(1.0, tiny.train_flops() / rate / flops_seconds)
    return {"efficiency": efficiency, "op_overhead": overhead, "step_seconds": seconds}


def core_share(ranks: int, cores: int, share: float | None = None) -> float:
    """Of a core per rank: the measured `share` if given, else cores / ranks (at most 1)."""
    return min(1.0, cores / ranks) if share is None else share


def shared_cores(
    cluster: Cluster,
    ranks: int,
    cores: int,
    peak_flops: float | None = None,
    share: float | None = None,
):
    """The cluster as seen by each of `ranks` processes sharing `cores` cores (oversubscribed):
    a share of the peak rate (measured, or the preset's), each op's overhead stretched alike.
    `share`: of a core per rank, if measured; else cores / ranks (at most 1)."""
    share = core_share(ranks, cores, share)
    peak = cluster.peak_flops if peak_flops is None else peak_flops
    return replace(cluster, peak_flops=peak * share, op_overhead=cluster.op_overhead / share)


def calibrated_cpu(
    ranks: int,
    cores: int,
    alpha,
    peak_flops: float | None = None,
    share: float | None = None,
    cluster: Cluster | None = None,
) -> Cluster:
    """The "cpu" cluster (or `cluster`) for `ranks` processes on `cores` cores, calibrated by
    measurement. Compute: each rank gets `share` of a core (measured, e.g. step_latency's
    compute_share; default cores / ranks as in shared_cores): the rate times it, each op's
    overhead over it. Communication, when ranks outnumber cores: `step_wait` = alpha less the
    link's own alpha for every message-step on the critical path. `alpha`: the measured seconds
    per message-step with `ranks` ranks, a float or a cost.Link (step_latency.measure's, or a
    link file loaded); a Link's beta, if larger, also prices the bytes (on a shared core a large
    message crosses in several turns); and `core_share` shrinks the pipeline's bubble."""
    link = alpha if isinstance(alpha, cost.Link) else None
    alpha = getattr(alpha, "alpha", alpha)
    if not alpha >= 0:
        raise ValueError(f"alpha must be a non-negative number of seconds, got {alpha!r}")
    if share is not None and not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    cluster = cluster or CLUSTERS["cpu"]
    share = core_share(ranks, cores, share)
    base = shared_cores(cluster, ranks, cores, peak_flops, share)
    if ranks <= cores:
        return base
    h = base.hierarchy
    if link is not None and link.beta > h.intra.beta:
        slow = replace(h.intra, name=f"{h.intra.name}, {link.name}", beta=link.beta)
        h = cost.Hierarchy(slow, slow, h.per_node)
    wait = max(0.0, alpha - base.hierarchy.intra.alpha)
    return replace(base, hierarchy=h, step_wait=wait, core_share=share)
