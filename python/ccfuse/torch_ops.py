"""The fused tensor-parallel ops and the expert-parallel MoE FFN on torch tensors.

    import torch, torch.distributed as dist
    from ccfuse import torch_ops as cf
    dist.init_process_group("nccl"); torch.cuda.set_device(local_rank)
    cf.init()                                  # the process's Team (collective), libccfuse_c.so
    c = cf.ag_gemm(a, b)                       # a [M/W, K], b [K, N] -> c [M, N] = AllGather(a) @ b
    c, g = cf.ag_gemm(a, b, return_gathered=True)   # and g = AllGather(a) [M, K] (a view, no copy)
    y = cf.gemm_rs(x, w)                       # x [M, K/W], w [K/W, N] -> this rank's rows [M/W, N]
    z = cf.gemm_ar(x, w)                       # -> [M, N]
    y = cf.column_parallel_linear(x, w_col)    # Megatron's linears with autograd (sequence parallel:
    y = cf.row_parallel_linear(y, w_row)       #   ag_gemm / gemm_rs forward, gemm_rs / ag_gemm backward)
    moe = cf.MoeFfn(w1, w2, num_experts=E, topk=k, max_tokens=T)
    out = moe(x, topk_ids, topk_w)             # [T, H]
    cf.finalize()                              # before dist.destroy_process_group()

    c = cf.mm(a, b)                            # single GPU, no init() needed: a [M, K] @ b [K, N]
    c = cf.grouped_mm(x, w, group_rows, b_is_weight=True)   # MoE experts: x [R, K], w [G, N, K],
                                               # group_rows int32 [G] on the GPU (rows per expert)

Every call is collective: all ranks call the same ops with the same shapes in the same order
(the ops are cached per shape, and creating one allocates symmetric memory on every rank). The
calls run on torch's current stream with no host synchronisation, so they compose with the
caching allocator's stream semantics. bf16 or fp16 (the MoE FFN: bf16); mm and grouped_mm are not
collective and load the library on first use. Weights of the TP ops: b is [K, N] (a @ b), or
a torch.nn.Linear weight [N, K] with b_is_weight=True. Bad input raises ValueError naming the
argument and the rule; the library's own checks raise ccfuse.CcfuseError.
"""
import torch

from ._capi import Ccfuse

_lib = None
_local_lib = None  # loaded by mm / grouped_mm when init() was not called (no Team)
_ops = {}
_mm_ws_bytes = {}  # mm: workspace bytes per (m, n, k, b_is_weight, dtype, device)


def init(lib_path=None):
    """Loads libccfuse_c.so (lib_path, $CCFUSE_C_LIB or build/) and joins the process's Team."""
    global _lib
    if _lib is None:
        lib = Ccfuse(lib_path)
        lib.init_from_env()
        _lib = lib
    return _lib.world_size()


def finalize():
    """Frees every cached op and the Team (collective)."""
    global _lib
    for op in _ops.values():
        op.close()
    _ops.clear()
    if _lib is not None:
        _lib.finalize()
        _lib = None


def _need_lib():
    if _lib is None:
        raise ValueError("ccfuse is not initialised: call ccfuse.torch_ops.init() first")
    return _lib


def _gemm_lib():
    global _local_lib
    if _lib is not None:
        return _lib
    if _local_lib is None:
        _local_lib = Ccfuse()
    return _local_lib


