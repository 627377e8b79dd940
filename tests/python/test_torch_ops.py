"""python/ccfuse/torch_ops.py without a GPU: its argument checks, output shapes, op caching and
the calls it makes into the C ABI, against a small stand-in for torch (the real torch is not
installed on the CI machines; with it present the stand-in is still used, so that CUDA tensors
can be imitated)."""
import importlib
import os
import sys
import types
import unittest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))


class FakeDevice:
    def __init__(self, kind, index=0):
        self.type, self.index = kind, index

    def __eq__(self, other):
        return (self.type, self.index) == (other.type, other.index)

    def __repr__(self):
        return self.type if self.index == 0 else "%s:%d" % (self.type, self.index)


class FakeTensor:
    _next = [1 << 20]
    requires_grad = None  # unset: the ops run no autograd, FakeFunction treats it as needing a gradient

    def __init__(self, shape, dtype, device="cuda", contiguous=True):
        self.shape, self.dtype, self.device, self._contig = tuple(shape), dtype, FakeDevice(device), contiguous
        self._ptr = FakeTensor._next[0]
        n = 1
        for s in shape:
            n *= s
        FakeTensor._next[0] += (max(n, 1) * 4 + 4096 + 255) // 256 * 256  # 256-byte aligned, as CUDA's allocator

    def dim(self):
        return len(self.shape)

    def is_contiguous(self):
        return self._contig

    def data_ptr(self):
        return self._ptr

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self):
        return 4 if self.dtype in ("float32", "int32") else 2

    def index_select(self, dim, perm):
        return FakeTensor(self.shape, self.dtype)

    def contiguous(self):
        return FakeTensor(self.shape, self.dtype) if not self._contig else self

    def detach(self):
        return self

    # what the autograd functions' backward passes use
    def t(self):
        return FakeTensor(self.shape[::-1], self.dtype, contiguous=False)

    def matmul(self, other):
        assert self.shape[1] == other.shape[0], (self.shape, other.shape)
        return FakeTensor((self.shape[0], other.shape[1]), self.dtype)

    def clone(self):
        return FakeTensor(self.shape, self.dtype)

    def new_empty(self, shape, dtype=None):
        return FakeTensor(shape, dtype or self.dtype)

    def __add__(self, other):  # a bias [N] broadcast over the rows
        assert other.shape == self.shape[-1:], (self.shape, other.shape)
        return FakeTensor(self.shape, self.dtype)

    def add_(self, other):  # logged on the tensor: what was added into it
        assert tuple(other.shape) == self.shape, (self.shape, other.shape)
        self.__dict__.setdefault("added", []).append(other)
        return self

    def view(self, dtype):
        v = FakeTensor(self.shape, dtype)
        v._ptr = self._ptr
        return v


class FakeCtx:
    def __init__(self, needs):
        self.needs_input_grad = needs

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors


class FakeFunction:
    """torch.autograd.Function's apply: forward with a context; the output keeps it for backward."""

    @classmethod
    def apply(cls, *args):
        ctx = FakeCtx(tuple(isinstance(a, FakeTensor) and a.requires_grad is not False for a in args))
        out = cls.forward(ctx, *args)
        (out[0] if isinstance(out, tuple) else out).grad_fn = (cls, ctx)
        return out


def fake_torch():
    t = types.ModuleType("torch")
    t.Tensor = FakeTensor
    t.bfloat16, t.float32, t.int32, t.long, t.int64 = "bfloat16", "float32", "int32", "int64", "int64"
    t.float16, t.uint8 = "float16", "uint8"
    t.empty = lambda shape, dtype=None, device=None: FakeTensor(shape, dtype)
    t.tensor = lambda data, dtype=None, device=None: FakeTensor((len(data),), dtype)
    stream = types.SimpleNamespace(cuda_stream=1234)
    t.cuda = types.SimpleNamespace(current_stream=lambda device=None: stream)
    t.autograd = types.SimpleNamespace(Function=FakeFunction)
    t.is_grad_enabled = lambda: True
    t.grouped_mms = []  # torch._grouped_mm calls: (a, b, offs) shapes

    def grouped_mm_2d2d(a, b, offs=None):  # groups split the contraction: [G, a rows, b cols]
        t.grouped_mms.append((a.shape, b.shape, offs.shape))
        return FakeTensor((offs.shape[0], a.shape[0], b.shape[1]), a.dtype)
    t._grouped_mm = grouped_mm_2d2d
    t.cumsum = lambda x, dim, dtype=None: FakeTensor(x.shape, dtype or x.dtype)
    t.zeros_like = lambda x: FakeTensor(x.shape, x.dtype)
    t.empty_like = lambda x: FakeTensor(x.shape, x.dtype)

    def as_tensor(obj, device=None):
        cai = obj.__cuda_array_interface__
        v = FakeTensor(cai["shape"], "int16")
        v._ptr = cai["data"][0]
        return v
    t.as_tensor = as_tensor
    t.gathers = []  # torch.distributed.all_gather_into_tensor calls
    t.reduces = []  # torch.distributed.all_reduce calls: (shape, group)
    t.dist_ready = [True]
    t.distributed = types.SimpleNamespace(
        get_world_size=lambda group=None: 2,
        all_gather_into_tensor=lambda out, x, group=None: t.gathers.append((out.shape, x.shape) + (
            (group,) if group is not None else ())),
        is_available=lambda: True, is_initialized=lambda: t.dist_ready[0],
        all_reduce=lambda x, group=None: t.reduces.append((x.shape, group)))
    t.device = lambda kind, index=0: FakeDevice(kind)
    t.cuda.current_device = lambda: 0
    t.cuda.is_available = lambda: True
    t.zeros = lambda *shape, **kw: FakeTensor(shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape,
                                              kw.get("dtype", "float32"))
    return t


class FakeOp:
    def __init__(self, log, key):
        self.log, self.key = log, key

    def run(self, *args):
        self.log.append(("run", self.key) + args)

    def run_keep(self, *args, **kw):
        self.log.append(("run_keep", self.key) + args + tuple(sorted(kw.items())))

    def max_rows(self):
        return 640

    def gathered(self):
        self.log.append(("gathered", self.key))
        return 0xA000

    def close(self):
        self.log.append(("close", self.key))

    def describe(self):
        return "fake"


