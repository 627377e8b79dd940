"""The fused tensor-parallel ops and the expert-parallel MoE FFN on torch tensors.

    import torch, torch.distributed as dist
    from ccfuse import torch_ops as cf
    dist.init_process_group("nccl"); torch.cuda.set_device(local_rank)
    cf.init()                                  # the process's Team (collective), libccfuse_c.so
    # or cf.init(process_group=tp_group): the Team on that NCCL group's communicator (borrowed)
    c = cf.ag_gemm(a, b)                       # a [M/W, K], b [K, N] -> c [M, N] = AllGather(a) @ b
    c, g = cf.ag_gemm(a, b, return_gathered=True)   # and g = AllGather(a) [M, K] (a view, no copy)
    y = cf.gemm_rs(x, w)                       # x [M, K/W], w [K/W, N] -> this rank's rows [M/W, N]
    z = cf.gemm_ar(x, w)                       # -> [M, N]
    y = cf.column_parallel_linear(x, w_col)    # Megatron's linears with autograd (sequence parallel:
    y = cf.row_parallel_linear(y, w_row)       #   ag_gemm / gemm_rs forward, gemm_rs / ag_gemm backward)
    topk_ids, topk_w, counts, dropped = cf.route(logits, k, capacity_factor=1.25)  # ccfuse's GPU router
    moe = cf.MoeFfn(w1, w2, num_experts=E, topk=k, max_tokens=T)
    out = moe(x, topk_ids, topk_w)             # [T, H] (autograd; backward="fused" also compiles)
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

Autograd: ag_gemm, gemm_rs, gemm_ar and mm on tensors that require grad have backward passes (the
fused op the communication transposes into; b is this rank's weight shard, as in Megatron), and
grouped_mm (b's gradient by ccfuse's K-grouped GEMM), and the MoE FFN (recomputed, unfused: moe_grad;
or ccfuse's fused MoeFfnBackward). Modules over these: ccfuse.layers.
torch.compile: the kernels are custom ops (torch.ops.ccfuse.*) while it traces, so graphs keep
them (fullgraph=True works); see docs/integration.md for what differs there.
"""
import torch

from ._capi import Ccfuse

_lib = None
_local_lib = None  # loaded by mm / grouped_mm when init() was not called (no Team)
_ops = {}
_mm_ws_bytes = {}  # mm: workspace bytes per (m, n, k, b_is_weight, dtype, device)


_group = None  # the torch.distributed group of ccfuse's Team (None: the default group)
_teams = {}  # id(group) -> (group, _capi.Team): further Teams, one per other group (MoeFfn(group=))


def init(lib_path=None, process_group=None):
    """Loads libccfuse_c.so (lib_path, $CCFUSE_C_LIB or build/) and joins the process's Team:
    its own (a second NCCL communicator, from torchrun's environment) or, with process_group (an
    NCCL group of torch.distributed, e.g. the tensor-parallel one), that group's communicator,
    borrowed (collective over the group; the group must outlive finalize()). The backward passes'
    torch collectives then run on the same group. Returns the Team's world size."""
    global _lib, _group
    if _lib is None:
        lib = Ccfuse(lib_path)
        if process_group is None:
            lib.init_from_env()
        else:
            lib.init_from_comm(_nccl_comm(process_group))
        _lib, _group = lib, process_group
    elif process_group is not _group:
        raise ValueError("init: ccfuse's Team exists already on another group: call finalize() first")
    return _lib.world_size()


