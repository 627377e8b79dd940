"""ccfuse.layers on the CPU with a real torch: the modules' parameters, wiring and autograd, with
ccfuse's kernels stood in for by torch (the kernels themselves are checked on GPUs by
tools/torch_layers_check.py and the torch_ops tools). What is checked here is the layers' own math:
router_weights' values and gradient against an independent torch router (softmax / sigmoid,
top-k with a bias, normalisation, capacity drops by position), and MoeLayer forward and backward
(x, gate, w1, w2) against a plain torch MoE, the balancing step, and the argument errors.
Skipped without a real torch (tools/torch_cpu_env.sh installs one; tools/test.sh runs it)."""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
try:
    import torch
    HAVE_TORCH = hasattr(torch, "randn") and hasattr(torch, "nn")
except ImportError:
    HAVE_TORCH = False


def torch_router(logits, k, bias=None, score="softmax", normalize=True, capacity_factor=0.0):
    """The router's contract in plain torch (docs/moe-routing.md): ids, weights, counts, dropped."""
    scores = torch.softmax(logits, -1) if score == "softmax" else torch.sigmoid(logits)
    steer = scores if bias is None else scores + bias
    ids = torch.topk(steer, k, dim=1).indices
    w = scores.gather(1, ids)
    if normalize:
        w = w / w.sum(1, keepdim=True)
    t, e = logits.shape
    ids = ids.clone()
    w = w.clone()
    if capacity_factor > 0:  # by position: earlier tokens first, slot by slot within a token
        cap = math.ceil(capacity_factor * t * k / e)
        used = [0] * e
        for i in range(t):
            for j in range(k):
                ex = int(ids[i, j])
                if used[ex] >= cap:
                    ids[i, j], w[i, j] = -1, 0.0
                else:
                    used[ex] += 1
    counts = torch.bincount(ids[ids >= 0].flatten(), minlength=e).to(torch.int32)
    return ids.to(torch.int32), w, counts, torch.tensor([int((ids < 0).sum())])


class StubLib:
    def __init__(self, world):
        self.world = world

    def world_size(self):
        return self.world


class TorchExperts:
    """torch_ops.MoeFfn's contract at W = 1 in plain torch (differentiable)."""

    def __init__(self, w1, w2, num_experts, topk, max_tokens, imbalance=0.0, backward="fused", recompute=True,
                 wgrad="ccfuse", main_grad=False, kept_rows=None, group=None):
        self._w1_src, self.w2, self.closed, self.recompute, self.group = w1, w2, False, recompute, group
        self.options = dict(num_experts=num_experts, topk=topk, max_tokens=max_tokens, imbalance=imbalance,
                            backward=backward, recompute=recompute, wgrad=wgrad, main_grad=main_grad,
                            kept_rows=kept_rows)

    def __call__(self, x, topk_ids, topk_w):
        f = self.w2.shape[2]
        out = torch.zeros_like(x)
        for j in range(topk_ids.shape[1]):
            for e in range(self._w1_src.shape[0]):
                sel = torch.nonzero(topk_ids[:, j] == e).squeeze(1)
                if sel.numel():
                    h = x[sel] @ self._w1_src[e].t()
                    a = torch.nn.functional.silu(h[:, :f]) * h[:, f:]
                    out = out.index_add(0, sel, topk_w[sel, j:j + 1].to(x.dtype) * (a @ self.w2[e].t()))
        return out

    def close(self):
        self.closed = True