class FakeLib:
    def __init__(self, world):
        self.world, self.log = world, []

    def world_size(self):
        return self.world

    def tp_create(self, op, m, n, k, b_kn=True, dtype="bf16"):
        self.log.append(("create", op, m, n, k, b_kn, dtype))
        return FakeOp(self.log, (op, m, n, k))

    def moe_ffn_create(self, *args, **kw):
        self.log.append(("moe_create",) + args + tuple(sorted(kw.items())))
        return FakeOp(self.log, "moe")

    def moe_ffn_backward_create(self, *args, **kw):
        self.log.append(("moe_bwd_create",) + args + tuple(sorted(kw.items())))
        log = self.log

        class Bwd:
            def run(self, *a):
                log.append(("moe_bwd_run",) + a[:2])

            def run_saved(self, *a, **kw):
                log.append(("moe_bwd_run_saved",) + a[:2] + (a[7],) + tuple(sorted(kw.items())))

            def operands(self):
                return (1 << 30, 2 << 30, 3 << 30, 4 << 30, 5 << 30, 640)

            def close(self):
                log.append(("moe_bwd_close",))
        return Bwd()

    def swiglu_permutation(self, f):
        return list(range(2 * f))

    def finalize(self):
        self.log.append(("finalize",))

    def gemm_workspace_bytes(self, m, n, k, b_kn=True, dtype="bf16"):
        return 4096 if k >= 8192 else 0  # a split-K problem stands in for any that needs one

    def gemm(self, *args, **kw):
        self.log.append(("gemm",) + args + tuple(sorted(kw.items())))

    def route_workspace_bytes(self, e, k, t, **kw):
        self.log.append(("route_ws", e, k, t) + tuple(sorted(kw.items())))
        return 512 if kw.get("capacity_factor") else 0

    def route(self, *args, **kw):
        self.log.append(("route",) + args + tuple(sorted(kw.items())))

    def grouped_gemm_workspace_bytes(self, g):
        return 16 * g + 32

    def grouped_gemm(self, *args, **kw):
        self.log.append(("grouped_gemm",) + args + tuple(sorted(kw.items())))

    def kgrouped_gemm(self, *args, **kw):
        self.log.append(("kgrouped_gemm",) + args + tuple(sorted(kw.items())))


