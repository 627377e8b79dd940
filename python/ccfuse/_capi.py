"""ctypes binding of ccfuse's C ABI (include/ccfuse/c_api.h, libccfuse_c.so): the fused TP ops,
the MoE FFN and the MoE router from Python, on device pointers and a CUDA stream handle (no torch
dependency here; ccfuse.torch_ops wraps it for torch tensors).

    lib = Ccfuse("build/libccfuse_c.so")
    lib.init_from_env()                       # torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*
    op = lib.tp_create("ag_gemm", m, n, k)    # b is [k, n] (b_kn=True) or [n, k]; dtype="bf16" | "fp16"
    op.run(a.data_ptr(), b.data_ptr(), c.data_ptr(), torch.cuda.current_stream().cuda_stream)
    op.gathered()                             # ag_gemm: the gathered A's address (until the next run)
    op.close()
    moe = lib.moe_ffn_create(max_tokens, hidden, ffn, experts, topk)   # w1 rows in swiglu_permutation order
    moe.run(x, tokens, topk_ids, topk_w, w1, w2, out, stream)        # device pointers, int32 ids
    moe.run_keep(..., out, preact, stream, preact_rows=R)  # training: layer 0's pre-activation [R, 2F] kept
                                            # (R <= moe.max_rows(); 0: all of them)
    moe.close(); lib.finalize()
    ep = lib.team_from_comm(comm_ptr)      # a further Team on another NCCL communicator (collective)
    moe = lib.moe_ffn_create(..., team=ep) # ops take team= (None: the process's Team); ep.close()
    lib.gemm(m, n, k, a, b, c, stream, b_kn=False)          # single GPU, no Team: c = a @ b
                                                            # (workspace=: gemm_workspace_bytes(...) bytes)
    ws = lib.grouped_gemm_workspace_bytes(num_groups)       # bytes of device memory for:
    lib.grouped_gemm(num_groups, max_rows, n, k, a, b, c, group_rows, workspace, stream)
    lib.kgrouped_gemm(num_groups, max_rows, m, n, a, b, c, group_rows, workspace, stream)
                                            # c[g] = a_g^T @ b_g (weight gradients), same workspace
                                            # (accumulate=True: c fp32, c[g] += a_g^T @ b_g)
    ws = lib.route_workspace_bytes(experts, topk, tokens, capacity_factor=1.25)  # MoE router, no Team
    lib.route(experts, topk, logits, tokens, bias, topk_ids, topk_weights, tokens_per_expert, dropped,
              workspace, stream, capacity_factor=1.25)  # score="softmax" | "sigmoid", normalize=True,
                                            # drop="position" | "probability"; logits [T, E] fp32, bias [E]
                                            # or None; ids int32 (-1 = dropped), weights fp32, dropped int64

Errors raise CcfuseError with the library's message (the argument and the rule it broke)."""
import ctypes
import os


class CcfuseError(RuntimeError):
    pass


class TpOp:
    def __init__(self, lib, handle, name):
        self._lib, self._h, self.name = lib, handle, name

    def run(self, a, b, c, stream):
        self._lib._check(self._lib._dll.ccfuse_tp_run(self._h, a, b, c, stream))

    def gathered(self):
        """ag_gemm: the device address of the last call's gathered A [M, K] (valid until this op's next call)."""
        p = ctypes.c_void_p()
        self._lib._check(self._lib._dll.ccfuse_tp_gathered(self._h, ctypes.byref(p)))
        return p.value

    def close(self):
        if self._h:
            self._lib._check(self._lib._dll.ccfuse_tp_destroy(self._h))
            self._h = None


class Team:
    """A further Team (Ccfuse.team_from_comm): pass it as team= to the create methods."""

    def __init__(self, lib, handle):
        self._lib, self._h = lib, handle

    def world_size(self):
        if not self._h:
            raise CcfuseError("this Team was closed")
        w = ctypes.c_int()
        self._lib._check(self._lib._dll.ccfuse_team_world_size(self._h, ctypes.byref(w)))
        return w.value

    def close(self):
        """Collective; ops still open on the Team keep it until they are closed."""
        if self._h:
            self._lib._check(self._lib._dll.ccfuse_team_destroy(self._h))
            self._h = None