@unittest.skipUnless(HAVE_TORCH, "needs torch; tools/torch_cpu_env.sh installs one")
class Layers(unittest.TestCase):
    def setUp(self):
        from ccfuse import layers
        from ccfuse import torch_ops as cf
        self.cf, self.layers = cf, layers
        self.saved = (cf._lib, cf.MoeFfn, cf.route, cf.column_parallel_linear, cf.row_parallel_linear)
        cf._lib = StubLib(1)
        cf.MoeFfn = TorchExperts
        cf.route = lambda logits, k, bias=None, score="softmax", normalize=True, capacity_factor=0.0, drop="position": \
            torch_router(logits, k, bias, score, normalize, capacity_factor)
        self.gen = torch.Generator().manual_seed(11)

    def tearDown(self):
        cf = self.cf
        cf._lib, cf.MoeFfn, cf.route, cf.column_parallel_linear, cf.row_parallel_linear = self.saved

    def randn(self, *shape, dtype=None):
        return torch.randn(*shape, generator=self.gen, dtype=dtype or torch.float64)

    def test_router_weights_value_and_gradient(self):
        t, e, k = 40, 8, 3
        for score in ("softmax", "sigmoid"):
            for capacity in (0.0, 0.6):
                for with_bias in (False, True):
                    logits = self.randn(t, e, dtype=torch.float32)
                    bias = 0.05 * self.randn(e, dtype=torch.float32) if with_bias else None
                    ids, w, _, dropped = torch_router(logits, k, bias, score, True, capacity)
                    if capacity > 0:
                        self.assertGreater(int(dropped), 0)
                    lg = logits.clone().requires_grad_()
                    got = self.layers.router_weights(lg, ids, w, score, True, bias, drops=capacity > 0)
                    self.assertTrue(torch.equal(got.detach(), w))  # the router's values, unchanged
                    coef = self.randn(t, k, dtype=torch.float32)
                    (got * coef).sum().backward()
                    # the reference: the same router with autograd through scores and normalisation
                    lr = logits.clone().requires_grad_()
                    scores = torch.softmax(lr, -1) if score == "softmax" else torch.sigmoid(lr)
                    chosen = torch.topk(scores.detach() + (0 if bias is None else bias), k, dim=1).indices
                    ref = scores.gather(1, chosen) / scores.gather(1, chosen).sum(1, keepdim=True)
                    ref = torch.where(ids >= 0, ref, torch.zeros_like(ref))  # dropped: 0, same slots
                    self.assertTrue(torch.allclose(ref.detach(), w, atol=1e-6))
                    (ref * coef).sum().backward()
                    err = float((lg.grad - lr.grad).norm() / lr.grad.norm())
                    self.assertLess(err, 1e-5, (score, capacity, with_bias))

    def moe_reference(self, x, gate, w1, w2, k, capacity):
        logits = x.float() @ gate.t()
        ids, _, _, _ = torch_router(logits.detach(), k, capacity_factor=capacity)
        scores = torch.softmax(logits, -1)
        chosen = torch.topk(scores.detach(), k, dim=1).indices
        w = scores.gather(1, chosen) / scores.gather(1, chosen).sum(1, keepdim=True)
        w = torch.where(ids >= 0, w, torch.zeros_like(w))
        f = w2.shape[2]
        out = torch.zeros_like(x)
        for i in range(x.shape[0]):
            for j in range(k):
                ex = int(ids[i, j])
                if ex < 0:
                    continue
                h = w1[ex] @ x[i]
                a = torch.nn.functional.silu(h[:f]) * h[f:]
                out = out.index_add(0, torch.tensor([i]), (w[i, j].to(x.dtype) * (w2[ex] @ a)).unsqueeze(0))
        return out

    def test_moe_layer_forward_backward(self):
        t, h, f, e, k = 24, 16, 8, 4, 2
        for capacity in (0.0, 0.75):
            layer = self.layers.MoeLayer(h, f, e, k, max_tokens=t, capacity_factor=capacity, dtype=torch.float64,
                                         device="cpu")
            self.assertEqual([n for n, _ in layer.named_parameters()], ["gate", "experts.w1", "experts.w2"])
            self.assertEqual(list(layer.state_dict()), ["gate", "expert_bias", "experts.w1", "experts.w2"])
            self.assertEqual((tuple(layer.experts.w1.shape), tuple(layer.experts.w2.shape)), ((e, 2 * f, h), (e, h, f)))
            x = self.randn(t, h).requires_grad_()
            gy = self.randn(t, h)
            y = layer(x)
            y.backward(gy)
            xr = x.detach().clone().requires_grad_()
            gate, w1, w2 = (p.detach().clone().requires_grad_() for p in (layer.gate, layer.experts.w1,
                                                                          layer.experts.w2))
            yr = self.moe_reference(xr, gate, w1, w2, k, capacity)
            yr.backward(gy)
            for name, got, want in (("y", y, yr), ("x", x.grad, xr.grad), ("gate", layer.gate.grad, gate.grad),
                                    ("w1", layer.experts.w1.grad, w1.grad), ("w2", layer.experts.w2.grad, w2.grad)):
                err = float((got - want).norm() / want.norm())
                self.assertLess(err, 1e-5, (capacity, name))
            self.assertGreater(float(layer.gate.grad.norm()), 0)
            # a frozen gate: x still gets the router path's share of its gradient
            layer.gate.requires_grad_(False)
            x.grad = None
            layer(x).backward(gy)
            self.assertLess(float((x.grad - xr.grad).norm() / xr.grad.norm()), 1e-5, capacity)
            layer.gate.requires_grad_(True)
            self.assertEqual(int(layer.last_tokens_per_expert.sum()) + int(layer.last_dropped), t * k)

    def test_balancing_step(self):
        layer = self.layers.MoeLayer(16, 8, 4, 1, max_tokens=32, bias_update_rate=0.01, dtype=torch.float64,
                                     device="cpu")
        layer.eval()
        layer(self.randn(32, 16))
        self.assertEqual(float(layer.tokens_seen.sum()), 0.0)  # eval forwards count nothing
        layer.train()
        layer(self.randn(32, 16))
        layer(self.randn(32, 16))
        seen = layer.tokens_seen.clone()
        self.assertEqual(float(seen.sum()), 64.0)
        bias = layer.update_expert_bias()
        self.assertTrue(torch.equal(bias, 0.01 * torch.sign(seen.mean() - seen)))
        self.assertEqual(float(layer.tokens_seen.sum()), 0.0)

    def test_linears(self):
        cf, layers = self.cf, self.layers
        cf._lib = StubLib(2)
        calls = []
        cf.column_parallel_linear = lambda x, w, b, sequence_parallel, save_gathered: calls.append(
            ("col", x, w, b, sequence_parallel, save_gathered)) or x
        cf.row_parallel_linear = lambda x, w, b, sequence_parallel: calls.append(("row", x, w, b, sequence_parallel)) or x
        col = layers.ColumnParallelLinear(64, 256, bias=True, save_gathered=True, device="cpu")
        row = layers.RowParallelLinear(256, 64, sequence_parallel=False, device="cpu")
        self.assertEqual((tuple(col.weight.shape), tuple(col.bias.shape), col.weight.dtype), ((128, 64), (128,),
                                                                                             torch.bfloat16))
        self.assertEqual((tuple(row.weight.shape), row.bias), ((64, 128), None))
        self.assertLessEqual(float(col.weight.detach().abs().max()), 1 / 8)  # nn.Linear's bound, the whole fan_in
        self.assertLessEqual(float(row.weight.detach().abs().max()), 1 / 16)
        x = torch.zeros(4, 64)
        col(x)
        row(x)
        self.assertEqual(calls, [("col", x, col.weight, col.bias, True, True), ("row", x, row.weight, None, False)])

    def test_errors(self):
        cf, layers = self.cf, self.layers
        cf._lib = StubLib(3)
        cases = [
            (lambda: layers.ColumnParallelLinear(64, 256, device="cpu"),
             "out_features 256 must be a positive multiple of the world size 3 (ColumnParallelLinear splits its "
             "outputs)"),
            (lambda: layers.RowParallelLinear(256, 64, device="cpu"),
             "in_features 256 must be a positive multiple of the world size 3 (RowParallelLinear splits its inputs)"),
            (lambda: layers.MoeLayer(16, 8, 4, 2, 32, device="cpu"),
             "num_experts 4 must be a positive multiple of the world size 3 (each rank holds num_experts / W "
             "experts)"),
        ]
        cf._lib = StubLib(1)
        cases += [
            (lambda: layers.MoeLayer(16, 8, 4, 5, 32, device="cpu"), "topk 5 must be in [1, num_experts 4]"),
            (lambda: layers.MoeExperts(16, 8, 4, 2, 32, backward="fast", device="meta"),
             "backward must be 'unfused' (ccfuse.moe_grad) or 'fused' (ccfuse's MoeFfnBackward), got 'fast'"),
            (lambda: layers.MoeExperts(16, 8, 4, 2, 32, backward="unfused", recompute=False, device="meta"),
             "recompute=False keeps h for backward='fused'; backward='unfused' recomputes it"),
            (lambda: layers.MoeLayer(16, 8, 4, 2, 32, score="relu", device="cpu"),
             "score must be 'softmax' or 'sigmoid', got 'relu'"),
            (lambda: layers.MoeLayer(16, 8, 4, 2, 32, capacity_factor=-1, device="cpu"),
             "capacity_factor -1 must be >= 0 (0: dropless)"),
            (lambda: layers.MoeExperts(16, 8, 4, 2, 32, device="meta").materialize(),
             "MoeExperts: the parameters are on the meta device; move them to a GPU (to_empty, then "
             "reset_parameters) first"),
        ]
        for i, (fn, msg) in enumerate(cases):
            cf._lib = StubLib(3 if i < 3 else 1)
            with self.assertRaises(ValueError) as e:
                fn()
            self.assertEqual(str(e.exception), msg)

    def test_experts_follow_replaced_parameters(self):
        ex = self.layers.MoeExperts(16, 8, 4, 2, 32, dtype=torch.float64, device="meta")
        self.assertIsNone(ex._layer)  # nothing made on the meta device
        ex.to_empty(device="cpu")
        ex.reset_parameters()
        y = ex(self.randn(5, 16), torch.zeros(5, 2, dtype=torch.int32), torch.full((5, 2), 0.5, dtype=torch.float64))
        self.assertEqual(tuple(y.shape), (5, 16))
        first = ex._layer
        self.assertIs(first._w1_src, ex.w1)
        self.assertFalse(first.recompute)  # the default with backward="fused" (keep h); passed through
        ex.w1 = torch.nn.Parameter(ex.w1.detach().clone())
        ex(self.randn(5, 16), torch.zeros(5, 2, dtype=torch.int32), torch.full((5, 2), 0.5, dtype=torch.float64))
        self.assertTrue(first.closed)
        self.assertIs(ex._layer._w1_src, ex.w1)

    # ---- the experts on a group of their own (process_group: EP beside a TP init) ----

    def test_experts_on_their_own_group(self):
        import torch.distributed as dist
        layers = self.layers
        ep, reduced = object(), []
        saved = dist.get_world_size, dist.all_reduce
        dist.get_world_size = lambda group=None: 2 if group is ep else saved[0](group)
        dist.all_reduce = lambda t, group=None: reduced.append((tuple(t.shape), group))
        try:
            moe = layers.MoeLayer(16, 8, 4, 2, 32, bias_update_rate=0.01, dtype=torch.float64, device="cpu",
                                  process_group=ep)
            self.assertEqual(tuple(moe.experts.w1.shape), (2, 16, 16))  # E / W = 4 / 2 over ep's ranks
            self.assertIs(moe.experts._layer.group, ep)  # MoeFfn(group=ep)
            moe.tokens_seen.add_(torch.tensor([3.0, 1.0, 0.0, 4.0]))
            moe.update_expert_bias()
            self.assertEqual(reduced, [((4,), ep)])  # the balancing counts summed over ep, not init()'s group
            with self.assertRaises(ValueError) as e:
                layers.MoeExperts(16, 8, 3, 2, 32, dtype=torch.float64, device="cpu", process_group=ep)
            self.assertEqual(str(e.exception), "num_experts 3 must be a positive multiple of the world size 2 "
                                               "(each rank holds num_experts / W experts)")
            plain = layers.MoeExperts(16, 8, 4, 2, 32, dtype=torch.float64, device="cpu")
            self.assertIsNone(plain._layer.group)  # init()'s Team (W = 1 here)
            self.assertEqual(tuple(plain.w1.shape), (4, 16, 16))
        finally:
            dist.get_world_size, dist.all_reduce = saved

    # ---- the MoeFfn options the layers pass through: wgrad, main_grad, kept_rows ----

    def test_moe_options_reach_moeffn(self):
        layers = self.layers
        default = layers.MoeExperts(16, 8, 4, 2, 32, dtype=torch.float64, device="cpu")
        self.assertEqual(default._layer.options, dict(num_experts=4, topk=2, max_tokens=32, imbalance=0.0,
                                                      backward="fused", recompute=False, wgrad="ccfuse",
                                                      main_grad=False, kept_rows=None))  # MoeFfn's defaults
        ex = layers.MoeExperts(16, 8, 4, 2, 32, imbalance=1.5, wgrad="torch", main_grad=True, kept_rows=40,
                               dtype=torch.float64, device="cpu")
        want = dict(num_experts=4, topk=2, max_tokens=32, imbalance=1.5, backward="fused", recompute=False,
                    wgrad="torch", main_grad=True, kept_rows=40)
        self.assertEqual(ex._layer.options, want)
        self.assertEqual((ex.wgrad, ex.main_grad, ex.kept_rows), ("torch", True, 40))
        # a replaced Parameter makes a new MoeFfn at the next forward: with the same options
        ex.w1 = torch.nn.Parameter(ex.w1.detach().clone())
        ex(self.randn(5, 16), torch.zeros(5, 2, dtype=torch.int32), torch.full((5, 2), 0.5, dtype=torch.float64))
        self.assertIs(ex._layer._w1_src, ex.w1)
        self.assertEqual(ex._layer.options, want)
        # a meta-device build: nothing made until materialize(), which passes them
        meta = layers.MoeExperts(16, 8, 4, 2, 32, wgrad="torch", kept_rows=128, dtype=torch.float64, device="meta")
        self.assertIsNone(meta._layer)
        meta.to_empty(device="cpu")
        meta.reset_parameters()
        meta.materialize()
        self.assertEqual((meta._layer.options["wgrad"], meta._layer.options["main_grad"],
                          meta._layer.options["kept_rows"]), ("torch", False, 128))
        # MoeLayer: through its experts; with backward="unfused" (recompute True) as well
        moe = layers.MoeLayer(16, 8, 4, 2, 32, backward="unfused", wgrad="torch", dtype=torch.float64, device="cpu")
        self.assertEqual(moe.experts._layer.options, dict(num_experts=4, topk=2, max_tokens=32, imbalance=0.0,
                                                          backward="unfused", recompute=True, wgrad="torch",
                                                          main_grad=False, kept_rows=None))
        moe = layers.MoeLayer(16, 8, 4, 2, 32, imbalance=2.0, recompute=False, wgrad="ccfuse", main_grad=True,
                              kept_rows=256, dtype=torch.float64, device="cpu")
        self.assertEqual(moe.experts._layer.options, dict(num_experts=4, topk=2, max_tokens=32, imbalance=2.0,
                                                          backward="fused", recompute=False, wgrad="ccfuse",
                                                          main_grad=True, kept_rows=256))
        y = moe(self.randn(6, 16))  # the stand-in runs: the options change nothing the layer computes itself
        self.assertEqual(tuple(y.shape), (6, 16))

    def test_moe_options_keyword_only(self):
        # keyword-only: dtype and device keep their positions after recompute
        with self.assertRaises(TypeError):
            self.layers.MoeExperts(16, 8, 4, 2, 32, 0.0, "fused", None, torch.float64, "cpu", "torch")
        ex = self.layers.MoeExperts(16, 8, 4, 2, 32, 0.0, "fused", None, torch.float64, "cpu", wgrad="torch")
        self.assertEqual((ex.w1.dtype, ex._layer.options["wgrad"]), (torch.float64, "torch"))

    def test_moe_option_errors(self):
        """Bad options raise torch_ops.MoeFfn's own ValueError (naming the argument and the rule),
        from MoeExperts and MoeLayer alike, a meta-device build at construction too."""
        cf, layers = self.cf, self.layers
        cf.MoeFfn = self.saved[1]  # the real MoeFfn: its option checks run before it needs a GPU
        cases = [
            (dict(wgrad="cublas"), "wgrad",
             "wgrad must be 'torch' (torch._grouped_mm) or 'ccfuse' (the K-grouped GEMM), got 'cublas'"),
            (dict(wgrad=None), "wgrad",
             "wgrad must be 'torch' (torch._grouped_mm) or 'ccfuse' (the K-grouped GEMM), got None"),
            (dict(main_grad=1), "main_grad",
             "main_grad must be True (add the weight gradients into w.main_grad) or False, got 1"),
            (dict(main_grad="yes"), "main_grad",
             "main_grad must be True (add the weight gradients into w.main_grad) or False, got 'yes'"),
            (dict(main_grad=True, backward="unfused"), "main_grad",
             "main_grad=True is built for backward='fused'; backward='unfused' returns the weight gradients"),
            (dict(kept_rows=0), "kept_rows",
             "kept_rows must be a positive int with recompute=False (the rows of the kept h), or None; got 0 with "
             "recompute=False"),
            (dict(kept_rows=-128), "kept_rows",
             "kept_rows must be a positive int with recompute=False (the rows of the kept h), or None; got -128 "
             "with recompute=False"),
            (dict(kept_rows=True), "kept_rows",
             "kept_rows must be a positive int with recompute=False (the rows of the kept h), or None; got True "
             "with recompute=False"),
            (dict(kept_rows=256.0), "kept_rows",
             "kept_rows must be a positive int with recompute=False (the rows of the kept h), or None; got 256.0 "
             "with recompute=False"),
            (dict(kept_rows=256, recompute=True), "kept_rows",
             "kept_rows must be a positive int with recompute=False (the rows of the kept h), or None; got 256 "
             "with recompute=True"),
            (dict(kept_rows=256, backward="unfused"), "kept_rows",  # unfused: recompute None -> True
             "kept_rows must be a positive int with recompute=False (the rows of the kept h), or None; got 256 "
             "with recompute=True"),
        ]
        for kwargs, name, msg in cases:
            self.assertIn(name, msg)
            for build in (lambda: layers.MoeExperts(16, 8, 4, 2, 32, device="cpu", **kwargs),
                          lambda: layers.MoeLayer(16, 8, 4, 2, 32, device="cpu", **kwargs)):
                with self.assertRaises(ValueError) as e:
                    build()
                self.assertEqual(str(e.exception), msg, kwargs)
            with self.assertRaises(ValueError) as e:  # a meta-device build: at construction too
                layers.MoeExperts(16, 8, 4, 2, 32, device="meta", **kwargs)
            self.assertEqual(str(e.exception), msg, kwargs)
        # good options get past MoeFfn's option checks (to its tensor checks: a CPU tensor is refused)
        for kwargs in (dict(), dict(wgrad="torch", main_grad=True, kept_rows=1), dict(recompute=True),
                       dict(backward="unfused", wgrad="torch")):
            with self.assertRaises(ValueError) as e:
                layers.MoeExperts(16, 8, 4, 2, 32, device="cpu", **kwargs)
            self.assertEqual(str(e.exception), "w1 must be a CUDA tensor, got device cpu", kwargs)

    def test_main_grad_setup(self):
        """The setup MoeExperts' docstring gives a Megatron-style caller is what MoeFfn checks at the
        forward and the backward (torch_ops._check_main_grad): on the module's own Parameters."""
        cf = self.cf
        moe = self.layers.MoeLayer(16, 8, 4, 2, 32, main_grad=True, device="cpu")
        ex = moe.experts
        self.assertIs(ex._layer._w1_src, ex.w1)  # what MoeFfn reads main_grad from
        self.assertIs(ex._layer.w2, ex.w2)
        with self.assertRaises(ValueError) as e:
            cf._check_main_grad("w1", ex.w1)
        self.assertEqual(str(e.exception), "w1 has no main_grad: MoeFfn(main_grad=True) adds the weight gradients "
                         "into an fp32 w.main_grad shaped like the weight (Megatron's DDP allocates it)")
        for w in (ex.w1, ex.w2):
            w.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
            w.grad_added_to_main_grad = False
        cf._check_main_grad("w1", ex.w1)
        cf._check_main_grad("w2", ex.w2)
        ex.w2.main_grad = torch.zeros(ex.w2.shape, dtype=torch.bfloat16)  # not fp32
        with self.assertRaises(ValueError) as e:
            cf._check_main_grad("w2", ex.w2)
        self.assertIn("w2.main_grad must be float32", str(e.exception))
        # Megatron's convention for what autograd gets: a dummy and the flag set
        dummy = cf._main_grad_result(ex.w1)
        self.assertTrue(ex.w1.grad_added_to_main_grad)
        self.assertEqual((tuple(dummy.shape), dummy.dtype), (tuple(ex.w1.shape), ex.w1.dtype))

    def test_moe_options_in_repr(self):
        layers = self.layers
        ex = layers.MoeExperts(16, 8, 4, 2, 32, dtype=torch.float64, device="cpu")
        self.assertEqual(ex.extra_repr(), "hidden=16, ffn=8, num_experts=4 (this rank: 4), topk=2, max_tokens=32, "
                         "backward=fused, recompute=False, kept_rows=None, wgrad=ccfuse, main_grad=False")
        moe = layers.MoeLayer(16, 8, 4, 2, 32, wgrad="torch", main_grad=True, kept_rows=256, dtype=torch.float64,
                              device="cpu")
        self.assertIn("recompute=False, kept_rows=256, wgrad=torch, main_grad=True", moe.experts.extra_repr())
        self.assertIn("(experts): MoeExperts(hidden=16, ffn=8, num_experts=4 (this rank: 4), topk=2, max_tokens=32, "
                      "backward=fused, recompute=False, kept_rows=256, wgrad=torch, main_grad=True)", repr(moe))
        meta = layers.MoeExperts(16, 8, 4, 2, 32, backward="unfused", wgrad="torch", device="meta")
        self.assertIn("backward=unfused, recompute=True, kept_rows=None, wgrad=torch, main_grad=False",
                      meta.extra_repr())


if __name__ == "__main__":
    unittest.main()
