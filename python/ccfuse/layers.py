"""torch.nn layers over ccfuse.torch_ops: Megatron's tensor-parallel linears and an expert-parallel
MoE layer (router + experts), for models written as modules (Megatron, TorchTitan, vLLM-style).

    from ccfuse import torch_ops as cf, layers
    cf.init()                                           # or cf.init(process_group=tp_group)
    up = layers.ColumnParallelLinear(H, 4 * H)          # weight [4H/W, H]; x [S/W, H] -> [S, 4H/W]
    down = layers.RowParallelLinear(4 * H, H)           # weight [H, 4H/W]; -> this rank's rows [S/W, H]
    moe = layers.MoeLayer(H, F, num_experts=E, topk=8, max_tokens=T)   # gate, router, E/W experts
    y = moe(x)                                          # x [T, H] bf16 (this rank's tokens) -> [T, H]
    moe.update_expert_bias()                            # after the optimizer step (bias_update_rate > 0)

Parameters are this rank's shards, drawn on this rank (nn.Linear's bound 1/sqrt(fan_in) with the
layer's whole fan_in): seed each rank as the model's parallel layout needs (Megatron seeds its
tensor-parallel ranks apart). Decisions: docs/integration.md, "Layers".
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from . import torch_ops as cf


def _world_size(group=None):
    """The ranks of the Team a layer runs on: init()'s, or `group`'s (its experts' group)."""
    if group is None or group is cf._group:
        return cf._need_lib().world_size()
    import torch.distributed as dist
    return dist.get_world_size(group)


def _default_device(device):
    return torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)


def _uniform_(t, fan_in):
    bound = 1.0 / math.sqrt(fan_in)
    with torch.no_grad():
        t.uniform_(-bound, bound)


def _divisible(name, value, w, what):
    if value <= 0 or value % w:
        raise ValueError("%s %d must be a positive multiple of the world size %d (%s)" % (name, value, w, what))