def _nccl_comm(group):
    """The address of group's NCCL communicator on the current device (created by torch on a
    group's first collective: one all_reduce of one element makes sure it exists)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("process_group: torch.distributed is not initialised (dist.init_process_group first)")
    if not torch.cuda.is_available():
        raise ValueError("process_group: no CUDA device here (ccfuse's Team lives on a GPU)")
    dev = torch.device("cuda", torch.cuda.current_device())
    try:
        backend = group._get_backend(dev)
    except (AttributeError, RuntimeError) as e:
        raise ValueError("process_group: no backend for %s in this group (%s)" % (dev, e))
    comm_ptr = getattr(backend, "_comm_ptr", None)
    if comm_ptr is None:
        raise ValueError("process_group must be an NCCL group (its backend %s has no NCCL communicator)"
                         % type(backend).__name__)
    dist.all_reduce(torch.zeros(1, device=dev), group=group)
    ptr = int(comm_ptr())
    if ptr == 0:
        raise ValueError("process_group: its NCCL communicator on %s does not exist" % dev)
    return ptr


def _team_for(group):
    """(the Team to make an op on: None for the process's, its world size, the torch group its
    backward's collectives use) for ops on `group`: None or init()'s group is the process's Team;
    another NCCL group (e.g. the expert-parallel one beside a tensor-parallel init) gets a Team of
    its own on its communicator, made at its first use (collective over the group) and kept until
    finalize()."""
    lib = _need_lib()
    if group is None or group is _group:
        return None, lib.world_size(), _group
    entry = _teams.get(id(group))
    if entry is None:
        entry = _teams[id(group)] = (group, lib.team_from_comm(_nccl_comm(group)))
    return entry[1], entry[1].world_size(), group


def finalize():
    """Frees every cached op and the Teams (collective)."""
    global _lib, _group
    for ffn in list(_moe_ffns.values()):
        ffn.close()
    for op in _ops.values():
        op.close()
    _ops.clear()
    for _g, team in _teams.values():
        team.close()
    _teams.clear()
    if _lib is not None:
        _lib.finalize()
        _lib = None
    _group = None


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


# ---- the kernels (no autograd) ------------------------------------------------------------------
# Each public op below checks its operands, then either runs its kernel here (eager) or, while
# torch.compile traces, calls the same kernel registered as a torch.library custom op
# (torch.ops.ccfuse.*, registered at the end of this module), whose fake implementation gives the
# output's shape from the same checks.


def _tp_shape(op, a, b, b_is_weight):
    """Checks a fused TP op's operands; returns (m, n, k, the output's shape)."""
    w = _need_lib().world_size()
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
    return m, n, k, out_shape


def _tp_run(op, a, b, b_is_weight, out=None, return_gathered=False):
    m, n, k, out_shape = _tp_shape(op, a, b, b_is_weight)
    dtype = "bf16" if a.dtype == torch.bfloat16 else "fp16"
    key = (op, m, n, k, not b_is_weight, dtype)
    if key not in _ops:
        _ops[key] = _lib.tp_create(op, m, n, k, b_kn=not b_is_weight, dtype=dtype)
    c = _out("out", out, out_shape, a)
    _no_overlap(c, a=a, b=b)
    _ops[key].run(a.data_ptr(), b.data_ptr(), c.data_ptr(), torch.cuda.current_stream(a.device).cuda_stream)
    if return_gathered:
        return c, _device_view(_ops[key].gathered(), (m, k), a)
    return c


class _CudaArray:
    """A device address as __cuda_array_interface__ (int16 elements: the interface has no bfloat16)."""

    def __init__(self, ptr, shape, typestr="<i2"):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
                                         "version": 2}


def _device_view(ptr, shape, like):
    """A tensor over ccfuse's memory at ptr (no copy), in like's dtype and on its device."""
    return torch.as_tensor(_CudaArray(ptr, shape), device=like.device).view(like.dtype)


def _same_device(a, **others):
    for name, t in others.items():
        if t.device != a.device:
            raise ValueError("%s must be on a's device %s, got %s" % (name, a.device, t.device))


def _gemm_dtype(a, b, b_ndim):
    _check("a", a, 2, _GEMM_DTYPES)
    _check("b", b, b_ndim, a.dtype)  # b in a's dtype
    _same_device(a, b=b)
    return "bf16" if a.dtype == torch.bfloat16 else "fp16"


def _mm_shape(a, b, b_is_weight):
    dtype = _gemm_dtype(a, b, 2)
    m, k = a.shape
    k_b, n = (b.shape[1], b.shape[0]) if b_is_weight else (b.shape[0], b.shape[1])
    if k_b != k:
        raise ValueError("mm: a is %s but b is %s: its K must be %d" % (tuple(a.shape), tuple(b.shape), k))
    return m, n, k, dtype


def _mm_run(a, b, b_is_weight, out=None):
    m, n, k, dtype = _mm_shape(a, b, b_is_weight)
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


def _grouped_shape(a, b, group_rows, b_is_weight):
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
    return g, rows, n, k, dtype


def _grouped_run(a, b, group_rows, b_is_weight, out=None):
    g, rows, n, k, dtype = _grouped_shape(a, b, group_rows, b_is_weight)
    c = _out("out", out, (rows, n), a)
    _no_overlap(c, a=a, b=b)
    lib = _gemm_lib()
    ws = torch.empty((lib.grouped_gemm_workspace_bytes(g),), dtype=torch.uint8, device=a.device)
    lib.grouped_gemm(g, rows, n, k, a.data_ptr(), b.data_ptr(), c.data_ptr(), group_rows.data_ptr(), ws.data_ptr(),
                     torch.cuda.current_stream(a.device).cuda_stream, b_kn=not b_is_weight, dtype=dtype)
    return c


def _kgrouped_shape(a, b, group_rows):
    dtype = _gemm_dtype(a, b, 2)
    _check("group_rows", group_rows, 1, torch.int32)
    _same_device(a, group_rows=group_rows)
    if b.shape[0] != a.shape[0]:
        raise ValueError("kgrouped_mm: a is %s and b is %s: both must have the same rows (the contraction)" % (
            tuple(a.shape), tuple(b.shape)))
    return group_rows.shape[0], a.shape[0], a.shape[1], b.shape[1], dtype


def _kgrouped_run(a, b, group_rows, out=None):
    """[G, m, n]: c[g] = a_g^T @ b_g over group g's rows of a [R, m] and b [R, n] (groups in order,
    group_rows on the device; zeros for a group without rows): the experts' weight gradients by
    ccfuse's K-grouped GEMM."""
    g, rows, m, n, dtype = _kgrouped_shape(a, b, group_rows)
    c = _out("out", out, (g, m, n), a)
    _no_overlap(c, a=a, b=b)
    lib = _gemm_lib()
    ws = torch.empty((lib.grouped_gemm_workspace_bytes(g),), dtype=torch.uint8, device=a.device)
    lib.kgrouped_gemm(g, rows, m, n, a.data_ptr(), b.data_ptr(), c.data_ptr(), group_rows.data_ptr(), ws.data_ptr(),
                      torch.cuda.current_stream(a.device).cuda_stream, dtype=dtype)
    return c


_EAGER = {
    "ag_gemm": lambda a, b, bw, out=None: _tp_run("ag_gemm", a, b, bw, out),
    "ag_gemm_gathered": lambda a, b, bw, out=None: _tp_run("ag_gemm", a, b, bw, out, return_gathered=True),
    "gemm_rs": lambda a, b, bw, out=None: _tp_run("gemm_rs", a, b, bw, out),
    "gemm_ar": lambda a, b, bw, out=None: _tp_run("gemm_ar", a, b, bw, out),
    "mm": _mm_run,
    "grouped_mm": _grouped_run,
    "kgrouped_mm": _kgrouped_run,
}


def _compiling():
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def _kernel(name, *args, out=None):
    """Runs op `name` without autograd: eagerly, or as torch.ops.ccfuse.<name> while torch.compile
    traces (a functional op: its result is copied into out when one is given)."""
    if not _compiling():
        return _EAGER[name](*args, out=out)
    r = getattr(torch.ops.ccfuse, name)(*args)
    if out is None:
        return r
    if isinstance(r, tuple):
        out.copy_(r[0])
        return (out,) + tuple(r[1:])
    out.copy_(r)
    return out


# ---- autograd ------------------------------------------------------------------------------------
# The gradients follow Megatron's conventions: b is this rank's shard of a weight (ag_gemm: its
# output columns; gemm_rs / gemm_ar: its input rows), and the gradient of an output that is the
# same on every rank (gemm_ar's) is the same on every rank. Each backward runs the fused op that
# the forward's communication transposes into: AllGather <-> ReduceScatter, AllReduce <-> nothing.


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


def _no_out_with_grad(out):
    if out is not None:
        raise ValueError("out= is not supported when an input requires grad (autograd needs a fresh output)")


def _wgrad(a, g, b_is_weight):
    """The gradient of b in c = a @ b (b [K, N]) or c = a @ b.T (b_is_weight, b [N, K]); a [M, K], g [M, N]."""
    return g.t().matmul(a) if b_is_weight else a.t().matmul(g)


class _AgGemmFn(torch.autograd.Function):
    """c [M, N] = AllGather_rows(a) @ b, a [M/W, K]; backward gemm_rs for a, the gathered a for b."""

    @staticmethod
    def forward(ctx, a, b, b_is_weight, save_gathered, return_gathered):
        ctx.b_is_weight = b_is_weight
        ctx.save_gathered = bool(save_gathered and ctx.needs_input_grad[1])
        total = None
        if ctx.save_gathered or return_gathered:
            c, total = _kernel("ag_gemm_gathered", a, b, b_is_weight)
        else:
            c = _kernel("ag_gemm", a, b, b_is_weight)
        if ctx.save_gathered:  # for b's gradient: a copy of the op's buffer (valid until its next call)
            ctx.save_for_backward(total.clone(), b)
        else:  # gathered again in backward (Megatron's default: less memory, one more all-gather)
            ctx.save_for_backward(a, b)
        if return_gathered:
            ctx.mark_non_differentiable(total)
            return c, total
        return c

    @staticmethod
    def backward(ctx, gc, *unused):
        saved, b = ctx.saved_tensors
        gc = gc.contiguous()
        # ReduceScatter_rows(gc @ b.T) [M/W, K] (b.T taken by flipping b_is_weight)
        ga = _kernel("gemm_rs", gc, b, not ctx.b_is_weight) if ctx.needs_input_grad[0] else None
        gb = None
        if ctx.needs_input_grad[1]:
            total = saved if ctx.save_gathered else _all_gather_rows(saved)
            gb = _wgrad(total, gc, ctx.b_is_weight)
        return ga, gb, None, None, None