class TorchOps(unittest.TestCase):
    def setUp(self):
        self.saved = sys.modules.get("torch")
        self.saved_dist = sys.modules.get("torch.distributed")
        sys.modules["torch"] = fake_torch()
        sys.modules["torch.distributed"] = sys.modules["torch"].distributed
        sys.modules.pop("ccfuse.torch_ops", None)
        self.cf = importlib.import_module("ccfuse.torch_ops")
        self.lib = FakeLib(2)
        self.cf._lib = self.lib

    def tearDown(self):
        self.cf._ops.clear()
        sys.modules.pop("ccfuse.torch_ops", None)
        for name, saved in (("torch", self.saved), ("torch.distributed", self.saved_dist)):
            if saved is not None:
                sys.modules[name] = saved
            else:
                sys.modules.pop(name, None)

    def bf16(self, *shape, **kw):
        return FakeTensor(shape, "bfloat16", **kw)

    def error(self, fn, message):
        with self.assertRaises(ValueError) as e:
            fn()
        self.assertEqual(str(e.exception), message)

    def test_shapes_caching_and_calls(self):
        cf, log = self.cf, self.lib.log
        c = cf.ag_gemm(self.bf16(512, 1024), self.bf16(1024, 3072))
        self.assertEqual(c.shape, (1024, 3072))
        cf.ag_gemm(self.bf16(512, 1024), self.bf16(1024, 3072))
        self.assertEqual([x[0] for x in log], ["create", "run", "run"])  # created once per shape
        self.assertEqual(log[0], ("create", "ag_gemm", 1024, 3072, 1024, True, "bf16"))
        self.assertEqual(log[1][-1], 1234)  # torch's current stream
        y = cf.gemm_rs(self.bf16(4096, 512), self.bf16(2048, 512), b_is_weight=True)  # Linear weight [N, K/W]
        self.assertEqual(y.shape, (2048, 2048))
        self.assertEqual(log[3], ("create", "gemm_rs", 4096, 2048, 1024, False, "bf16"))
        z = cf.gemm_ar(self.bf16(4096, 512), self.bf16(512, 2048))
        self.assertEqual(z.shape, (4096, 2048))
        cf.finalize()
        self.assertEqual([x[0] for x in log[-4:]], ["close", "close", "close", "finalize"])
        self.assertIsNone(cf._lib)

    def test_bad_input(self):
        cf = self.cf
        a, b = self.bf16(512, 1024), self.bf16(1024, 3072)
        self.error(lambda: cf.ag_gemm(self.bf16(512, 1024, device="cpu"), b), "a must be a CUDA tensor, got device cpu")
        self.error(lambda: cf.ag_gemm(FakeTensor((512, 1024), "float32"), b),
                   "a must be bfloat16 or float16, got float32")
        self.error(lambda: cf.ag_gemm(a, FakeTensor((1024, 3072), "float16")), "b must be bfloat16, got float16")
        self.error(lambda: cf.ag_gemm(a, self.bf16(1024, 3072, contiguous=False)), "b must be contiguous (row-major)")
        self.error(lambda: cf.ag_gemm(a, self.bf16(1000, 3072)),
                   "ag_gemm: a is [.., 1024] but b is (1000, 3072): its K must be 1024")
        self.error(lambda: cf.ag_gemm(a, self.bf16(3072)), "b must have 2 dimensions, got shape (3072,)")
        self.error(lambda: cf.gemm_rs(self.bf16(4095, 512), self.bf16(512, 64)),
                   "gemm_rs: a has 4095 rows, not divisible by the world size 2")
        self.error(lambda: cf.ag_gemm(a, b, out=self.bf16(1024, 3000)), "out must have shape (1024, 3072), got (1024, 3000)")
        self.error(lambda: cf.ag_gemm(a, b, out=a), "out must have shape (1024, 3072), got (512, 1024)")
        alias = self.bf16(1024, 3072)
        alias._ptr = b.data_ptr() + 64  # inside b
        self.error(lambda: cf.ag_gemm(a, b, out=alias), "out must not overlap b")
        cf._lib = None
        self.error(lambda: cf.ag_gemm(a, b), "ccfuse is not initialised: call ccfuse.torch_ops.init() first")

    def test_fp16_and_gathered(self):
        cf, log = self.cf, self.lib.log
        h = FakeTensor((512, 1024), "float16")
        c = cf.ag_gemm(h, FakeTensor((1024, 3072), "float16"))
        self.assertEqual((c.dtype, log[0][-1]), ("float16", "fp16"))
        cf.ag_gemm(self.bf16(512, 1024), self.bf16(1024, 3072))  # another op: the dtype is in the key
        self.assertEqual([x[0] for x in log], ["create", "run", "create", "run"])
        c, g = cf.ag_gemm(self.bf16(512, 1024), self.bf16(1024, 3072), return_gathered=True)
        self.assertEqual((g.shape, g.dtype, g.data_ptr()), ((1024, 1024), "bfloat16", 0xA000))
        self.assertEqual(log[-1], ("gathered", ("ag_gemm", 1024, 3072, 1024)))

    def backward(self, y, gy):
        fn, ctx = y.grad_fn
        return fn.backward(ctx, gy)

    def test_parallel_linears(self):
        cf, log, torch = self.cf, self.lib.log, sys.modules["torch"]
        # W = 2, S = 1024 tokens, H = 512, N = 2048 (N/W = 1024 per rank)
        x, w_col, w_row = self.bf16(512, 512), self.bf16(1024, 512), self.bf16(512, 1024)
        y = cf.column_parallel_linear(x, w_col)  # sequence parallel: ag_gemm forward
        self.assertEqual(y.shape, (1024, 1024))
        self.assertEqual(log[0], ("create", "ag_gemm", 1024, 1024, 512, False, "bf16"))
        gx, gw = self.backward(y, self.bf16(1024, 1024))[:2]
        self.assertEqual((gx.shape, gw.shape), ((512, 512), (1024, 512)))  # x's and weight's shapes
        self.assertEqual(log[2], ("create", "gemm_rs", 1024, 512, 2048, True, "bf16"))  # gy @ weight, K = N
        self.assertEqual(torch.gathers, [((1024, 512), (512, 512))])  # x gathered again for the weight
        y = cf.column_parallel_linear(x, w_col, save_gathered=True)
        n = len(log)
        self.backward(y, self.bf16(1024, 1024))
        self.assertEqual(len(torch.gathers), 1)  # saved from the forward: no all-gather
        self.assertIn(("gathered", ("ag_gemm", 1024, 1024, 512)), log)
        self.assertEqual(log[n][0:2], ("run", ("gemm_rs", 1024, 512, 2048)))
        z = cf.row_parallel_linear(y, w_row)  # y [S, N/W] -> [S/W, H] by gemm_rs
        self.assertEqual(z.shape, (512, 512))
        self.assertEqual(log[-1][0:2], ("run", ("gemm_rs", 1024, 512, 2048)))
        gy, gw = self.backward(z, self.bf16(512, 512))[:2]
        self.assertEqual((gy.shape, gw.shape), ((1024, 1024), (512, 1024)))
        self.assertEqual(log[-3][0:2], ("create", "ag_gemm"))  # AllGather(gz) @ w_row, K = H
        self.assertEqual(log[-3][2:], (1024, 1024, 512, True, "bf16"))
        self.assertEqual(log[-1], ("gathered", ("ag_gemm", 1024, 1024, 512)))
        # without sequence parallelism: a local GEMM forward and gemm_ar backward; gemm_ar forward
        xr = self.bf16(1024, 512)
        y = cf.column_parallel_linear(xr, w_col, sequence_parallel=False)
        self.assertEqual((y.shape, log[-1][0]), ((1024, 1024), "gemm"))
        gx, gw = self.backward(y, self.bf16(1024, 1024))[:2]
        self.assertEqual((gx.shape, gw.shape), ((1024, 512), (1024, 512)))
        self.assertEqual(log[-1][0:2], ("run", ("gemm_ar", 1024, 512, 2048)))
        z = cf.row_parallel_linear(y, w_row, sequence_parallel=False)
        self.assertEqual((z.shape, log[-1][0:2]), ((1024, 512), ("run", ("gemm_ar", 1024, 512, 2048))))
        gy, gw = self.backward(z, self.bf16(1024, 512))[:2]
        self.assertEqual((gy.shape, gw.shape, log[-1][0]), ((1024, 1024), (512, 1024), "gemm"))
        # biases: the column layer's shard [N/W], the row layer's whole [H], added after the op
        y = cf.column_parallel_linear(x, w_col, self.bf16(1024))
        self.assertEqual((y.shape, log[-1][0:2]), ((1024, 1024), ("run", ("ag_gemm", 1024, 1024, 512))))
        z = cf.row_parallel_linear(y, w_row, self.bf16(512))
        self.assertEqual((z.shape, log[-1][0:2]), ((512, 512), ("run", ("gemm_rs", 1024, 512, 2048))))
        with self.assertRaises(AssertionError):  # a bias of the wrong width does not broadcast
            cf.row_parallel_linear(y, w_row, self.bf16(1024))

    def grad(self, *shape):
        t = self.bf16(*shape)
        t.requires_grad = True
        return t

    def test_raw_ops_with_autograd(self):
        # The raw ops with inputs that require grad go through autograd (b [K, N] here, not a Linear
        # weight: each backward flips b_is_weight to take b's transpose). W = 2.
        cf, log, torch = self.cf, self.lib.log, sys.modules["torch"]
        a, b = self.grad(512, 1024), self.grad(1024, 3072)
        c = cf.ag_gemm(a, b)
        self.assertEqual((c.shape, log[0]), ((1024, 3072), ("create", "ag_gemm", 1024, 3072, 1024, True, "bf16")))
        ga, gb = self.backward(c, self.bf16(1024, 3072))[:2]
        self.assertEqual((ga.shape, gb.shape), ((512, 1024), (1024, 3072)))  # a's and b's shapes
        self.assertEqual(log[2], ("create", "gemm_rs", 1024, 1024, 6144, False, "bf16"))  # gc @ b.T, b as [N, K]
        self.assertEqual(torch.gathers, [((1024, 1024), (512, 1024))])  # a gathered again for b's gradient
        a, b = self.grad(1024, 512), self.grad(512, 2048)
        c = cf.gemm_rs(a, b)
        self.assertEqual(c.shape, (512, 2048))
        ga, gb = self.backward(c, self.bf16(512, 2048))[:2]
        self.assertEqual((ga.shape, gb.shape), ((1024, 512), (512, 2048)))
        self.assertEqual(log[-3], ("create", "ag_gemm", 1024, 512, 2048, False, "bf16"))  # AllGather(gc) @ b.T
        self.assertEqual(log[-1], ("gathered", ("ag_gemm", 1024, 512, 2048)))  # the gathered gc, for b
        b.requires_grad = False  # only a's gradient: no gathered copy needed
        c = cf.gemm_rs(a, b)
        ga, gb = self.backward(c, self.bf16(512, 2048))[:2]
        self.assertEqual((ga.shape, gb, log[-1][0]), ((1024, 512), None, "run"))
        b.requires_grad = True
        c = cf.gemm_ar(a, b)
        self.assertEqual(c.shape, (1024, 2048))
        ga, gb = self.backward(c, self.bf16(1024, 2048))[:2]
        self.assertEqual((ga.shape, gb.shape), ((1024, 512), (512, 2048)))
        self.assertEqual(log[-1][:4], ("gemm", 1024, 512, 2048))  # local: gc @ b.T
        self.assertEqual(log[-1][-3], ("b_kn", False))
        c = cf.mm(a, self.grad(2048, 512), b_is_weight=True)
        ga, gb = self.backward(c, self.bf16(1024, 2048))[:2]
        self.assertEqual((ga.shape, gb.shape, log[-1][-3]), ((1024, 512), (2048, 512), ("b_kn", True)))
        c, g = cf.ag_gemm(self.grad(512, 1024), self.bf16(1024, 3072), return_gathered=True)
        self.assertEqual((c.shape, g.shape), ((1024, 3072), (1024, 1024)))
        self.assertEqual(c.grad_fn[1].non_differentiable, (g,))  # the gathered rows carry no gradient
        # what autograd cannot take: an out= buffer; the ops without a backward yet say so
        self.error(lambda: cf.gemm_rs(a, b, out=self.bf16(512, 2048)),
                   "out= is not supported when an input requires grad (autograd needs a fresh output)")
        # grouped_mm: a's gradient by the grouped GEMM (b's transpose), b's by the K-grouped GEMM
        # (the contraction over each group's rows, the counts read on the device), no torch._grouped_mm
        x, rows = self.grad(4096, 512), FakeTensor((8,), "int32")
        y = cf.grouped_mm(x, self.grad(8, 1536, 512), rows, b_is_weight=True)
        torch.grouped_mms.clear()
        gy = self.bf16(4096, 1536)
        gx, gw = self.backward(y, gy)[:2]
        self.assertEqual((gx.shape, gw.shape), ((4096, 512), (8, 1536, 512)))
        self.assertEqual(log[-2][:5], ("grouped_gemm", 8, 4096, 512, 1536))  # gy [R, N] @ w[g] [N, K]
        self.assertEqual(log[-2][7], gx.data_ptr())  # into a zeroed gradient (rows past the groups stay 0)
        self.assertEqual(log[-2][-2], ("b_kn", True))
        # gy_g^T @ x_g per group: (G, rows, m = N, n = K), a = gy, b = x, c = gw, the counts
        self.assertEqual(log[-1][:9], ("kgrouped_gemm", 8, 4096, 1536, 512, gy.data_ptr(), x.data_ptr(),
                                       gw.data_ptr(), rows.data_ptr()))
        self.assertEqual(log[-1][-1], ("dtype", "bf16"))
        y = cf.grouped_mm(x, self.grad(8, 512, 1536), rows)  # b [G, K, N]
        gx, gw = self.backward(y, gy)[:2]
        self.assertEqual((gx.shape, gw.shape, log[-2][-2]), ((4096, 512), (8, 512, 1536), ("b_kn", False)))
        self.assertEqual(log[-1][:7], ("kgrouped_gemm", 8, 4096, 512, 1536, x.data_ptr(), gy.data_ptr()))  # x_g^T gy_g
        self.assertEqual(torch.grouped_mms, [])
        torch.is_grad_enabled = lambda: False  # under torch.no_grad(): the kernel alone, out= allowed
        n = len(log)
        cf.gemm_rs(a, b, out=self.bf16(512, 2048))
        self.assertEqual(log[n][0:2], ("run", ("gemm_rs", 1024, 2048, 1024)))

    def test_init_on_a_process_group(self):
        # init(process_group=g): the Team on g's NCCL communicator (borrowed), the backward's torch
        # collectives on g too; errors for what cannot be borrowed
        cf, torch = self.cf, sys.modules["torch"]
        cf._lib = None
        libs = []

        class Lib(FakeLib):
            def init_from_comm(self, ptr):
                self.log.append(("init_from_comm", ptr))

            def init_from_env(self):
                self.log.append(("init_from_env",))
        cf.Ccfuse = lambda path=None: libs.append(Lib(2)) or libs[-1]

        class Backend:
            def __init__(self, ptr):
                self.ptr = ptr

            def _comm_ptr(self):
                return self.ptr

        class Group:
            def __init__(self, backend):
                self.backend = backend

            def _get_backend(self, dev):
                return self.backend
        torch.dist_ready[0] = False
        self.error(lambda: cf.init(process_group=Group(Backend(7))),
                   "process_group: torch.distributed is not initialised (dist.init_process_group first)")
        torch.dist_ready[0] = True
        self.error(lambda: cf.init(process_group=Group(object())),
                   "process_group must be an NCCL group (its backend object has no NCCL communicator)")
        self.error(lambda: cf.init(process_group=Group(Backend(0))),
                   "process_group: its NCCL communicator on cuda does not exist")
        tp = Group(Backend(0x7f00))
        self.assertEqual(cf.init(process_group=tp), 2)
        self.assertEqual(libs[-1].log, [("init_from_comm", 0x7f00)])
        self.assertEqual(torch.reduces[-1], ((1,), tp))  # the communicator made to exist first
        self.assertEqual(cf.init(process_group=tp), 2)  # the same group again: nothing new
        self.error(lambda: cf.init(), "init: ccfuse's Team exists already on another group: call finalize() first")
        cf._all_gather_rows(self.bf16(64, 128))
        self.assertEqual(torch.gathers[-1], ((128, 128), (64, 128), tp))
        cf.finalize()
        self.assertEqual((cf._lib, cf._group), (None, None))
        cf.init()
        self.assertEqual(libs[-1].log, [("init_from_env",)])
        cf._all_gather_rows(self.bf16(64, 128))
        self.assertEqual(torch.gathers[-1], ((128, 128), (64, 128)))

    def test_moe_on_an_expert_parallel_group(self):
        # MoeFfn(group=ep): a Team of its own on ep's communicator (made once per group, collective),
        # the experts split over ep's size, both directions' handles made on that Team; finalize()
        # closes it after the layers. init()'s group (here None: the process's Team of size 2) is
        # left alone.
        cf, log = self.cf, self.lib.log
        teams = []

        class Team:
            def __init__(self, ptr, world):
                self.ptr, self.world, self.closed = ptr, world, False

            def world_size(self):
                return self.world

            def close(self):
                self.closed = True
                log.append(("team_close", self.ptr))
        self.lib.team_from_comm = lambda ptr: teams.append(Team(ptr, 4)) or teams[-1]

        class Backend:
            def _comm_ptr(self):
                return 0x5e00

        class Group:
            def _get_backend(self, dev):
                return Backend()
        ep = Group()
        w1, w2 = self.bf16(2, 256, 512), self.bf16(2, 512, 128)  # E/W = 2 of E = 8 over ep's 4 ranks
        moe = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, group=ep, wgrad="torch")
        self.assertEqual(len(teams), 1)
        self.assertIn(("team", teams[0]), log[-1])  # moe_create on ep's Team
        self.assertEqual((moe._world, moe._group), (4, ep))
        again = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, group=ep)
        self.assertEqual(len(teams), 1)  # one Team per group
        self.error(lambda: cf.MoeFfn(self.bf16(4, 256, 512), self.bf16(4, 512, 128), 8, 2, 100, group=ep),
                   "w1 holds 4 experts, but num_experts 8 / world size 4 = 2.0")
        # the fused backward's handle on the same Team
        x, ids, wg = self.bf16(64, 512), FakeTensor((64, 2), "int32"), FakeTensor((64, 2), "float32")
        wg.requires_grad = True
        y = moe(x, ids, wg)
        fn, ctx = y.grad_fn
        fn.backward(ctx, self.bf16(64, 512))
        bwd = [e for e in log if e[0] == "moe_bwd_create"]
        self.assertIn(("team", teams[0]), bwd[-1])
        # the process's Team for group=None (no team= passed)
        plain = cf.MoeFfn(self.bf16(4, 256, 512), self.bf16(4, 512, 128), 8, 2, 100)
        self.assertEqual(log[-1][0], "moe_create")
        self.assertNotIn("team", [e[0] for e in log[-1] if isinstance(e, tuple)])
        self.assertEqual((plain._world, plain._group), (2, None))
        cf.finalize()
        self.assertTrue(teams[0].closed)
        self.assertLess(log.index(("moe_bwd_close",)), log.index(("team_close", 0x5e00)))  # layers first
        self.assertEqual(cf._teams, {})
        del again

    def test_moe(self):
        cf, log = self.cf, self.lib.log
        w1, w2 = self.bf16(4, 256, 512), self.bf16(4, 512, 128)  # E/W = 4, 2F = 256, H = 512
        moe = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, imbalance=1.2, backward="unfused")
        self.assertEqual(log[0], ("moe_create", 100, 512, 128, 8, 2, ("b_kn", False), ("imbalance", 1.2), ("swiglu", True)))
        x, ids, wts = self.bf16(64, 512), FakeTensor((64, 2), "int32"), FakeTensor((64, 2), "float32")
        y = moe(x, ids, wts)
        self.assertEqual(y.shape, (64, 512))
        self.assertEqual(log[1][2:4], (x.data_ptr(), 64))
        self.error(lambda: moe(self.bf16(101, 512), FakeTensor((101, 2), "int32"), FakeTensor((101, 2), "float32")),
                   "x has 101 tokens, more than max_tokens 100")
        self.error(lambda: moe(x, FakeTensor((64, 3), "int32"), wts),
                   "topk_ids and topk_w must be [64, 2], got (64, 3) and (64, 2)")
        self.error(lambda: moe(x, FakeTensor((64, 2), "int64"), wts), "topk_ids must be int32, got int64")
        # mismatched hidden sizes (the raw-pointer C++ API cannot see them; tensors can)
        self.error(lambda: moe(self.bf16(64, 256), ids, wts), "x must be [T, 512], got (64, 256)")
        self.error(lambda: cf.MoeFfn(w1, self.bf16(4, 512, 64), 8, 2, 100),
                   "w2 must be [E/W, H, F] = (4, 512, 128) for w1 (4, 256, 512), got (4, 512, 64)")
        # with an input that requires grad: the fused forward inside the autograd Function (its
        # backward, ccfuse.moe_grad, runs on real torch: tests/python/test_moe_grad_torch.py)
        n = len(log)
        wg = FakeTensor((64, 2), "float32")
        wg.requires_grad = True
        y = moe(x, ids, wg)
        self.assertEqual((y.shape, log[n][2:4]), ((64, 512), (x.data_ptr(), 64)))
        self.assertEqual(y.grad_fn[0].__name__, "_MoeFfnFn")
        self.assertEqual(y.grad_fn[1].saved_tensors[:4], (x, wg, w1, w2))  # w1 as given (gate, up), not the permuted copy
        self.error(lambda: moe(x, ids, wg, out=self.bf16(64, 512)),
                   "out= is not supported when an input requires grad (autograd needs a fresh output)")
        self.error(lambda: moe(self.bf16(64, 256), ids, wg), "x must be [T, 512], got (64, 256)")
        torch = sys.modules["torch"]
        # backward="fused": ccfuse's MoeFfnBackward (made at the first backward), then the weight
        # gradients by torch._grouped_mm over its operands (max_rows 640 here)
        self.error(lambda: cf.MoeFfn(w1, w2, 8, 2, 100, backward="fast"),
                   "backward must be 'unfused' (ccfuse.moe_grad) or 'fused' (ccfuse's MoeFfnBackward), got 'fast'")
        fused = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, backward="fused", wgrad="torch",
                          recompute=True)
        y = fused(x, ids, wg)
        fn, ctx = y.grad_fn
        n = len(log)
        torch.grouped_mms.clear()
        dx, dw, dw1, dw2, none1, none2 = fn.backward(ctx, self.bf16(64, 512))
        self.assertEqual(log[n], ("moe_bwd_create", 100, 512, 128, 8, 2, ("b_kn", False), ("imbalance", 0.0),
                                  ("swiglu", True), ("w1_swiglu_tiles", False)))
        self.assertEqual(log[n + 1], ("moe_bwd_run", x.data_ptr(), 64))
        self.assertEqual((dx.shape, dw.shape, dw.dtype), ((64, 512), (64, 2), "float32"))
        self.assertEqual(torch.grouped_mms, [((256, 640), (640, 512), (4,)), ((512, 640), (640, 128), (4,))])
        self.assertEqual((dw1.shape, dw2.shape, none1, none2), ((4, 256, 512), (4, 512, 128), None, None))
        fn.backward(ctx, self.bf16(64, 512))  # the handle is made once
        self.assertEqual([e[0] for e in log[n:]].count("moe_bwd_create"), 1)
        # the backward's own checks (what the custom op's fake implementation runs too)
        self.error(lambda: fused._fused_backward(x, ids, wg, self.bf16(64, 256), w1, w2),
                   "g (the output's gradient) must be [64, 512] like x, got (64, 256)")
        self.error(lambda: fused._fused_backward(x, ids, wg, self.bf16(64, 512), w1, self.bf16(4, 512, 64)),
                   "w2 must be the layer's (4, 512, 128), got (4, 512, 64)")
        fused.close()
        self.assertEqual(log[-1], ("moe_bwd_close",))
        # wgrad="ccfuse": the weight gradients by the K-grouped GEMM on the same operands (d h^T x
        # and g^T (p a) per expert, the experts' row counts on the device), no torch._grouped_mm
        self.error(lambda: cf.MoeFfn(w1, w2, 8, 2, 100, wgrad="cutlass"),
                   "wgrad must be 'torch' (torch._grouped_mm) or 'ccfuse' (the K-grouped GEMM), got 'cutlass'")
        kw = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100)  # wgrad="ccfuse" is the default
        y = kw(x, ids, wg)
        fn, ctx = y.grad_fn
        n = len(log)
        torch.grouped_mms.clear()
        dx, dw, dw1, dw2, none1, none2 = fn.backward(ctx, self.bf16(64, 512))
        self.assertEqual(torch.grouped_mms, [])
        kg = [e for e in log[n:] if e[0] == "kgrouped_gemm"]
        self.assertEqual([e[1:5] for e in kg], [(4, 640, 256, 512), (4, 640, 512, 128)])  # (E/W, max_rows, m, n)
        self.assertEqual([e[5:7] for e in kg], [(2 << 30, 1 << 30), (3 << 30, 4 << 30)])  # (d h, x), (g, p a)
        self.assertEqual([e[7] for e in kg], [dw1.data_ptr(), dw2.data_ptr()])
        self.assertEqual({e[8] for e in kg}, {5 << 30})  # the backward's rows per expert
        self.assertEqual((dw1.shape, dw2.shape), ((4, 256, 512), (4, 512, 128)))
        self.assertEqual({e[10:] for e in kg}, {(1234, ("accumulate", False))})  # stream, kw
        kw.close()
        # main_grad=True (Megatron's gradient-accumulation fusion): the K-grouped GEMM adds into the
        # weights' fp32 main_grad (accumulate=True, main_grad's address as C); autograd gets
        # Megatron's dummy (the flag set) or None; wgrad="torch" adds torch._grouped_mm's result
        self.error(lambda: cf.MoeFfn(w1, w2, 8, 2, 100, main_grad=1), "main_grad must be True (add the weight "
                   "gradients into w.main_grad) or False, got 1")
        self.error(lambda: cf.MoeFfn(w1, w2, 8, 2, 100, backward="unfused", main_grad=True),
                   "main_grad=True is built for backward='fused'; backward='unfused' returns the weight gradients")
        mg = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, wgrad="ccfuse", main_grad=True)
        self.error(lambda: mg(x, ids, wg), "w1 has no main_grad: MoeFfn(main_grad=True) adds the weight gradients "
                   "into an fp32 w.main_grad shaped like the weight (Megatron's DDP allocates it)")
        w1.main_grad = FakeTensor((4, 256, 512), "bfloat16")
        w2.main_grad = FakeTensor((4, 512, 128), "float32")
        self.error(lambda: mg(x, ids, wg), "w1.main_grad must be float32 (4, 256, 512) on cuda like w1, got "
                   "bfloat16 (4, 256, 512) on cuda")
        w1.main_grad = FakeTensor((4, 256, 512), "float32", contiguous=False)
        self.error(lambda: mg(x, ids, wg), "w1.main_grad must be contiguous and 16-byte aligned")
        w1.main_grad = FakeTensor((4, 256, 512), "float32")
        w1.grad_added_to_main_grad = False  # Megatron's attribute on w1 only: w2 gets None
        try:
            y = mg(x, ids, wg)
            fn, ctx = y.grad_fn
            n = len(log)
            torch.grouped_mms.clear()
            dx, dw, dw1, dw2, _, _ = fn.backward(ctx, self.bf16(64, 512))
            self.assertEqual(torch.grouped_mms, [])
            kg = [e for e in log[n:] if e[0] == "kgrouped_gemm"]
            self.assertEqual([(e[1:5], e[7], e[11]) for e in kg],
                             [((4, 640, 256, 512), w1.main_grad.data_ptr(), ("accumulate", True)),
                              ((4, 640, 512, 128), w2.main_grad.data_ptr(), ("accumulate", True))])
            self.assertEqual((dw1.shape, dw1.dtype, w1.grad_added_to_main_grad, dw2), ((4, 256, 512), "bfloat16",
                                                                                      True, None))
            mg.close()
            tm = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, main_grad=True, wgrad="torch")
            y = tm(x, ids, wg)
            fn, ctx = y.grad_fn
            torch.grouped_mms.clear()
            _, _, dw1, dw2, _, _ = fn.backward(ctx, self.bf16(64, 512))
            self.assertEqual(len(torch.grouped_mms), 2)
            self.assertEqual([[a.shape for a in w.main_grad.added] for w in (w1, w2)],
                             [[(4, 256, 512)], [(4, 512, 128)]])
            self.assertEqual((dw1.shape, dw2), ((4, 256, 512), None))
            # under torch.compile it refuses (the backward writes main_grad outside the graph)
            torch.compiler = types.SimpleNamespace(is_compiling=lambda: True)
            try:
                self.error(lambda: tm(x, ids, wg), "MoeFfn(main_grad=True) runs in eager mode only (its backward "
                           "writes w.main_grad, outside the compiled graph): keep the MoE FFN out of the compiled "
                           "region or use main_grad=False")
            finally:
                del torch.compiler
            tm.close()
        finally:
            for name in ("main_grad", "grad_added_to_main_grad"):
                for w in (w1, w2):
                    w.__dict__.pop(name, None)
        # under torch.compile: "unfused" refuses (its host sync); "fused" traces into the custom ops
        # torch.ops.ccfuse.moe_ffn and moe_ffn_backward (the layer by its handle), nothing run eagerly
        fused = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, backward="fused", recompute=True)
        calls = []
        grads = (self.bf16(64, 512), FakeTensor((64, 2), "float32"), self.bf16(4, 256, 512), self.bf16(4, 512, 128))
        torch.compiler = types.SimpleNamespace(is_compiling=lambda: True)
        torch.ops = types.SimpleNamespace(ccfuse=types.SimpleNamespace(
            moe_ffn=lambda *a: calls.append(("moe_ffn", a[0], a[3])) or self.bf16(64, 512),
            moe_ffn_backward=lambda *a: calls.append(("moe_ffn_backward", a[0], a[3].shape, a[6])) or grads))
        try:
            self.error(lambda: moe(x, ids, wg), "MoeFfn(backward='unfused') runs in eager mode only (its all-to-all "
                       "sizes sync with the host): under torch.compile train with backward='fused', keep the MoE "
                       "FFN out of the compiled region, or call it under torch.no_grad()")
            n = len(log)
            y = fused(x, ids, wg)
            fn, ctx = y.grad_fn
            self.assertEqual(fn.backward(ctx, self.bf16(64, 512)), grads + (None, None))
            self.assertEqual(calls, [("moe_ffn", x, fused._key), ("moe_ffn_backward", x, (64, 512), fused._key)])
            self.assertEqual(log[n:], [])
        finally:
            del torch.compiler, torch.ops
        fused.close()
        self.error(lambda: cf.MoeFfn(w1, w2, 16, 2, 100),
                   "w1 holds 4 experts, but num_experts 16 / world size 2 = 8.0")
        default = cf.MoeFfn(w1, w2, 8, 2, 100)
        self.assertEqual((default.backward, default.recompute), ("fused", False))  # the defaults: keep h
        self.assertTrue(cf.MoeFfn(w1, w2, 8, 2, 100, backward="unfused").recompute)  # unfused recomputes

    def test_moe_kept_h(self):
        # recompute=False: the training forward keeps h [kept rows, 2F] (run_keep), the backward reads
        # it (run_saved, with its rows); without a gradient the plain run. The kept rows: by default
        # max_tokens * topk * 5/4 rounded up to 128 (256 here), at most max_rows (640 here)
        cf, log = self.cf, self.lib.log
        w1, w2 = self.bf16(4, 256, 512), self.bf16(4, 512, 128)
        self.error(lambda: cf.MoeFfn(w1, w2, 8, 2, 100, recompute="no"),
                   "recompute must be True (the backward recomputes h) or False (the forward keeps h), got 'no'")
        self.error(lambda: cf.MoeFfn(w1, w2, 8, 2, 100, backward="unfused", recompute=False),
                   "recompute=False keeps h for backward='fused'; backward='unfused' recomputes it")
        moe = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, recompute=False)
        x, ids = self.bf16(64, 512), FakeTensor((64, 2), "int32")
        moe(x, ids, FakeTensor((64, 2), "float32"))
        self.assertEqual(log[-1][0], "run")
        wg = FakeTensor((64, 2), "float32")
        wg.requires_grad = True
        y = moe(x, ids, wg)
        fn, ctx = y.grad_fn
        h = ctx.saved_tensors[5]
        self.assertEqual((log[-1][0], log[-1][2:4], h.shape), ("run_keep", (x.data_ptr(), 64), (256, 256)))
        self.assertEqual(log[-1][-3:], (h.data_ptr(), 1234, ("preact_rows", 256)))  # preact_out, stream, rows
        n = len(log)
        fn.backward(ctx, self.bf16(64, 512))
        self.assertEqual(log[n + 1], ("moe_bwd_run_saved", x.data_ptr(), 64, h.data_ptr(), ("h_rows", 256)))
        self.error(lambda: moe._fused_backward(x, ids, wg, self.bf16(64, 512), w1, w2, self.bf16(320, 256)),
                   "h (the forward's kept pre-activation) must be (256, 256), got (320, 256)")
        moe.close()
        # kept_rows: the caller's bound, at most the receive bound; only with recompute=False
        big = cf.MoeFfn(w1, w2, num_experts=8, topk=2, max_tokens=100, recompute=False, kept_rows=1000)
        y = big(x, ids, wg)
        self.assertEqual((y.grad_fn[1].saved_tensors[5].shape, log[-1][-1]), ((640, 256), ("preact_rows", 640)))
        big.close()
        for bad, rc in ((300, True), (0, False), (2.5, False), (True, False)):
            self.error(lambda: cf.MoeFfn(w1, w2, 8, 2, 100, recompute=rc, kept_rows=bad),
                       "kept_rows must be a positive int with recompute=False (the rows of the kept h), or None; "
                       "got %r with recompute=%r" % (bad, rc))

    def test_mm_and_grouped_mm(self):
        cf, log = self.cf, self.lib.log
        a, w = self.bf16(300, 512), self.bf16(1024, 512)  # a Linear weight [N, K]
        c = cf.mm(a, w, b_is_weight=True)
        self.assertEqual(c.shape, (300, 1024))
        self.assertEqual(log[-1], ("gemm", 300, 1024, 512, a.data_ptr(), w.data_ptr(), c.data_ptr(), 1234,
                                   ("b_kn", False), ("dtype", "bf16"), ("workspace", None)))
        h = FakeTensor((300, 512), "float16")
        cf.mm(h, FakeTensor((512, 64), "float16"))
        self.assertEqual(log[-1][-3:], (("b_kn", True), ("dtype", "fp16"), ("workspace", None)))
        cf.mm(self.bf16(300, 8192), self.bf16(8192, 64))  # needs a workspace: one from torch, per call
        self.assertIsNotNone(log[-1][-1][1])
        x, experts, rows = self.bf16(4096, 512), self.bf16(8, 1536, 512), FakeTensor((8,), "int32")
        y = cf.grouped_mm(x, experts, rows, b_is_weight=True)
        self.assertEqual(y.shape, (4096, 1536))
        call = log[-1]
        self.assertEqual(call[:9], ("grouped_gemm", 8, 4096, 1536, 512, x.data_ptr(), experts.data_ptr(), y.data_ptr(),
                                    rows.data_ptr()))
        self.assertEqual(call[-3:], (1234, ("b_kn", False), ("dtype", "bf16")))
        y2 = cf.grouped_mm(x, self.bf16(8, 512, 1536), rows)  # b [G, K, N]
        self.assertEqual((y2.shape, log[-1][-2]), ((4096, 1536), ("b_kn", True)))
        # without init(): the library is loaded on first use (no Team)
        cf._lib = None
        cf._local_lib = self.lib
        cf.mm(a, w, b_is_weight=True)
        self.assertEqual(log[-1][0], "gemm")

    def test_route(self):
        cf, log = self.cf, self.lib.log
        logits, bias = FakeTensor((4096, 64), "float32"), FakeTensor((64,), "float32")
        ids, w, counts, dropped = cf.route(logits, 8, bias=bias, capacity_factor=1.25, drop="probability")
        self.assertEqual((ids.shape, ids.dtype, w.shape, w.dtype), ((4096, 8), "int32", (4096, 8), "float32"))
        self.assertEqual((counts.shape, counts.dtype, dropped.shape, dropped.dtype), ((64,), "int32", (1,), "int64"))
        self.assertEqual(log[0][:4], ("route_ws", 64, 8, 4096))
        self.assertIn(("world_size", 2), log[0])  # the Team's W: experts must split over the ranks
        call = log[1]
        self.assertEqual(call[:6], ("route", 64, 8, logits.data_ptr(), 4096, bias.data_ptr()))
        self.assertEqual(call[6:10], (ids.data_ptr(), w.data_ptr(), counts.data_ptr(), dropped.data_ptr()))
        self.assertIsNotNone(call[10])  # a workspace (the capacity can bind) ...
        self.assertEqual(call[11], 1234)  # ... and torch's current stream
        self.assertIn(("drop", "probability"), call)
        cf.route(logits, 8, bias=bias, capacity_factor=1.25, drop="probability")
        self.assertEqual([x[0] for x in log], ["route_ws", "route", "route"])  # the size is asked once
        cf.route(logits, 2)  # dropless: no workspace, no bias
        self.assertEqual((log[-1][5], log[-1][10]), (None, None))
        self.error(lambda: cf.route(self.bf16(4096, 64), 8), "logits must be float32, got bfloat16")
        self.error(lambda: cf.route(logits, 8, bias=FakeTensor((32,), "float32")),
                   "bias must have one value per expert (64), got 32")

    def test_mm_bad_input(self):
        cf = self.cf
        a = self.bf16(300, 512)
        self.error(lambda: cf.mm(FakeTensor((300, 512), "float32"), a),
                   "a must be bfloat16 or float16, got float32")
        self.error(lambda: cf.mm(a, FakeTensor((512, 64), "float16")), "b must be bfloat16, got float16")
        self.error(lambda: cf.mm(a, self.bf16(500, 64)), "mm: a is (300, 512) but b is (500, 64): its K must be 512")
        self.error(lambda: cf.mm(a, self.bf16(512, 64), out=FakeTensor((300, 64), "float16")),
                   "out must be bfloat16, got float16")
        self.error(lambda: cf.mm(a, self.bf16(512, 512), out=a), "out must not overlap a")
        x, rows = self.bf16(64, 512), FakeTensor((4,), "int32")
        self.error(lambda: cf.grouped_mm(x, self.bf16(4, 256, 256), rows),
                   "grouped_mm: a is (64, 512) but b is (4, 256, 256): its K must be 512")
        self.error(lambda: cf.grouped_mm(x, self.bf16(4, 512, 256), FakeTensor((4,), "int64")),
                   "group_rows must be int32, got int64")
        self.error(lambda: cf.grouped_mm(x, self.bf16(5, 512, 256), rows),
                   "group_rows must have one count per group of b (5), got 4")
        self.error(lambda: cf.grouped_mm(x, self.bf16(512, 256), rows), "b must have 3 dimensions, got shape (512, 256)")
        other = FakeTensor((4,), "int32")
        other.device = FakeDevice("cuda", 1)
        self.error(lambda: cf.grouped_mm(x, self.bf16(4, 512, 256), other), "group_rows must be on a's device cuda, got cuda:1")


if __name__ == "__main__":
    unittest.main()