class _ParallelLinear(nn.Module):
    """A Megatron linear's shard: weight [out, in] with one dimension split over the Team (split:
    0 = the outputs, 1 = the inputs), bias [out] or its shard, nn.Linear's initialisation bound."""

    def __init__(self, in_features, out_features, split, bias, sequence_parallel, dtype, device):
        super().__init__()
        w = _world_size()
        if split == 0:
            _divisible("out_features", out_features, w, "ColumnParallelLinear splits its outputs")
        else:
            _divisible("in_features", in_features, w, "RowParallelLinear splits its inputs")
        self.in_features, self.out_features, self.sequence_parallel = in_features, out_features, sequence_parallel
        device = _default_device(device)
        shape = [out_features, in_features]
        shape[split] //= w
        self.weight = nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))
        if bias:
            self.bias = nn.Parameter(torch.empty(shape[0], dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_(self.weight, self.in_features)
        if self.bias is not None:
            _uniform_(self.bias, self.in_features)

    def extra_repr(self):
        return "in_features=%d, out_features=%d, this rank's weight %s, bias=%s, sequence_parallel=%s" % (
            self.in_features, self.out_features, tuple(self.weight.shape), self.bias is not None,
            self.sequence_parallel)


class ColumnParallelLinear(_ParallelLinear):
    """y = x W^T + b with the output features split over the Team: weight [out/W, in], bias [out/W].

    sequence_parallel=True: x is this rank's rows [S/W, in] and y all rows of this rank's columns
    [S, out/W] (ag_gemm forward; gemm_rs for x's gradient). False: x [S, in] replicated, y [S, out/W]
    (a local GEMM; gemm_ar for x's gradient). save_gathered keeps the gathered x for the weight's
    gradient (S x in more memory) instead of gathering it again in the backward."""

    def __init__(self, in_features, out_features, bias=False, sequence_parallel=True, save_gathered=False,
                 dtype=torch.bfloat16, device=None):
        self.save_gathered = save_gathered
        super().__init__(in_features, out_features, 0, bias, sequence_parallel, dtype, device)

    def forward(self, x):
        return cf.column_parallel_linear(x, self.weight, self.bias, sequence_parallel=self.sequence_parallel,
                                         save_gathered=self.save_gathered)


class RowParallelLinear(_ParallelLinear):
    """y = x W^T + b with the input features split over the Team: weight [out, in/W], bias [out]
    (the same on every rank, added after the reduction).

    sequence_parallel=True: y is this rank's rows [S/W, out] (gemm_rs forward; ag_gemm backward).
    False: y [S, out] on every rank (gemm_ar). With sequence parallelism the bias's gradient on a
    rank covers its rows only: sum it over the Team before the optimizer step (as Megatron does for
    its sequence-parallel parameters)."""

    def __init__(self, in_features, out_features, bias=False, sequence_parallel=True, dtype=torch.bfloat16,
                 device=None):
        super().__init__(in_features, out_features, 1, bias, sequence_parallel, dtype, device)

    def forward(self, x):
        return cf.row_parallel_linear(x, self.weight, self.bias, sequence_parallel=self.sequence_parallel)


class MoeExperts(nn.Module):
    """This rank's E/W experts of an expert-parallel SwiGLU FFN: w1 [E/W, 2F, H] (per expert the
    gate rows, then the up rows), w2 [E/W, H, F]. forward(x [T, H], topk_ids [T, k] int32 (-1:
    dropped), topk_w [T, k] fp32) -> [T, H]: every rank's tokens go to the experts' ranks and back
    (torch_ops.MoeFfn, fused; backward "fused" or "unfused").

    The kernels' MoeFfn is made with the module (collective), or by materialize() after a
    meta-device build (to_empty + reset_parameters). New Parameter objects (to_empty) are picked up
    by the next eager forward; after a `.data` swap (which in-place updates do not need: those are
    followed by w1's version counter) call materialize().

    imbalance, backward, recompute and the keyword-only wgrad, main_grad and kept_rows are passed
    to torch_ops.MoeFfn with its defaults and meaning (its docstring has the details):
    - recompute (fused backward only; None: False with backward="fused", True with "unfused"):
      False keeps layer 0's pre-activation h from the training forward for the backward.
    - kept_rows (recompute=False only; None: MoeFfn's default, max_tokens * topk * 5/4 rounded up
      to 128, at most the receive bound max_tokens * topk * W): the rows of the kept h; a step
      that receives more recomputes h in its backward (decided on the device).
    - wgrad (backward="fused"): who computes the weight gradients: "ccfuse" (default: the
      K-grouped GEMM) or "torch" (torch._grouped_mm).
    - main_grad (backward="fused", eager mode only): Megatron's gradient-accumulation fusion: the
      backward adds d w1 and d w2 into w1.main_grad and w2.main_grad instead of returning them.
      The caller gives both Parameters (this module's w1 and w2) an fp32, contiguous `main_grad`
      shaped like the weight on its device, zeroed when a step starts, as Megatron's DDP does
      (a view of its fp32 gradient buffer; zero_grad_buffer() zeroes it):
          for w in (experts.w1, experts.w2):
              w.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
              w.grad_added_to_main_grad = False   # Megatron's DDP sets this flag too
      MoeFfn checks them at each training forward and backward (ValueError naming the weight).
      Where the weight has grad_added_to_main_grad, autograd gets a dummy gradient (zeros if
      w.zero_out_wgrad, else empty) and the flag is set to True, so the weight's gradient hooks
      (Megatron DDP's) still run and skip their add; without the flag autograd gets None for the
      weight (w.grad stays None: the optimizer must read w.main_grad).
    - process_group (None: the Team of torch_ops.init()): the expert-parallel group when it is not
      init()'s (e.g. TP ops on the TP group, the experts over the EP group); E/W experts a rank
      with W its size (torch_ops.MoeFfn's group).
    The option checks are MoeFfn's (torch_ops.moe_ffn_options: a ValueError naming the argument and
    the rule), at construction (a meta-device build too) and again when MoeFfn is made."""

    def __init__(self, hidden, ffn, num_experts, topk, max_tokens, imbalance=0.0, backward="fused",
                 recompute=None, dtype=torch.bfloat16, device=None, *, wgrad="ccfuse", main_grad=False,
                 kept_rows=None, process_group=None):
        super().__init__()
        self.process_group = process_group
        w = _world_size(process_group)
        _divisible("num_experts", num_experts, w, "each rank holds num_experts / W experts")
        if not 0 < topk <= num_experts:
            raise ValueError("topk %d must be in [1, num_experts %d]" % (topk, num_experts))
        # MoeFfn's own checks, here too so that a meta-device build fails at construction
        self.recompute = cf.moe_ffn_options(backward, recompute, wgrad, main_grad, kept_rows)
        self.hidden, self.ffn, self.num_experts, self.topk = hidden, ffn, num_experts, topk
        self.max_tokens, self.imbalance, self.backward = max_tokens, imbalance, backward
        self.wgrad, self.main_grad, self.kept_rows = wgrad, main_grad, kept_rows
        device = _default_device(device)
        el = num_experts // w
        self.w1 = nn.Parameter(torch.empty(el, 2 * ffn, hidden, dtype=dtype, device=device))
        self.w2 = nn.Parameter(torch.empty(el, hidden, ffn, dtype=dtype, device=device))
        self._layer = None
        self.reset_parameters()
        if device.type != "meta":
            self.materialize()

    def reset_parameters(self):
        _uniform_(self.w1, self.hidden)
        _uniform_(self.w2, self.ffn)

    def materialize(self):
        """(Re)makes the kernels' MoeFfn over the current parameters (collective: every rank)."""
        if self.w1.device.type == "meta":
            raise ValueError("MoeExperts: the parameters are on the meta device; move them to a GPU "
                             "(to_empty, then reset_parameters) first")
        if self._layer is not None:
            self._layer.close()
        self._layer = cf.MoeFfn(self.w1, self.w2, num_experts=self.num_experts, topk=self.topk,
                                max_tokens=self.max_tokens, imbalance=self.imbalance, backward=self.backward,
                                recompute=self.recompute, wgrad=self.wgrad, main_grad=self.main_grad,
                                kept_rows=self.kept_rows, group=self.process_group)
        return self

    def forward(self, x, topk_ids, topk_w):
        layer = self._layer
        if layer is None or layer._w1_src is not self.w1 or layer.w2 is not self.w2:
            if cf._compiling():
                raise ValueError("MoeExperts: call materialize() after building or moving the parameters, "
                                 "before torch.compile runs the layer")
            self.materialize()
        return self._layer(x, topk_ids, topk_w)

    def close(self):
        """Frees the kernels' buffers (collective); a later forward makes them again."""
        if self._layer is not None:
            self._layer.close()
            self._layer = None

    def extra_repr(self):
        return ("hidden=%d, ffn=%d, num_experts=%d (this rank: %d), topk=%d, max_tokens=%d, backward=%s, "
                "recompute=%s, kept_rows=%s, wgrad=%s, main_grad=%s" % (
                    self.hidden, self.ffn, self.num_experts, self.w1.shape[0], self.topk, self.max_tokens,
                    self.backward, self.recompute, self.kept_rows, self.wgrad, self.main_grad))


def router_weights(logits, topk_ids, topk_w, score="softmax", normalize=True, bias=None, drops=True):
    """The router's weights (topk_w, torch_ops.route's: their values) with the gradient they have
    as functions of logits [T, E]: the scores (softmax or sigmoid of the logits) at the chosen ids,
    divided, when normalize, by the sum of the scores of the k experts chosen before any capacity
    drop (the router normalises first and drops after, without renormalising); a dropped entry
    (id -1) is 0. drops=False (a dropless router): the k ids are the chosen ones. With drops the
    chosen set is found again by torch.topk on the scores (+ bias): it differs from the router's
    only between experts of equal score + bias."""
    scores = torch.softmax(logits, dim=-1) if score == "softmax" else torch.sigmoid(logits)
    ids = topk_ids.long()
    kept = ids >= 0
    sel = scores.gather(1, ids.clamp_min(0))
    if normalize:
        if drops:
            steer = scores.detach() if bias is None else scores.detach() + bias
            chosen = torch.topk(steer, ids.shape[1], dim=1).indices
            denom = scores.gather(1, chosen).sum(1, keepdim=True)
        else:
            denom = sel.sum(1, keepdim=True)
        sel = sel / denom
    sel = torch.where(kept, sel, torch.zeros_like(sel))
    return topk_w + (sel - sel.detach())


class MoeLayer(nn.Module):
    """An expert-parallel MoE layer: a gate (fp32 [E, H], replicated), ccfuse's GPU router and this
    rank's experts (MoeExperts). forward(x [T, H] bf16, this rank's tokens) -> [T, H].

    score "softmax" | "sigmoid", normalize, capacity_factor (0: dropless) and drop as
    torch_ops.route. The gate gets its gradient through router_weights. bias_update_rate > 0: the
    aux-loss-free balancing of DeepSeek-V3: the router's choice is steered by the buffer
    expert_bias; training forwards count the tokens each expert got (summed over the Team by
    update_expert_bias, which applies bias += rate * sign(mean - load) and resets the count; call it
    once a step, after the optimizer's). last_tokens_per_expert / last_dropped: the last forward's
    statistics (GPU tensors, no host sync).

    imbalance, backward, recompute and the keyword-only wgrad ("ccfuse" | "torch"), main_grad
    (Megatron's gradient-accumulation fusion, eager only) and kept_rows (the kept h's rows with
    recompute=False; None: the default) go to the experts (MoeExperts, then torch_ops.MoeFfn),
    with their defaults, meaning and checks (MoeExperts' docstring); they show in the experts'
    repr. main_grad=True: give self.experts.w1 and self.experts.w2 their fp32 `main_grad` (and
    `grad_added_to_main_grad`) as MoeExperts says; the gate's gradient stays autograd's (.grad).
    process_group (keyword-only; None: init()'s Team): the experts' group (MoeExperts); the
    balancing step sums the expert counts over it."""

    def __init__(self, hidden, ffn, num_experts, topk, max_tokens, score="softmax", normalize=True,
                 capacity_factor=0.0, drop="position", bias_update_rate=0.0, imbalance=0.0, backward="fused",
                 recompute=None, dtype=torch.bfloat16, device=None, *, wgrad="ccfuse", main_grad=False,
                 kept_rows=None, process_group=None):
        super().__init__()
        if score not in ("softmax", "sigmoid"):
            raise ValueError("score must be 'softmax' or 'sigmoid', got %r" % (score,))
        if capacity_factor < 0:
            raise ValueError("capacity_factor %s must be >= 0 (0: dropless)" % (capacity_factor,))
        if bias_update_rate < 0:
            raise ValueError("bias_update_rate %s must be >= 0 (0: no load-aware balancing)" % (bias_update_rate,))
        device = _default_device(device)
        self.topk, self.score, self.normalize = topk, score, normalize
        self.capacity_factor, self.drop, self.bias_update_rate = float(capacity_factor), drop, float(bias_update_rate)
        self.experts = MoeExperts(hidden, ffn, num_experts, topk, max_tokens, imbalance=imbalance,
                                  backward=backward, recompute=recompute, dtype=dtype, device=device,
                                  wgrad=wgrad, main_grad=main_grad, kept_rows=kept_rows,
                                  process_group=process_group)
        self.gate = nn.Parameter(torch.empty(num_experts, hidden, dtype=torch.float32, device=device))
        self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32, device=device))
        # the step's count, not state: left out of state_dict
        self.register_buffer("tokens_seen", torch.zeros(num_experts, dtype=torch.float32, device=device),
                             persistent=False)
        self.last_tokens_per_expert = self.last_dropped = None
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_(self.gate, self.experts.hidden)

    def forward(self, x):
        logits = F.linear(x.float(), self.gate)
        bias = self.expert_bias if self.bias_update_rate > 0 else None
        ids, w, counts, dropped = cf.route(logits.detach(), self.topk, bias=bias, score=self.score,
                                           normalize=self.normalize, capacity_factor=self.capacity_factor,
                                           drop=self.drop)
        if logits.requires_grad:  # the gate's or x's gradient through the router's weights
            w = router_weights(logits, ids, w, self.score, self.normalize, bias, drops=self.capacity_factor > 0)
        if self.training and self.bias_update_rate > 0:
            with torch.no_grad():
                self.tokens_seen.add_(counts.float())
        self.last_tokens_per_expert, self.last_dropped = counts, dropped
        return self.experts(x, ids, w)

    @torch.no_grad()
    def update_expert_bias(self):
        """The balancing step (collective at W > 1: the counts are summed over the Team's group)."""
        if self.bias_update_rate <= 0:
            return self.expert_bias
        load = self.tokens_seen
        group = self.experts.process_group
        if _world_size(group) > 1:
            import torch.distributed as dist
            dist.all_reduce(load, group=cf._group if group is None else group)
        cf.update_router_bias(self.expert_bias, load, self.bias_update_rate)
        load.zero_()
        return self.expert_bias

    def extra_repr(self):
        return "score=%s, normalize=%s, capacity_factor=%s, drop=%s, bias_update_rate=%s" % (
            self.score, self.normalize, self.capacity_factor, self.drop, self.bias_update_rate)