class MoeFfn:
    def __init__(self, lib, handle):
        self._lib, self._h = lib, handle

    def run(self, x, num_tokens, topk_ids, topk_w, w1, w2, out, stream):
        self._lib._check(self._lib._dll.ccfuse_moe_ffn_run(self._h, x, num_tokens, topk_ids, topk_w, w1, w2, out,
                                                           stream))

    def run_keep(self, x, num_tokens, topk_ids, topk_w, w1, w2, out, preact_out, stream, preact_rows=0):
        """run, keeping layer 0's pre-activation in preact_out ([preact_rows, 2F] bf16; 0: max_rows())
        for the backward (a call receiving more rows keeps the first preact_rows only)."""
        self._lib._check(self._lib._dll.ccfuse_moe_ffn_run_keep(self._h, x, num_tokens, topk_ids, topk_w, w1, w2,
                                                                out, preact_out, preact_rows, stream))

    def max_rows(self):
        n = ctypes.c_int64()
        self._lib._check(self._lib._dll.ccfuse_moe_ffn_max_rows(self._h, ctypes.byref(n)))
        return n.value

    def describe(self):
        s = ctypes.c_char_p()
        self._lib._check(self._lib._dll.ccfuse_moe_ffn_describe(self._h, ctypes.byref(s)))
        return s.value.decode()

    def close(self):
        if self._h:
            self._lib._check(self._lib._dll.ccfuse_moe_ffn_destroy(self._h))
            self._h = None


class MoeFfnBackward:
    def __init__(self, lib, handle):
        self._lib, self._h = lib, handle

    def run(self, x, num_tokens, topk_ids, topk_w, w1, w2, g, dx, dtopk_w, stream):
        self._lib._check(self._lib._dll.ccfuse_moe_ffn_backward_run(self._h, x, num_tokens, topk_ids, topk_w, w1, w2,
                                                                    g, dx, dtopk_w, stream))

    def run_saved(self, x, num_tokens, topk_ids, topk_w, w1, w2, g, h_saved, dx, dtopk_w, stream, h_rows=0):
        """run with h_saved = the forward's preact_out (MoeFfn.run_keep) of h_rows rows (its
        preact_rows): layer 0 is not recomputed, unless this call's rows exceed h_rows."""
        self._lib._check(self._lib._dll.ccfuse_moe_ffn_backward_run_saved(self._h, x, num_tokens, topk_ids, topk_w,
                                                                          w1, w2, g, h_saved, h_rows, dx, dtopk_w,
                                                                          stream))

    def operands(self):
        """(x_rows, dh_rows, g_rows, pa_rows, expert_rows) device addresses and max_rows."""
        ptrs = [ctypes.c_void_p() for _ in range(5)]
        rows = ctypes.c_int64()
        self._lib._check(self._lib._dll.ccfuse_moe_ffn_backward_operands(self._h, *[ctypes.byref(p) for p in ptrs],
                                                                         ctypes.byref(rows)))
        return tuple(p.value for p in ptrs) + (rows.value,)

    def close(self):
        if self._h:
            self._lib._check(self._lib._dll.ccfuse_moe_ffn_backward_destroy(self._h))
            self._h = None