def _check(name, t, ndim, dtype=torch.bfloat16):
    if not isinstance(t, torch.Tensor):
        raise ValueError("%s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.device.type != "cuda":
        raise ValueError("%s must be a CUDA tensor, got device %s" % (name, t.device))
    if t.dtype not in (dtype if isinstance(dtype, tuple) else (dtype,)):
        raise ValueError("%s must be %s, got %s" % (name, " or ".join(str(d) for d in (
            dtype if isinstance(dtype, tuple) else (dtype,))), t.dtype))
    if t.dim() != ndim:
        raise ValueError("%s must have %d dimensions, got shape %s" % (name, ndim, tuple(t.shape)))
    if not t.is_contiguous():
        raise ValueError("%s must be contiguous (row-major)" % name)


def _out(name, out, shape, like):
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    _check(name, out, len(shape), like.dtype)
    if tuple(out.shape) != tuple(shape):
        raise ValueError("%s must have shape %s, got %s" % (name, tuple(shape), tuple(out.shape)))
    return out


def _no_overlap(out, **inputs):
    for name, t in inputs.items():
        if (out.data_ptr() < t.data_ptr() + t.numel() * t.element_size()
                and t.data_ptr() < out.data_ptr() + out.numel() * out.element_size()):
            raise ValueError("out must not overlap %s" % name)


_GEMM_DTYPES = (torch.bfloat16, torch.float16)


def _tp(op, a, b, b_is_weight, out, return_gathered=False):
    lib = _need_lib()
    w = lib.world_size()
    _check("a", a, 2, _GEMM_DTYPES)
    _check("b", b, 2, a.dtype)  # b in a's dtype
    rows, k_local = a.shape
    k_b, n = (b.shape[1], b.shape[0]) if b_is_weight else (b.shape[0], b.shape[1])
    if op == "ag_gemm":
        m, k = rows * w, k_local
        out_shape = (m, n)
    else:
        m, k = rows, k_local * w
        out_shape = (m // w, n) if op == "gemm_rs" else (m, n)
        if m % w:
            raise ValueError("%s: a has %d rows, not divisible by the world size %d" % (op, m, w))
    if k_b != k_local:
        raise ValueError("%s: a is [.., %d] but b is %s: its K must be %d" % (
            op, k_local, tuple(b.shape), k_local))
    dtype = "bf16" if a.dtype == torch.bfloat16 else "fp16"
    key = (op, m, n, k, not b_is_weight, dtype)
    if key not in _ops:
        _ops[key] = lib.tp_create(op, m, n, k, b_kn=not b_is_weight, dtype=dtype)
    c = _out("out", out, out_shape, a)
    _no_overlap(c, a=a, b=b)
    _ops[key].run(a.data_ptr(), b.data_ptr(), c.data_ptr(), torch.cuda.current_stream(a.device).cuda_stream)
    if return_gathered:
        return c, _device_view(_ops[key].gathered(), (m, k), a)
    return c


class _CudaArray:
    """A device address as __cuda_array_interface__ (int16 elements: the interface has no bfloat16)."""

    def __init__(self, ptr, shape):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": "<i2", "data": (ptr, False),
                                         "version": 2}


def _device_view(ptr, shape, like):
    """A tensor over ccfuse's memory at ptr (no copy), in like's dtype and on its device."""
    return torch.as_tensor(_CudaArray(ptr, shape), device=like.device).view(like.dtype)


def ag_gemm(a, b, out=None, b_is_weight=False, return_gathered=False):
    """AllGather(a) @ b: a = this rank's rows [M/W, K], b [K, N] (or [N, K] with b_is_weight) -> [M, N].

    return_gathered=True returns (c, gathered): gathered is AllGather(a) [M, K], a view of the op's
    own buffer (no copy) that holds these rows until the next ag_gemm call of the same shape on
    this rank: use it (e.g. for the weight gradient) on this stream before that call, or clone it.
    """
    return _tp("ag_gemm", a, b, b_is_weight, out, return_gathered)


def gemm_rs(a, b, out=None, b_is_weight=False):
    """ReduceScatter_rows(a @ b): a [M, K/W] (this rank's K slice), b [K/W, N] -> this rank's rows [M/W, N]."""
    return _tp("gemm_rs", a, b, b_is_weight, out)


def gemm_ar(a, b, out=None, b_is_weight=False):
    """AllReduce(a @ b) split along M: a [M, K/W], b [K/W, N] -> [M, N]."""
    return _tp("gemm_ar", a, b, b_is_weight, out)


# ---- Megatron's tensor-parallel linears with autograd ----------------------------------------
# Weights are the layers' own torch Linear weights, sharded as Megatron shards them: a column-
# parallel layer holds weight [N/W, H] (its output features), a row-parallel one weight [H, K/W]
# (its input features). A bias is added by torch after the fused op (a column-parallel one is this
# rank's shard, a row-parallel one the whole row, after the reduction). Each backward runs the
# fused op that the forward's communication transposes into: AllGather <-> ReduceScatter,
# AllReduce <-> nothing.


class _ColumnParallelSP(torch.autograd.Function):
    """y [S, N/W] = AllGather_rows(x) @ weight.T, x [S/W, H] (this rank's sequence shard)."""

    @staticmethod
    def forward(ctx, x, weight, save_gathered):
        ctx.save_gathered = bool(save_gathered and ctx.needs_input_grad[1])
        if ctx.save_gathered:  # the gathered x for the weight gradient: a copy of the op's buffer
            y, total = ag_gemm(x, weight, b_is_weight=True, return_gathered=True)
            ctx.save_for_backward(total.clone(), weight)
        else:  # gathered again in backward (Megatron's default: less memory, one more all-gather)
            y = ag_gemm(x, weight, b_is_weight=True)
            ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    def backward(ctx, gy):
        saved, weight = ctx.saved_tensors
        gy = gy.contiguous()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = gemm_rs(gy, weight)  # ReduceScatter_rows(gy [S, N/W] @ weight [N/W, H]) -> [S/W, H]
        if ctx.needs_input_grad[1]:
            total = saved if ctx.save_gathered else _all_gather_rows(saved)
            gw = gy.t().matmul(total)  # [N/W, S] @ [S, H]
        return gx, gw, None


class _ColumnParallel(torch.autograd.Function):
    """y [S, N/W] = x @ weight.T, x [S, H] the same on every rank; its gradient is all-reduced."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return mm(x, weight, b_is_weight=True)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gy = gy.contiguous()
        gx = gemm_ar(gy, weight) if ctx.needs_input_grad[0] else None  # AllReduce(gy @ weight) [S, H]
        gw = gy.t().matmul(x) if ctx.needs_input_grad[1] else None
        return gx, gw


class _RowParallelSP(torch.autograd.Function):
    """y [S/W, H] = ReduceScatter_rows(x @ weight.T), x [S, K/W], weight [H, K/W]."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return gemm_rs(x, weight, b_is_weight=True)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        # AllGather_rows(gy) @ weight [H, K/W] -> [S, K/W]; the gathered gy [S, H] is read at once
        # for the weight gradient (before any later call of this op can overwrite it).
        gx, total = ag_gemm(gy.contiguous(), weight, return_gathered=True)
        gw = total.t().matmul(x) if ctx.needs_input_grad[1] else None  # [H, S] @ [S, K/W]
        return (gx if ctx.needs_input_grad[0] else None), gw


class _RowParallel(torch.autograd.Function):
    """y [S, H] = AllReduce(x @ weight.T), x [S, K/W], weight [H, K/W]."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return gemm_ar(x, weight, b_is_weight=True)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gy = gy.contiguous()
        gx = mm(gy, weight) if ctx.needs_input_grad[0] else None  # [S, H] @ [H, K/W], no communication
        gw = gy.t().matmul(x) if ctx.needs_input_grad[1] else None
        return gx, gw


def _all_gather_rows(x):
    """AllGather_rows(x) over torch.distributed's default group (the ranks of ccfuse's Team)."""
    import torch.distributed as dist
    total = torch.empty((x.shape[0] * dist.get_world_size(), x.shape[1]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(total, x.contiguous())
    return total


def column_parallel_linear(x, weight, bias=None, sequence_parallel=True, save_gathered=False):
    """Megatron's ColumnParallelLinear with autograd; weight [N/W, H], bias [N/W] -> y [S, N/W].

    sequence_parallel: x is this rank's shard [S/W, H]; forward ag_gemm, backward gemm_rs for x's
    gradient and, for the weight's, the gathered x: saved from the forward (save_gathered=True, a
    copy of S x H per layer) or gathered again by torch.distributed (default, as Megatron does).
    Otherwise x [S, H] is replicated: forward a local GEMM, backward gemm_ar. The bias (this rank's
    shard) is added after the GEMM by torch, which also gives its gradient.
    """
    if sequence_parallel:
        y = _ColumnParallelSP.apply(x, weight, save_gathered)
    else:
        y = _ColumnParallel.apply(x, weight)
    return y if bias is None else y + bias


def row_parallel_linear(x, weight, bias=None, sequence_parallel=True):
    """Megatron's RowParallelLinear with autograd; x [S, K/W], weight [H, K/W], bias [H].

    sequence_parallel: y = this rank's rows [S/W, H] (forward gemm_rs, backward ag_gemm with its
    gathered gradient for the weight's); otherwise y [S, H] (forward gemm_ar, backward local GEMMs).
    The bias, the same on every rank, is added after the reduction by torch. With sequence
    parallelism its gradient on a rank covers that rank's rows only: sum it over the TP group
    before the optimizer step, as Megatron does for its sequence-parallel parameters.
    """
    if sequence_parallel:
        y = _RowParallelSP.apply(x, weight)
    else:
        y = _RowParallel.apply(x, weight)
    return y if bias is None else y + bias


def _same_device(a, **others):
    for name, t in others.items():
        if t.device != a.device:
            raise ValueError("%s must be on a's device %s, got %s" % (name, a.device, t.device))


def _gemm_dtype(a, b, b_ndim):
    _check("a", a, 2, _GEMM_DTYPES)
    _check("b", b, b_ndim, a.dtype)  # b in a's dtype
    _same_device(a, b=b)
    return "bf16" if a.dtype == torch.bfloat16 else "fp16"


def mm(a, b, out=None, b_is_weight=False):
    """a [M, K] @ b [K, N] (or b [N, K], a Linear weight, with b_is_weight) -> [M, N] on one GPU."""
    dtype = _gemm_dtype(a, b, 2)
    m, k = a.shape
    k_b, n = (b.shape[1], b.shape[0]) if b_is_weight else (b.shape[0], b.shape[1])
    if k_b != k:
        raise ValueError("mm: a is %s but b is %s: its K must be %d" % (tuple(a.shape), tuple(b.shape), k))
    c = _out("out", out, (m, n), a)
    _no_overlap(c, a=a, b=b)
    lib = _gemm_lib()
    # Split-K's partials in torch's caching allocator on this stream (never shared across streams);
    # the size per problem and device (the config depends on the device's SMs) is asked once.
    key = (m, n, k, b_is_weight, dtype, a.device.index)
    ws_bytes = _mm_ws_bytes.get(key)
    if ws_bytes is None:
        ws_bytes = _mm_ws_bytes[key] = lib.gemm_workspace_bytes(m, n, k, b_kn=not b_is_weight, dtype=dtype)
    ws = torch.empty((ws_bytes,), dtype=torch.uint8, device=a.device) if ws_bytes > 0 else None
    lib.gemm(m, n, k, a.data_ptr(), b.data_ptr(), c.data_ptr(), torch.cuda.current_stream(a.device).cuda_stream,
             b_kn=not b_is_weight, dtype=dtype, workspace=ws.data_ptr() if ws is not None else None)
    return c


def grouped_mm(a, b, group_rows, out=None, b_is_weight=False):
    """MoE experts on one GPU: rows [off_g, off_g + group_rows[g]) of the result = the same rows of a @ b[g].

    a [R, K] (rows sorted by group); b [G, K, N], or [G, N, K] (Linear weights) with b_is_weight;
    group_rows: int32 [G] on the GPU (read there: no host sync, capturable in a CUDA graph), off_g
    its prefix sum (from torch._grouped_mm's offs: torch.diff(offs, prepend=offs.new_zeros(1))).
    Returns [R, N]; rows past sum(group_rows) are not written, rows past R are dropped.
    """
    dtype = _gemm_dtype(a, b, 3)
    _check("group_rows", group_rows, 1, torch.int32)
    _same_device(a, group_rows=group_rows)
    rows, k = a.shape
    g = b.shape[0]
    k_b, n = (b.shape[2], b.shape[1]) if b_is_weight else (b.shape[1], b.shape[2])
    if k_b != k:
        raise ValueError("grouped_mm: a is %s but b is %s: its K must be %d" % (tuple(a.shape), tuple(b.shape), k))
    if group_rows.shape[0] != g:
        raise ValueError("group_rows must have one count per group of b (%d), got %d" % (g, group_rows.shape[0]))
    c = _out("out", out, (rows, n), a)
    _no_overlap(c, a=a, b=b)
    lib = _gemm_lib()
    ws = torch.empty((lib.grouped_gemm_workspace_bytes(g),), dtype=torch.uint8, device=a.device)
    lib.grouped_gemm(g, rows, n, k, a.data_ptr(), b.data_ptr(), c.data_ptr(), group_rows.data_ptr(), ws.data_ptr(),
                     torch.cuda.current_stream(a.device).cuda_stream, b_kn=not b_is_weight, dtype=dtype)
    return c


class MoeFfn:
    """The expert-parallel SwiGLU MoE FFN over this rank's experts (E / W of them, contiguous).

    w1: [E/W, 2F, H], per expert the gate rows then the up rows (torch Linear weights); w2:
    [E/W, H, F]. W1 is permuted once into ccfuse's SwiGLU tile order here. imbalance: the routing
    skew hint for the MoE tuner (most rows a rank receives / the mean; 0 = unknown).
    __call__(x [T, H] bf16, topk_ids [T, k] int32 (-1 = dropped), topk_w [T, k] float32) -> [T, H].
    """

    def __init__(self, w1, w2, num_experts, topk, max_tokens, imbalance=0.0):
        lib = _need_lib()
        _check("w1", w1, 3)
        _check("w2", w2, 3)
        e_local, two_f, h = w1.shape
        f = two_f // 2
        if two_f % 2 or tuple(w2.shape) != (e_local, h, f):
            raise ValueError("w2 must be [E/W, H, F] = %s for w1 %s, got %s" % (
                (e_local, h, f), tuple(w1.shape), tuple(w2.shape)))
        if e_local * lib.world_size() != num_experts:
            raise ValueError("w1 holds %d experts, but num_experts %d / world size %d = %s" % (
                e_local, num_experts, lib.world_size(), num_experts / lib.world_size()))
        perm = torch.tensor(lib.swiglu_permutation(f), dtype=torch.long, device=w1.device)
        self.w1 = w1.index_select(1, perm).contiguous()
        self.w2 = w2
        self.hidden, self.topk, self.max_tokens = h, topk, max_tokens
        self._ffn = lib.moe_ffn_create(max_tokens, h, f, num_experts, topk, swiglu=True, b_kn=False,
                                       imbalance=imbalance)

    def describe(self):
        return self._ffn.describe()

    def __call__(self, x, topk_ids, topk_w, out=None):
        _check("x", x, 2)
        _check("topk_ids", topk_ids, 2, torch.int32)
        _check("topk_w", topk_w, 2, torch.float32)
        t = x.shape[0]
        if x.shape[1] != self.hidden:
            raise ValueError("x must be [T, %d], got %s" % (self.hidden, tuple(x.shape)))
        if tuple(topk_ids.shape) != (t, self.topk) or tuple(topk_w.shape) != (t, self.topk):
            raise ValueError("topk_ids and topk_w must be [%d, %d], got %s and %s" % (
                t, self.topk, tuple(topk_ids.shape), tuple(topk_w.shape)))
        if t > self.max_tokens:
            raise ValueError("x has %d tokens, more than max_tokens %d" % (t, self.max_tokens))
        y = _out("out", out, (t, self.hidden), x)
        self._ffn.run(x.data_ptr(), t, topk_ids.data_ptr(), topk_w.data_ptr(), self.w1.data_ptr(),
                      self.w2.data_ptr(), y.data_ptr(), torch.cuda.current_stream(x.device).cuda_stream)
        return y

    def close(self):
        self._ffn.close()