class _GemmRsFn(torch.autograd.Function):
    """c [M/W, N] = ReduceScatter_rows(a @ b), a [M, K/W]; backward ag_gemm (its gathered gc for b)."""

    @staticmethod
    def forward(ctx, a, b, b_is_weight):
        ctx.b_is_weight = b_is_weight
        ctx.save_for_backward(a, b)
        return _kernel("gemm_rs", a, b, b_is_weight)

    @staticmethod
    def backward(ctx, gc):
        a, b = ctx.saved_tensors
        gc = gc.contiguous()
        if not ctx.needs_input_grad[1]:
            return _kernel("ag_gemm", gc, b, not ctx.b_is_weight), None, None
        # AllGather_rows(gc) @ b.T [M, K/W]; the gathered gc [M, N] is read at once for b's gradient
        # (before any later call of this op can overwrite it).
        ga, total = _kernel("ag_gemm_gathered", gc, b, not ctx.b_is_weight)
        return (ga if ctx.needs_input_grad[0] else None), _wgrad(a, total, ctx.b_is_weight), None


class _DenseFn(torch.autograd.Function):
    """c = op(a @ b) with op "mm" (local) or "gemm_ar" (AllReduce); a's gradient by op `backward_op`
    ("mm", or "gemm_ar" where a was replicated and c is this rank's column shard)."""

    @staticmethod
    def forward(ctx, a, b, op, backward_op, b_is_weight):
        ctx.b_is_weight, ctx.backward_op = b_is_weight, backward_op
        ctx.save_for_backward(a, b)
        return _kernel(op, a, b, b_is_weight)

    @staticmethod
    def backward(ctx, gc):
        a, b = ctx.saved_tensors
        gc = gc.contiguous()
        ga = _kernel(ctx.backward_op, gc, b, not ctx.b_is_weight) if ctx.needs_input_grad[0] else None
        gb = _wgrad(a, gc, ctx.b_is_weight) if ctx.needs_input_grad[1] else None
        return ga, gb, None, None, None