class Ccfuse:
    def __init__(self, path=None):
        if not path and not os.environ.get("CCFUSE_C_LIB"):
            here = os.path.dirname(os.path.abspath(__file__))
            installed = os.path.join(here, "libccfuse_c.so")  # the wheel's copy (pip install .)
            path = installed if os.path.exists(installed) else os.path.join(here, "..", "..", "build",
                                                                             "libccfuse_c.so")
        path = path or os.environ["CCFUSE_C_LIB"]
        d = self._dll = ctypes.CDLL(path)
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        d.ccfuse_last_error.restype = ctypes.c_char_p
        d.ccfuse_init_from_env.argtypes = []
        d.ccfuse_init_from_comm.argtypes = [vp]
        d.ccfuse_world_size.argtypes = [ctypes.POINTER(ctypes.c_int)]
        d.ccfuse_tp_create.argtypes = [ctypes.c_char_p, i64, i64, i64, ctypes.c_int, ctypes.POINTER(vp)]
        d.ccfuse_tp_create_typed.argtypes = [ctypes.c_char_p, i64, i64, i64, ctypes.c_int, ctypes.c_int,
                                             ctypes.POINTER(vp)]
        d.ccfuse_tp_run.argtypes = [vp, vp, vp, vp, vp]
        d.ccfuse_tp_gathered.argtypes = [vp, ctypes.POINTER(vp)]
        d.ccfuse_tp_destroy.argtypes = [vp]
        d.ccfuse_finalize.argtypes = []
        if hasattr(d, "ccfuse_team_create_from_comm"):  # a library older than this package lacks them
            d.ccfuse_team_create_from_comm.argtypes = [vp, ctypes.POINTER(vp)]
            d.ccfuse_team_world_size.argtypes = [vp, ctypes.POINTER(ctypes.c_int)]
            d.ccfuse_team_destroy.argtypes = [vp]
            d.ccfuse_tp_create_on.argtypes = [vp, ctypes.c_char_p, i64, i64, i64, ctypes.c_int, ctypes.c_int,
                                              ctypes.POINTER(vp)]
            d.ccfuse_moe_ffn_create_on.argtypes = [vp, i64, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                   ctypes.c_int, ctypes.c_double, ctypes.POINTER(vp)]
            d.ccfuse_moe_ffn_backward_create_on.argtypes = [vp, i64, i64, i64, ctypes.c_int, ctypes.c_int,
                                                            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                                                            ctypes.POINTER(vp)]
        d.ccfuse_moe_ffn_create.argtypes = [i64, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                            ctypes.c_double, ctypes.POINTER(vp)]
        d.ccfuse_moe_ffn_run.argtypes = [vp, vp, i64, vp, vp, vp, vp, vp, vp]
        d.ccfuse_moe_ffn_run_keep.argtypes = [vp, vp, i64, vp, vp, vp, vp, vp, vp, i64, vp]
        d.ccfuse_moe_ffn_max_rows.argtypes = [vp, ctypes.POINTER(i64)]
        d.ccfuse_moe_ffn_describe.argtypes = [vp, ctypes.POINTER(ctypes.c_char_p)]
        d.ccfuse_moe_ffn_destroy.argtypes = [vp]
        d.ccfuse_moe_ffn_backward_create.argtypes = [i64, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                     ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.POINTER(vp)]
        d.ccfuse_moe_ffn_backward_run.argtypes = [vp, vp, i64, vp, vp, vp, vp, vp, vp, vp, vp]
        d.ccfuse_moe_ffn_backward_run_saved.argtypes = [vp, vp, i64, vp, vp, vp, vp, vp, vp, i64, vp, vp, vp]
        d.ccfuse_moe_ffn_backward_operands.argtypes = [vp] + [ctypes.POINTER(vp)] * 5 + [ctypes.POINTER(i64)]
        d.ccfuse_moe_ffn_backward_destroy.argtypes = [vp]
        d.ccfuse_swiglu_permutation.argtypes = [i64, ctypes.POINTER(i64)]
        d.ccfuse_gemm_workspace_bytes.argtypes = [i64, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.POINTER(i64)]
        d.ccfuse_gemm.argtypes = [i64, i64, i64, ctypes.c_int, ctypes.c_int, vp, vp, vp, vp, vp]
        d.ccfuse_grouped_gemm_workspace_bytes.argtypes = [ctypes.c_int, ctypes.POINTER(i64)]
        d.ccfuse_grouped_gemm.argtypes = [ctypes.c_int, i64, i64, i64, ctypes.c_int, ctypes.c_int, vp, vp, vp, vp,
                                          vp, vp]
        d.ccfuse_kgrouped_gemm.argtypes = [ctypes.c_int, i64, i64, i64, ctypes.c_int, vp, vp, vp, vp, vp, vp]
        if hasattr(d, "ccfuse_kgrouped_gemm_accumulate"):  # a library older than this package lacks it
            d.ccfuse_kgrouped_gemm_accumulate.argtypes = [ctypes.c_int, i64, i64, i64, ctypes.c_int, vp, vp, vp, vp,
                                                          vp, vp]
        ci, cd = ctypes.c_int, ctypes.c_double
        d.ccfuse_moe_route_workspace_bytes.argtypes = [ci, ci, ci, ci, cd, ci, ci, i64, ctypes.POINTER(i64)]
        d.ccfuse_moe_route.argtypes = [ci, ci, ci, ci, cd, ci, ci, vp, i64, vp, vp, vp, vp, vp, vp, vp]

    def _check(self, rc):
        if rc != 0:
            raise CcfuseError(self._dll.ccfuse_last_error().decode())

    def init_from_env(self):
        self._check(self._dll.ccfuse_init_from_env())

    def init_from_comm(self, nccl_comm):
        """The Team around an ncclComm_t the caller owns (an int address; not destroyed by finalize)."""
        self._check(self._dll.ccfuse_init_from_comm(nccl_comm))

    def world_size(self):
        w = ctypes.c_int()
        self._check(self._dll.ccfuse_world_size(ctypes.byref(w)))
        return w.value

    def team_from_comm(self, nccl_comm):
        """A further Team around an ncclComm_t the caller owns (an int address), beside the process's
        one (collective over that communicator's ranks); ops made with team= it run on its ranks."""
        h = ctypes.c_void_p()
        self._check(self._dll.ccfuse_team_create_from_comm(nccl_comm, ctypes.byref(h)))
        return Team(self, h)

    def _team_handle(self, team):
        """The C handle of team= (None: the process's Team, a null handle)."""
        if team is None:
            return None
        if not isinstance(team, Team) or team._lib is not self:
            raise CcfuseError("team must be a Team from this library's team_from_comm (or None), got %s"
                              % type(team).__name__)
        if not team._h:
            raise CcfuseError("team was closed: make its ops on an open Team")
        return team._h

    def tp_create(self, op, m, n, k, b_kn=True, dtype="bf16", team=None):
        h = ctypes.c_void_p()
        if team is None:  # the process's Team (a library without the _on entry points works too)
            self._check(self._dll.ccfuse_tp_create_typed(op.encode(), m, n, k, 1 if b_kn else 0, self._dtype(dtype),
                                                         ctypes.byref(h)))
        else:
            self._check(self._dll.ccfuse_tp_create_on(self._team_handle(team), op.encode(), m, n, k,
                                                      1 if b_kn else 0, self._dtype(dtype), ctypes.byref(h)))
        return TpOp(self, h, op)

    def moe_ffn_create(self, max_tokens, hidden, ffn, num_experts, topk, swiglu=True, b_kn=False, imbalance=0.0,
                       team=None):
        h = ctypes.c_void_p()
        args = (max_tokens, hidden, ffn, num_experts, topk, 1 if swiglu else 0, 1 if b_kn else 0, float(imbalance),
                ctypes.byref(h))
        if team is None:
            self._check(self._dll.ccfuse_moe_ffn_create(*args))
        else:
            self._check(self._dll.ccfuse_moe_ffn_create_on(self._team_handle(team), *args))
        return MoeFfn(self, h)

    def moe_ffn_backward_create(self, max_tokens, hidden, ffn, num_experts, topk, swiglu=True, b_kn=False,
                                w1_swiglu_tiles=False, imbalance=0.0, team=None):
        h = ctypes.c_void_p()
        args = (max_tokens, hidden, ffn, num_experts, topk, 1 if swiglu else 0, 1 if b_kn else 0,
                1 if w1_swiglu_tiles else 0, float(imbalance), ctypes.byref(h))
        if team is None:
            self._check(self._dll.ccfuse_moe_ffn_backward_create(*args))
        else:
            self._check(self._dll.ccfuse_moe_ffn_backward_create_on(self._team_handle(team), *args))
        return MoeFfnBackward(self, h)

    def swiglu_permutation(self, ffn):
        """perm[i] = the row of [gate rows | up rows] (2F) that becomes row i of MoeFfn's w1."""
        buf = (ctypes.c_int64 * (2 * ffn))()
        self._check(self._dll.ccfuse_swiglu_permutation(ffn, buf))
        return list(buf)

    DTYPES = {"bf16": 0, "fp16": 1}

    def _dtype(self, dtype):
        if dtype not in self.DTYPES:
            raise CcfuseError("dtype %r must be one of %s" % (dtype, ", ".join(self.DTYPES)))
        return self.DTYPES[dtype]

    def gemm_workspace_bytes(self, m, n, k, b_kn=True, dtype="bf16"):
        v = ctypes.c_int64()
        self._check(self._dll.ccfuse_gemm_workspace_bytes(m, n, k, self._dtype(dtype), 1 if b_kn else 0, ctypes.byref(v)))
        return v.value

    def gemm(self, m, n, k, a, b, c, stream, b_kn=True, dtype="bf16", workspace=None):
        """c [m, n] = a [m, k] @ b ([k, n] with b_kn, else [n, k]) on the current device; no Team.
        workspace: gemm_workspace_bytes() bytes of device memory, or None (the library's buffers)."""
        self._check(self._dll.ccfuse_gemm(m, n, k, self._dtype(dtype), 1 if b_kn else 0, a, b, c, workspace, stream))

    def grouped_gemm_workspace_bytes(self, num_groups):
        v = ctypes.c_int64()
        self._check(self._dll.ccfuse_grouped_gemm_workspace_bytes(num_groups, ctypes.byref(v)))
        return v.value

    def grouped_gemm(self, num_groups, max_rows, n, k, a, b, c, group_rows, workspace, stream, b_kn=True,
                     dtype="bf16"):
        """Per group g, its rows of c = the same rows of a @ b[g]; group_rows: int32 counts on the device."""
        self._check(self._dll.ccfuse_grouped_gemm(num_groups, max_rows, n, k, self._dtype(dtype), 1 if b_kn else 0,
                                                  a, b, c, group_rows, workspace, stream))

    def kgrouped_gemm(self, num_groups, max_rows, m, n, a, b, c, group_rows, workspace, stream, dtype="bf16",
                      accumulate=False):
        """c[g] [m, n] = a_g^T @ b_g, a_g and b_g group g's rows of a [max_rows, m] and b [max_rows, n]
        (the experts' weight gradients); c [num_groups, m, n]; workspace: grouped_gemm_workspace_bytes.
        accumulate=True: c is fp32 and gets c[g] += a_g^T @ b_g (an fp32 main_grad; a group without
        rows leaves its c[g])."""
        if accumulate and not hasattr(self._dll, "ccfuse_kgrouped_gemm_accumulate"):
            raise CcfuseError("accumulate=True needs ccfuse_kgrouped_gemm_accumulate, which this libccfuse_c.so "
                              "(older than the Python package) lacks: rebuild it")
        run = self._dll.ccfuse_kgrouped_gemm_accumulate if accumulate else self._dll.ccfuse_kgrouped_gemm
        self._check(run(num_groups, max_rows, m, n, self._dtype(dtype), a, b, c, group_rows, workspace, stream))

    SCORES = {"softmax": 0, "sigmoid": 1}
    DROPS = {"position": 0, "probability": 1}

    @staticmethod
    def _code(name, value, table):
        if value not in table:
            raise CcfuseError("%s %r must be one of %s" % (name, value, ", ".join(table)))
        return table[value]

    def _router_args(self, num_experts, topk, score, normalize, capacity_factor, drop, world_size):
        return (num_experts, topk, self._code("score", score, self.SCORES), 1 if normalize else 0,
                float(capacity_factor), self._code("drop", drop, self.DROPS), world_size)

    def route_workspace_bytes(self, num_experts, topk, num_tokens, score="softmax", normalize=True,
                              capacity_factor=0.0, drop="position", world_size=1):
        """Bytes of device workspace route() needs for num_tokens tokens: 0 when dropless
        (capacity_factor 0) or when the capacity cannot bind; otherwise sized on the current device."""
        v = ctypes.c_int64()
        self._check(self._dll.ccfuse_moe_route_workspace_bytes(
            *self._router_args(num_experts, topk, score, normalize, capacity_factor, drop, world_size), num_tokens,
            ctypes.byref(v)))
        return v.value

    def route(self, num_experts, topk, logits, num_tokens, bias, topk_ids, topk_weights, tokens_per_expert, dropped,
              workspace, stream, score="softmax", normalize=True, capacity_factor=0.0, drop="position",
              world_size=1):
        """The GPU MoE router on device pointers (ints; None for null): logits [T, E] fp32, bias [E] fp32 or
        None -> topk_ids [T, topk] int32 (-1 = dropped), topk_weights [T, topk] fp32, tokens_per_expert [E]
        int32 (after drops), dropped (one int64). workspace: route_workspace_bytes() bytes (None when 0).
        Asynchronous on `stream`; no Team needed."""
        self._check(self._dll.ccfuse_moe_route(
            *self._router_args(num_experts, topk, score, normalize, capacity_factor, drop, world_size), logits,
            num_tokens, bias, topk_ids, topk_weights, tokens_per_expert, dropped, workspace, stream))

    def finalize(self):
        self._check(self._dll.ccfuse_finalize())