def _all_gather_rows(x):
    """AllGather_rows(x) over the Team's torch.distributed group (init's process_group, else the
    default group: then the ranks of ccfuse's Team)."""
    import torch.distributed as dist
    kw = {} if _group is None else {"group": _group}
    total = torch.empty((x.shape[0] * dist.get_world_size(**kw), x.shape[1]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(total, x.contiguous(), **kw)
    return total


# ---- the public ops --------------------------------------------------------------------------------


def ag_gemm(a, b, out=None, b_is_weight=False, return_gathered=False):
    """AllGather(a) @ b: a = this rank's rows [M/W, K], b [K, N] (or [N, K] with b_is_weight) -> [M, N].

    return_gathered=True returns (c, gathered): gathered is AllGather(a) [M, K], a view of the op's
    own buffer (no copy) that holds these rows until the next ag_gemm call of the same shape on
    this rank: use it (e.g. for the weight gradient) on this stream before that call, or clone it.
    (Under torch.compile it is a copy.) With autograd, b's gradient gathers a again (as
    column_parallel_linear's default does).
    """
    if _needs_grad(a, b):
        _no_out_with_grad(out)
        return _AgGemmFn.apply(a, b, b_is_weight, False, return_gathered)
    return _kernel("ag_gemm_gathered" if return_gathered else "ag_gemm", a, b, b_is_weight, out=out)


def gemm_rs(a, b, out=None, b_is_weight=False):
    """ReduceScatter_rows(a @ b): a [M, K/W] (this rank's K slice), b [K/W, N] -> this rank's rows [M/W, N]."""
    if _needs_grad(a, b):
        _no_out_with_grad(out)
        return _GemmRsFn.apply(a, b, b_is_weight)
    return _kernel("gemm_rs", a, b, b_is_weight, out=out)


def gemm_ar(a, b, out=None, b_is_weight=False):
    """AllReduce(a @ b) split along M: a [M, K/W], b [K/W, N] -> [M, N]."""
    if _needs_grad(a, b):
        _no_out_with_grad(out)
        return _DenseFn.apply(a, b, "gemm_ar", "mm", b_is_weight)
    return _kernel("gemm_ar", a, b, b_is_weight, out=out)


def mm(a, b, out=None, b_is_weight=False):
    """a [M, K] @ b [K, N] (or b [N, K], a Linear weight, with b_is_weight) -> [M, N] on one GPU."""
    if _needs_grad(a, b):
        _no_out_with_grad(out)
        return _DenseFn.apply(a, b, "mm", "mm", b_is_weight)
    return _kernel("mm", a, b, b_is_weight, out=out)


class _GroupedFn(torch.autograd.Function):
    """c = per group g, its rows of a @ b[g]; backward: a's gradient by ccfuse's grouped GEMM (b's
    transpose), b's by ccfuse's K-grouped GEMM over the groups' rows (the contraction is the
    group's rows, K varying per group)."""

    @staticmethod
    def forward(ctx, a, b, group_rows, b_is_weight):
        ctx.b_is_weight = b_is_weight
        ctx.save_for_backward(a, b, group_rows)
        return _kernel("grouped_mm", a, b, group_rows, b_is_weight)

    @staticmethod
    def backward(ctx, gc):
        a, b, group_rows = ctx.saved_tensors
        gc = gc.contiguous()
        ga = gb = None
        if ctx.needs_input_grad[0]:
            # rows past the groups' total are not written (not part of c): their gradient is zero
            if _compiling():  # a functional op: mask its result
                ga = _kernel("grouped_mm", gc, b, group_rows, not ctx.b_is_weight)
                ga = ga.masked_fill(torch.arange(ga.shape[0], device=ga.device)[:, None] >= group_rows.sum(), 0)
            else:  # a memset, then the kernel writes the groups' rows (cheaper than masking a copy)
                ga = _kernel("grouped_mm", gc, b, group_rows, not ctx.b_is_weight, out=torch.zeros_like(a))
        if ctx.needs_input_grad[1]:
            # [G, N, K] = gc_g.T @ a_g (Linear weights), or [G, K, N] = a_g.T @ gc_g
            gb = (_kernel("kgrouped_mm", gc, a.contiguous(), group_rows) if ctx.b_is_weight
                  else _kernel("kgrouped_mm", a.contiguous(), gc, group_rows))
        return ga, gb, None, None


def grouped_mm(a, b, group_rows, out=None, b_is_weight=False):
    """MoE experts on one GPU: rows [off_g, off_g + group_rows[g]) of the result = the same rows of a @ b[g].

    a [R, K] (rows sorted by group); b [G, K, N], or [G, N, K] (Linear weights) with b_is_weight;
    group_rows: int32 [G] on the GPU (read there: no host sync, capturable in a CUDA graph), off_g
    its prefix sum (from torch._grouped_mm's offs: torch.diff(offs, prepend=offs.new_zeros(1))).
    Returns [R, N]; rows past sum(group_rows) are not written, rows past R are dropped.
    Autograd: a's gradient by this grouped GEMM (zero past the groups' rows), b's (the expert
    weights') by ccfuse's K-grouped GEMM (zero for a group without rows).
    """
    if _needs_grad(a, b):
        _no_out_with_grad(out)
        return _GroupedFn.apply(a, b, group_rows, b_is_weight)
    return _kernel("grouped_mm", a, b, group_rows, b_is_weight, out=out)


# ---- the MoE router ----------------------------------------------------------------------------
_route_ws_bytes = {}  # route: workspace bytes per (config, tokens, device)


def _route_shape(logits, topk, bias):
    _check("logits", logits, 2, torch.float32)
    t, e = logits.shape
    if bias is not None:
        _check("bias", bias, 1, torch.float32)
        _same_device(logits, bias=bias)
        if bias.shape[0] != e:
            raise ValueError("bias must have one value per expert (%d), got %d" % (e, bias.shape[0]))
    return t, e


def _route_run(logits, bias, topk, score, normalize, capacity_factor, drop):
    t, e = _route_shape(logits, topk, bias)
    lib = _gemm_lib()
    world = _lib.world_size() if _lib is not None else 1  # experts must split over the ranks
    cfg = (e, topk, score, normalize, float(capacity_factor), drop, world)
    key = cfg + (t, logits.device.index)
    ws_bytes = _route_ws_bytes.get(key)
    if ws_bytes is None:
        ws_bytes = _route_ws_bytes[key] = lib.route_workspace_bytes(
            e, topk, t, score=score, normalize=normalize, capacity_factor=capacity_factor, drop=drop,
            world_size=world)
    ws = torch.empty((ws_bytes,), dtype=torch.uint8, device=logits.device) if ws_bytes > 0 else None
    dev = logits.device
    ids = torch.empty((t, topk), dtype=torch.int32, device=dev)
    weights = torch.empty((t, topk), dtype=torch.float32, device=dev)
    counts = torch.empty((e,), dtype=torch.int32, device=dev)
    dropped = torch.empty((1,), dtype=torch.int64, device=dev)
    lib.route(e, topk, logits.data_ptr(), t, bias.data_ptr() if bias is not None else None, ids.data_ptr(),
              weights.data_ptr(), counts.data_ptr(), dropped.data_ptr(), ws.data_ptr() if ws is not None else None,
              torch.cuda.current_stream(dev).cuda_stream, score=score, normalize=normalize,
              capacity_factor=capacity_factor, drop=drop, world_size=world)
    return ids, weights, counts, dropped


def route(logits, topk, bias=None, score="softmax", normalize=True, capacity_factor=0.0, drop="position"):
    """ccfuse's GPU MoE router: logits [T, E] fp32 (this rank's tokens) -> (topk_ids [T, k] int32,
    topk_w [T, k] fp32, tokens_per_expert [E] int32, dropped [1] int64), all on the GPU (no host sync,
    CUDA-graph capturable), ready for MoeFfn.

    score "softmax" | "sigmoid"; top-k by score + bias (bias [E] fp32: load-aware balancing, it
    only steers the choice; see update_router_bias); the weights are the chosen unbiased scores,
    normalised to sum 1 when normalize; capacity_factor > 0 keeps at most
    ceil(capacity_factor * T * k / E) entries per expert (drop "position": earlier tokens first,
    "probability": the highest weights), a dropped entry has id -1 and weight 0 (the others are not
    renormalised); 0 = dropless. Ties go to the lower expert id (as the CPU reference). The ids and
    weights carry no gradient: for the router's gradient gather the differentiable scores at the
    ids in torch (docs/integration.md).
    """
    if not _compiling():
        return _route_run(logits, bias, topk, score, normalize, capacity_factor, drop)
    return torch.ops.ccfuse.route(logits, bias, topk, score, normalize, float(capacity_factor), drop)


def update_router_bias(bias, tokens_per_expert, rate):
    """Aux-loss-free balancing, in place: bias[e] += rate * sign(mean load - load[e]) (overloaded
    experts become less likely, underloaded ones more), as ccfuse::moe::update_bias."""
    load = tokens_per_expert.float()
    bias.add_(torch.sign(load.mean() - load), alpha=rate)
    return bias


# ---- Megatron's tensor-parallel linears with autograd ----------------------------------------
# Weights are the layers' own torch Linear weights, sharded as Megatron shards them: a column-
# parallel layer holds weight [N/W, H] (its output features), a row-parallel one weight [H, K/W]
# (its input features). A bias is added by torch after the fused op (a column-parallel one is this
# rank's shard, a row-parallel one the whole row, after the reduction).


def column_parallel_linear(x, weight, bias=None, sequence_parallel=True, save_gathered=False):
    """Megatron's ColumnParallelLinear with autograd; weight [N/W, H], bias [N/W] -> y [S, N/W].

    sequence_parallel: x is this rank's shard [S/W, H]; forward ag_gemm, backward gemm_rs for x's
    gradient and, for the weight's, the gathered x: saved from the forward (save_gathered=True, a
    copy of S x H per layer) or gathered again by torch.distributed (default, as Megatron does).
    Otherwise x [S, H] is replicated: forward a local GEMM, backward gemm_ar. The bias (this rank's
    shard) is added after the GEMM by torch, which also gives its gradient.
    """
    if sequence_parallel:
        y = _AgGemmFn.apply(x, weight, True, save_gathered, False)
    else:
        y = _DenseFn.apply(x, weight, "mm", "gemm_ar", True)
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
        y = _GemmRsFn.apply(x, weight, True)
    else:
        y = _DenseFn.apply(x, weight, "gemm_ar", "mm", True)
    return y if bias is None else y + bias


def moe_ffn_options(backward="fused", recompute=None, wgrad="ccfuse", main_grad=False, kept_rows=None):
    """MoeFfn's options checked (ValueError naming the argument and the rule it broke); returns
    recompute resolved (None: False with backward="fused", True with "unfused"). MoeFfn and the
    layers (ccfuse.layers.MoeExperts, at construction even on the meta device) call it."""
    if wgrad not in ("torch", "ccfuse"):
        raise ValueError("wgrad must be 'torch' (torch._grouped_mm) or 'ccfuse' (the K-grouped GEMM), got %r"
                         % (wgrad,))
    if not isinstance(main_grad, bool):
        raise ValueError("main_grad must be True (add the weight gradients into w.main_grad) or False, got %r"
                         % (main_grad,))
    if main_grad and backward != "fused":
        raise ValueError("main_grad=True is built for backward='fused'; backward=%r returns the weight "
                         "gradients" % (backward,))
    if backward not in ("unfused", "fused"):
        raise ValueError("backward must be 'unfused' (ccfuse.moe_grad) or 'fused' (ccfuse's MoeFfnBackward), "
                         "got %r" % (backward,))
    if recompute is None:  # keep h where the backward can read it (bounded: kept_rows)
        recompute = backward != "fused"
    if not isinstance(recompute, bool):
        raise ValueError("recompute must be True (the backward recomputes h) or False (the forward keeps h), "
                         "got %r" % (recompute,))
    if not recompute and backward != "fused":
        raise ValueError("recompute=False keeps h for backward='fused'; backward=%r recomputes it" % (backward,))
    if kept_rows is not None and (recompute or isinstance(kept_rows, bool) or not isinstance(kept_rows, int)
                                  or kept_rows < 1):
        raise ValueError("kept_rows must be a positive int with recompute=False (the rows of the kept h), or "
                         "None; got %r with recompute=%r" % (kept_rows, recompute))
    return recompute


class MoeFfn:
    """The expert-parallel SwiGLU MoE FFN over this rank's experts (E / W of them, contiguous).

    w1: [E/W, 2F, H], per expert the gate rows then the up rows (torch Linear weights); w2:
    [E/W, H, F]. W1 is permuted once into ccfuse's SwiGLU tile order here. imbalance: the routing
    skew hint for the MoE tuner (most rows a rank receives / the mean; 0 = unknown).
    __call__(x [T, H] bf16, topk_ids [T, k] int32 (-1 = dropped), topk_w [T, k] float32) -> [T, H].
    Autograd (x, topk_w, w1, w2): the fused forward, then backward="fused" (default: ccfuse's
    MoeFfnBackward, the forward's fused layers with their roles swapped, no host sync, also under
    torch.compile as torch.ops.ccfuse.moe_ffn_backward; the weight gradients per `wgrad`;
    2.2x faster than "unfused" on one H100 at W = 1; checked at W = 2 in a one-GPU world, not yet
    between GPUs: docs/integration.md) or "unfused" (ccfuse.moe_grad: torch.distributed all-to-alls
    and grouped GEMMs; one host sync, so eager mode only). w1's
    permuted copy follows in-place updates of w1 (optimizer steps, load_state_dict) by its version
    counter; after writes through w1.data call refresh_weights().
    recompute (backward="fused" only; None, the default: False with backward="fused", True with
    "unfused"): True recomputes layer 0's pre-activation h in the backward
    (the forward keeps only its inputs); False has the training forward keep h, [kept_rows, 2F]
    bf16 per call, and the backward skip layer 0's GEMM for x (docs/moe-layers.md, "The backward
    pass"; on one H100 at W = 1, Qwen3-like: forward + backward 3.49 -> 3.21 ms). kept_rows (None:
    max_tokens * topk * 5/4, rounded up to 128, at most the receive bound max_tokens * topk * W):
    the rows h holds; a step that receives more (skewed routing) keeps the first kept_rows and its
    backward recomputes h after all, decided on the device (no host sync), so that the memory is
    what a balanced step needs, not W times it.
    wgrad (backward="fused" only): who computes the weight gradients over the rows the backward
    left: "ccfuse" (default: the engine's K-grouped GEMM, gemm.h's kgrouped_run: no host sync,
    zeros for experts without rows; on one H100 1.08x torch._grouped_mm's speed over 21 weight-
    gradient cases, 0.986 -> 0.864 ms for the Qwen3-like layer's pair) or "torch"
    (torch._grouped_mm).
    main_grad (backward="fused", eager mode): Megatron's gradient-accumulation fusion. The backward
    adds d w1 and d w2 into w1.main_grad and w2.main_grad (fp32 tensors shaped like the weights,
    which the caller allocates and zeroes, e.g. Megatron's DDP buffers) instead of returning them:
    with wgrad="ccfuse" the K-grouped GEMM adds its fp32 accumulators there directly (no bf16
    rounding, no separate add); with wgrad="torch" torch._grouped_mm's bf16 result is added (what
    Megatron does without the fusion). The gradients autograd sees for w1 and w2 are then, as in
    Megatron: a dummy tensor (empty, or zeros if the weight's zero_out_wgrad is set) with the
    weight's grad_added_to_main_grad set to True when the weight has that attribute, else None.
    group (None: the Team of init()): the expert-parallel group, an NCCL group of torch.distributed,
    when it is not init()'s (Megatron's and TorchTitan's EP group beside a tensor-parallel init):
    the experts split over its W ranks, the layer runs on a Team of its own on that group's
    communicator (made at the group's first use, collective over it; closed by finalize()), and
    the unfused backward's all-to-alls run on it. (2026-12-07: equal bit for bit to the
    layer on init()'s Team at W = 1 on one H100; not yet run at W >= 2.)
    """

    def __init__(self, w1, w2, num_experts, topk, max_tokens, imbalance=0.0, backward="fused", recompute=None,
                 wgrad="ccfuse", main_grad=False, kept_rows=None, group=None):
        lib = _need_lib()
        recompute = moe_ffn_options(backward, recompute, wgrad, main_grad, kept_rows)
        self._team, world, self._group = _team_for(group)
        self._team_kw = {} if self._team is None else {"team": self._team}
        _check("w1", w1, 3)
        _check("w2", w2, 3)
        e_local, two_f, h = w1.shape
        f = two_f // 2
        if two_f % 2 or tuple(w2.shape) != (e_local, h, f):
            raise ValueError("w2 must be [E/W, H, F] = %s for w1 %s, got %s" % (
                (e_local, h, f), tuple(w1.shape), tuple(w2.shape)))
        if e_local * world != num_experts:
            raise ValueError("w1 holds %d experts, but num_experts %d / world size %d = %s" % (
                e_local, num_experts, world, num_experts / world))
        self._world = world
        self._perm = torch.tensor(lib.swiglu_permutation(f), dtype=torch.long, device=w1.device)
        self._w1_src = w1  # the caller's (gate rows, then up rows): what autograd differentiates
        self.w1 = w1.detach().index_select(1, self._perm).contiguous()
        self._w1_version = getattr(w1, "_version", None)
        self.w2 = w2
        self.hidden, self.topk, self.max_tokens, self.num_experts = h, topk, max_tokens, num_experts
        self.ffn, self.imbalance, self.backward, self.recompute = f, imbalance, backward, recompute
        self.wgrad, self.main_grad, self._kept_rows = wgrad, main_grad, kept_rows
        self._wgrad_ws = None  # the K-grouped GEMM's workspace (wgrad="ccfuse"), made at first use
        self._max_rows = None  # of the forward's layer (rows of the kept h), asked at first use
        self._bwd = None  # the fused backward's handle, made at its first use (collective: every rank's
        #                   first backward, as every rank runs the same layers)
        self._ffn = lib.moe_ffn_create(max_tokens, h, f, num_experts, topk, swiglu=True, b_kn=False,
                                       imbalance=imbalance, **self._team_kw)
        # torch.ops.ccfuse.moe_ffn finds this layer by its number (a custom op takes no objects)
        self._handle = _next_moe_handle[0]
        _next_moe_handle[0] += 1
        _moe_ffns[self._handle] = self
        self._key = str(self._handle)  # what the op takes: dynamo specialises strings (an int can become a SymInt)

    def describe(self):
        return self._ffn.describe()

    def _checked(self, x, topk_ids, topk_w):
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
        return t

    def refresh_weights(self):
        """Permutes w1 into the kernels' copy again (done by itself when w1's version changes)."""
        with torch.no_grad():
            torch.index_select(self._w1_src.detach(), 1, self._perm, out=self.w1)
        self._w1_version = getattr(self._w1_src, "_version", None)

    def _h_shape(self):
        """The kept pre-activation's shape: [kept rows, 2F] (rows in the forward's receive order; the
        kept rows at most the receive bound max_rows, see kept_rows)."""
        if self._max_rows is None:
            if self._ffn is None:
                raise ValueError("this MoeFfn was closed")
            self._max_rows = self._ffn.max_rows()
        rows = self._kept_rows
        if rows is None:
            rows = -(-self.max_tokens * self.topk * 5 // (4 * 128)) * 128
        return (min(rows, self._max_rows), 2 * self.ffn)

    def _run(self, x, topk_ids, topk_w, out=None, keep_h=False):
        """y, or (y, h) with keep_h: h = layer 0's pre-activation for the fused backward."""
        t = self._checked(x, topk_ids, topk_w)
        if self._ffn is None:
            raise ValueError("this MoeFfn was closed")
        if getattr(self._w1_src, "_version", None) != self._w1_version:
            self.refresh_weights()
        y = _out("out", out, (t, self.hidden), x)
        args = (x.data_ptr(), t, topk_ids.data_ptr(), topk_w.data_ptr(), self.w1.data_ptr(), self.w2.data_ptr(),
                y.data_ptr())
        stream = torch.cuda.current_stream(x.device).cuda_stream
        if not keep_h:
            self._ffn.run(*args, stream)
            return y
        h = x.new_empty(self._h_shape())
        self._ffn.run_keep(*args, h.data_ptr(), stream, preact_rows=h.shape[0])
        return y, h

    def __call__(self, x, topk_ids, topk_w, out=None):
        if _needs_grad(x, topk_w, self._w1_src, self.w2):
            if _compiling() and self.backward != "fused":
                raise ValueError("MoeFfn(backward='unfused') runs in eager mode only (its all-to-all sizes sync "
                                 "with the host): under torch.compile train with backward='fused', keep the MoE "
                                 "FFN out of the compiled region, or call it under torch.no_grad()")
            _no_out_with_grad(out)
            self._checked(x, topk_ids, topk_w)
            if self.main_grad:
                if _compiling():
                    raise ValueError("MoeFfn(main_grad=True) runs in eager mode only (its backward writes "
                                     "w.main_grad, outside the compiled graph): keep the MoE FFN out of the compiled "
                                     "region or use main_grad=False")
                for name, w in (("w1", self._w1_src), ("w2", self.w2)):
                    _check_main_grad(name, w)
            return _MoeFfnFn.apply(x, topk_w, self._w1_src, self.w2, topk_ids, self._key)
        if not _compiling():
            return self._run(x, topk_ids, topk_w, out)
        y = torch.ops.ccfuse.moe_ffn(x, topk_ids, topk_w, self._key)
        if out is None:
            return y
        out.copy_(y)
        return out

    def _checked_backward(self, x, topk_ids, topk_w, g, w1, w2, h=None):
        t = self._checked(x, topk_ids, topk_w)
        if h is not None:
            _check("h", h, 2)
            if tuple(h.shape) != self._h_shape():
                raise ValueError("h (the forward's kept pre-activation) must be %s, got %s" % (
                    self._h_shape(), tuple(h.shape)))
        _check("g", g, 2)
        if tuple(g.shape) != tuple(x.shape):
            raise ValueError("g (the output's gradient) must be [%s, %d] like x, got %s" % (t, self.hidden,
                                                                                            tuple(g.shape)))
        for name, w, want in (("w1", w1, self._w1_src), ("w2", w2, self.w2)):
            _check(name, w, 3)
            if tuple(w.shape) != tuple(want.shape):
                raise ValueError("%s must be the layer's %s, got %s" % (name, tuple(want.shape), tuple(w.shape)))
        return t

    def _fused_backward(self, x, topk_ids, topk_w, g, w1, w2, h=None):
        """ccfuse's MoeFfnBackward for d x and d topk_w; the weight gradients (_fused_wgrad, per wgrad)
        over its operands (the received rows, per local expert), on the same stream. h: the
        forward's kept pre-activation (recompute=False), or None to recompute it."""
        dx, dw = self._fused_backward_kernels(x, topk_ids, topk_w, g, w1, w2, h)
        dw1, dw2 = self._fused_wgrad(x, w1)
        return dx, dw, dw1, dw2

    def _fused_backward_kernels(self, x, topk_ids, topk_w, g, w1, w2, h=None):
        """MoeFfnBackward's kernels: d x and d topk_w (both layers, the rows left for _fused_wgrad)."""
        self._checked_backward(x, topk_ids, topk_w, g, w1, w2, h)
        if self._bwd is None:
            self._bwd = _need_lib().moe_ffn_backward_create(self.max_tokens, self.hidden, self.ffn, self.num_experts,
                                                            self.topk, swiglu=True, b_kn=False, w1_swiglu_tiles=False,
                                                            imbalance=self.imbalance, **self._team_kw)
        t = x.shape[0]
        dx = torch.empty_like(x)
        dw = torch.empty((t, self.topk), dtype=torch.float32, device=x.device)
        args = (x.data_ptr(), t, topk_ids.data_ptr(), topk_w.data_ptr(), w1.data_ptr(), w2.data_ptr(), g.data_ptr())
        stream = torch.cuda.current_stream(x.device).cuda_stream
        if h is None:
            self._bwd.run(*args, dx.data_ptr(), dw.data_ptr(), stream)
        else:
            self._bwd.run_saved(*args, h.data_ptr(), dx.data_ptr(), dw.data_ptr(), stream, h_rows=h.shape[0])
        return dx, dw

    def _fused_wgrad(self, x, w1):
        """d w1, d w2 over the rows the last MoeFfnBackward run left: by torch._grouped_mm, or by
        ccfuse's K-grouped GEMM (wgrad="ccfuse"). main_grad=True: added into w1.main_grad and
        w2.main_grad instead, and what autograd gets for the weights returned (_main_grad_result)."""
        xr, dh, gr, pa, rows, max_rows = self._bwd.operands()
        e_local, h, f = w1.shape[0], self.hidden, self.ffn
        w2 = self.w2
        if self.main_grad:  # checked at the forward; the caller may have replaced them since
            for name, w in (("w1", self._w1_src), ("w2", w2)):
                _check_main_grad(name, w)
        if self.wgrad == "ccfuse":
            lib = _need_lib()
            if self._wgrad_ws is None:
                self._wgrad_ws = torch.empty((lib.grouped_gemm_workspace_bytes(e_local),), dtype=torch.uint8,
                                             device=x.device)
            stream = torch.cuda.current_stream(x.device).cuda_stream
            if self.main_grad:
                dw1, dw2 = self._w1_src.main_grad, w2.main_grad
            else:
                dw1 = torch.empty((e_local, 2 * f, h), dtype=x.dtype, device=x.device)
                dw2 = torch.empty((e_local, h, f), dtype=x.dtype, device=x.device)
            ws = self._wgrad_ws.data_ptr()
            acc = self.main_grad
            lib.kgrouped_gemm(e_local, max_rows, 2 * f, h, dh, xr, dw1.data_ptr(), rows, ws, stream, accumulate=acc)
            lib.kgrouped_gemm(e_local, max_rows, h, f, gr, pa, dw2.data_ptr(), rows, ws, stream, accumulate=acc)
        else:
            counts = torch.as_tensor(_CudaArray(rows, (e_local,), "<i4"), device=x.device)
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            dw1 = torch._grouped_mm(_device_view(dh, (max_rows, 2 * f), x).t(), _device_view(xr, (max_rows, h), x),
                                    offs=offs)
            dw2 = torch._grouped_mm(_device_view(gr, (max_rows, h), x).t(), _device_view(pa, (max_rows, f), x),
                                    offs=offs)
            if self.main_grad:
                self._w1_src.main_grad.add_(dw1)
                w2.main_grad.add_(dw2)
        if self.main_grad:
            return _main_grad_result(self._w1_src), _main_grad_result(w2)
        return dw1, dw2

    def close(self):
        _moe_ffns.pop(self._handle, None)
        if self._ffn is not None:
            self._ffn.close()
            self._ffn = None
        if self._bwd is not None:
            self._bwd.close()
            self._bwd = None


def _check_main_grad(name, w):
    """MoeFfn(main_grad=True): w.main_grad must be an fp32 tensor shaped like w on its device."""
    mg = getattr(w, "main_grad", None)
    if mg is None:
        raise ValueError("%s has no main_grad: MoeFfn(main_grad=True) adds the weight gradients into an fp32 "
                         "w.main_grad shaped like the weight (Megatron's DDP allocates it)" % name)
    if mg.dtype != torch.float32 or tuple(mg.shape) != tuple(w.shape) or mg.device != w.device:
        raise ValueError("%s.main_grad must be float32 %s on %s like %s, got %s %s on %s" % (
            name, tuple(w.shape), w.device, name, mg.dtype, tuple(mg.shape), mg.device))
    if not mg.is_contiguous() or mg.data_ptr() % 16:
        raise ValueError("%s.main_grad must be contiguous and 16-byte aligned" % name)


def _main_grad_result(w):
    """What autograd gets for a weight whose gradient went into w.main_grad (Megatron's convention):
    with w.grad_added_to_main_grad present, a dummy (zeros if w.zero_out_wgrad, else empty) so that
    the weight's gradient hooks still run, and the flag set; else None."""
    if not hasattr(w, "grad_added_to_main_grad"):
        return None
    w.grad_added_to_main_grad = True
    make = torch.zeros if getattr(w, "zero_out_wgrad", False) else torch.empty
    return make(tuple(w.shape), dtype=w.dtype, device=w.device)


class _MoeFfnFn(torch.autograd.Function):
    """The fused forward; the backward per the layer's mode: "unfused" recomputes it with torch
    collectives (ccfuse.moe_grad; its row-split grouped GEMMs by ccfuse's grouped kernel), "fused"
    runs ccfuse's MoeFfnBackward; the weight gradients by torch._grouped_mm ("unfused") or per
    the layer's wgrad ("fused")."""

    @staticmethod
    def forward(ctx, x, topk_w, w1, w2, topk_ids, key):
        ctx.key = key
        ffn = _moe_ffn_of(key)
        h = None
        if ffn.recompute:
            y = torch.ops.ccfuse.moe_ffn(x, topk_ids, topk_w, key) if _compiling() else ffn._run(x, topk_ids, topk_w)
        elif _compiling():
            y, h = torch.ops.ccfuse.moe_ffn_keep(x, topk_ids, topk_w, key)
        else:
            y, h = ffn._run(x, topk_ids, topk_w, keep_h=True)
        ctx.save_for_backward(x, topk_w, w1, w2, topk_ids, h)
        return y

    @staticmethod
    def backward(ctx, g):
        from . import moe_grad
        x, topk_w, w1, w2, topk_ids, h = ctx.saved_tensors
        ffn = _moe_ffns.get(int(ctx.key))
        if ffn is None:
            raise ValueError("MoeFfn backward: the layer was closed after its forward")
        need = ctx.needs_input_grad
        if ffn.backward == "fused":
            args = (x, topk_ids, topk_w, g.contiguous(), w1.contiguous(), w2.contiguous())
            if _compiling():  # no host sync in it: one custom op in the compiled backward graph
                dx, dw, dw1, dw2 = torch.ops.ccfuse.moe_ffn_backward(*args, ctx.key, h)
            else:
                dx, dw, dw1, dw2 = ffn._fused_backward(*args, h)
            return (dx if need[0] else None, dw if need[1] else None, dw1 if need[2] else None,
                    dw2 if need[3] else None, None, None)
        if ffn._world > 1:
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError("MoeFfn backward at world size > 1 needs torch.distributed initialised over the "
                                 "same ranks (dist.init_process_group)")
            exchange = moe_grad.DistExchange(ffn._group)
        else:
            exchange = moe_grad.LocalExchange()
        dx, dw, dw1, dw2 = moe_grad.backward(x, topk_ids, topk_w, g.contiguous(), w1, w2, ffn.num_experts,
                                             exchange, gmm=_moe_gmm)
        return (dx if need[0] else None, dw if need[1] else None, dw1 if need[2] else None,
                dw2 if need[3] else None, None, None)


def _moe_gmm(a, b, counts, b_is_weight):
    """The backward's row-split grouped GEMMs: ccfuse's kernel (every row belongs to a group)."""
    if a.shape[0] == 0:
        return a.new_empty((0, b.shape[1] if b_is_weight else b.shape[2]))
    return _grouped_run(a.contiguous(), b.contiguous(), counts, b_is_weight)


_moe_ffns = {}  # handle -> MoeFfn, for torch.ops.ccfuse.moe_ffn
_next_moe_handle = [1]


# ---- torch.library: the kernels as custom ops, so that torch.compile graphs keep them -----------
# Functional ops (fresh outputs, no aliasing of inputs): what _kernel calls while torch.compile
# traces. Their fake implementations run the same checks and give the output's shape. Autograd
# stays with the Functions above (dynamo traces them, with these ops inside). ag_gemm_gathered
# returns a copy of the gathered rows (a custom op's outputs must be fresh memory).


def _register_custom_ops():
    library = getattr(torch, "library", None)
    if library is None or not hasattr(library, "custom_op"):
        return False  # torch < 2.4 (or the CPU tests' stand-in): eager only
    from typing import Optional, Tuple
    Tensor = torch.Tensor

    def tp_op(op):
        @library.custom_op("ccfuse::" + op, mutates_args=())
        def run(a: Tensor, b: Tensor, b_is_weight: bool) -> Tensor:
            return _tp_run(op, a, b, b_is_weight)

        @run.register_fake
        def _(a, b, b_is_weight):
            return a.new_empty(_tp_shape(op, a, b, b_is_weight)[3])
    for op in ("ag_gemm", "gemm_rs", "gemm_ar"):
        tp_op(op)

    @library.custom_op("ccfuse::ag_gemm_gathered", mutates_args=())
    def ag_gemm_gathered(a: Tensor, b: Tensor, b_is_weight: bool) -> Tuple[Tensor, Tensor]:
        c, total = _tp_run("ag_gemm", a, b, b_is_weight, return_gathered=True)
        return c, total.clone()

    @ag_gemm_gathered.register_fake
    def _(a, b, b_is_weight):
        m, n, k, out_shape = _tp_shape("ag_gemm", a, b, b_is_weight)
        return a.new_empty(out_shape), a.new_empty((m, k))

    @library.custom_op("ccfuse::mm", mutates_args=())
    def mm_op(a: Tensor, b: Tensor, b_is_weight: bool) -> Tensor:
        return _mm_run(a, b, b_is_weight)

    @mm_op.register_fake
    def _(a, b, b_is_weight):
        m, n, _k, _dtype = _mm_shape(a, b, b_is_weight)
        return a.new_empty((m, n))

    @library.custom_op("ccfuse::grouped_mm", mutates_args=())
    def grouped_mm_op(a: Tensor, b: Tensor, group_rows: Tensor, b_is_weight: bool) -> Tensor:
        return _grouped_run(a, b, group_rows, b_is_weight)

    @grouped_mm_op.register_fake
    def _(a, b, group_rows, b_is_weight):
        _g, rows, n, _k, _dtype = _grouped_shape(a, b, group_rows, b_is_weight)
        return a.new_empty((rows, n))

    @library.custom_op("ccfuse::kgrouped_mm", mutates_args=())
    def kgrouped_mm_op(a: Tensor, b: Tensor, group_rows: Tensor) -> Tensor:
        return _kgrouped_run(a, b, group_rows)

    @kgrouped_mm_op.register_fake
    def _(a, b, group_rows):
        g, _rows, m, n, _dtype = _kgrouped_shape(a, b, group_rows)
        return a.new_empty((g, m, n))

    @library.custom_op("ccfuse::route", mutates_args=())
    def route_op(logits: Tensor, bias: Optional[Tensor], topk: int, score: str, normalize: bool,
                 capacity_factor: float, drop: str) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        return _route_run(logits, bias, topk, score, normalize, capacity_factor, drop)

    @route_op.register_fake
    def _(logits, bias, topk, score, normalize, capacity_factor, drop):
        t, e = _route_shape(logits, topk, bias)
        return (logits.new_empty((t, topk), dtype=torch.int32), logits.new_empty((t, topk)),
                logits.new_empty((e,), dtype=torch.int32), logits.new_empty((1,), dtype=torch.int64))

    @library.custom_op("ccfuse::moe_ffn", mutates_args=())
    def moe_ffn_op(x: Tensor, topk_ids: Tensor, topk_w: Tensor, handle: str) -> Tensor:
        return _moe_ffn_of(handle)._run(x, topk_ids, topk_w)

    @moe_ffn_op.register_fake
    def _(x, topk_ids, topk_w, handle):
        ffn = _moe_ffn_of(handle)
        return x.new_empty((ffn._checked(x, topk_ids, topk_w), ffn.hidden))

    # MoeFfn(recompute=False)'s training forward: (y, h), h its layer 0's pre-activation.
    @library.custom_op("ccfuse::moe_ffn_keep", mutates_args=())
    def moe_ffn_keep_op(x: Tensor, topk_ids: Tensor, topk_w: Tensor, handle: str) -> Tuple[Tensor, Tensor]:
        return _moe_ffn_of(handle)._run(x, topk_ids, topk_w, keep_h=True)

    @moe_ffn_keep_op.register_fake
    def _(x, topk_ids, topk_w, handle):
        ffn = _moe_ffn_of(handle)
        return x.new_empty((ffn._checked(x, topk_ids, topk_w), ffn.hidden)), x.new_empty(ffn._h_shape())

    # MoeFfn(backward="fused")'s backward: (d x, d topk_w, d w1, d w2) for the caller's w1 (gate rows,
    # then up rows) and w2; the fused forward's inputs again, and h, the forward's kept
    # pre-activation (None: recomputed).
    @library.custom_op("ccfuse::moe_ffn_backward", mutates_args=())
    def moe_ffn_backward_op(x: Tensor, topk_ids: Tensor, topk_w: Tensor, g: Tensor, w1: Tensor, w2: Tensor,
                            handle: str, h: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        return _moe_ffn_of(handle)._fused_backward(x, topk_ids, topk_w, g, w1, w2, h)

    @moe_ffn_backward_op.register_fake
    def _(x, topk_ids, topk_w, g, w1, w2, handle, h):
        ffn = _moe_ffn_of(handle)
        t = ffn._checked_backward(x, topk_ids, topk_w, g, w1, w2, h)
        return (x.new_empty((t, ffn.hidden)), topk_w.new_empty((t, ffn.topk)), w1.new_empty(tuple(w1.shape)),
                w2.new_empty(tuple(w2.shape)))
    return True


def _moe_ffn_of(handle):
    ffn = _moe_ffns.get(int(handle))
    if ffn is None:
        raise ValueError("no MoeFfn with handle %s (closed?)" % handle)
    return ffn


custom_ops_registered = _register_custom_ops()
