"""MoeFfn(backward="fused") under torch.compile, traced on the CPU with fake CUDA tensors (no GPU,
no kernel runs): dynamo keeps the forward as torch.ops.ccfuse.moe_ffn and the backward as
torch.ops.ccfuse.moe_ffn_backward in one graph (fullgraph=True); the backward op's fake
implementation gives the gradients' shapes and runs the layer's checks; backward="unfused" (whose
all-to-all sizes sync with the host) refuses to be compiled with a gradient. The real run on GPUs
is tools/torch_compile_check.py's moe_train cases. Skipped without a real torch
(tools/torch_cpu_env.sh installs one; tools/test.sh runs this file with it)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
try:
    import torch
    HAVE_TORCH = hasattr(torch, "compile") and hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:
    HAVE_TORCH = False

E, H, F, K, T = 8, 256, 128, 2, 64


class StubLib:
    """What MoeFfn's constructor asks of the C ABI; no kernel entry points (a run would fail)."""

    def world_size(self):
        return 1

    def swiglu_permutation(self, f):
        return list(range(2 * f))

    def moe_ffn_create(self, *args, **kw):
        class Layer:
            def max_rows(self):
                return T * K

            def close(self):
                pass
        return Layer()


@unittest.skipUnless(HAVE_TORCH, "needs torch >= 2.4; tools/torch_cpu_env.sh installs one")
class MoeCompile(unittest.TestCase):
    def setUp(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from ccfuse import torch_ops as cf
        self.cf, self.saved_lib = cf, cf._lib
        cf._lib = StubLib()
        self.mode = FakeTensorMode()
        self.mode.__enter__()
        torch._dynamo.reset()

    def tearDown(self):
        self.mode.__exit__(None, None, None)
        self.cf._lib = self.saved_lib
        torch._dynamo.reset()

    def tensors(self):
        def bf16(*shape, grad=False):
            return torch.empty(*shape, dtype=torch.bfloat16, device="cuda", requires_grad=grad)
        ids = torch.zeros(T, K, dtype=torch.int32, device="cuda")
        tw = torch.empty(T, K, dtype=torch.float32, device="cuda", requires_grad=True)
        return bf16(E, 2 * F, H, grad=True), bf16(E, H, F, grad=True), bf16(T, H, grad=True), ids, tw

    def test_fused_backward_traces_into_one_graph(self):
        w1, w2, x, ids, tw = self.tensors()
        moe = self.cf.MoeFfn(w1, w2, num_experts=E, topk=K, max_tokens=T, backward="fused", recompute=True)
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        y = torch.compile(lambda x, ids, tw: moe(x, ids, tw) * 2, fullgraph=True, backend=backend)(x, ids, tw)
        self.assertEqual(tuple(y.shape), (T, H))
        self.assertEqual(len(graphs), 1)
        found = {}

        def walk(gm, path):
            for node in gm.graph.nodes:
                if node.op == "call_function" and str(node.target).startswith("ccfuse."):
                    found[str(node.target)] = path
            for name, sub in gm.named_children():
                walk(sub, name)
        walk(graphs[0], "")
        self.assertEqual(set(found), {"ccfuse.moe_ffn", "ccfuse.moe_ffn_backward"})
        self.assertIn("fwd", found["ccfuse.moe_ffn"])
        self.assertIn("bwd", found["ccfuse.moe_ffn_backward"])
        moe.close()

    def test_kept_h_traces_into_one_graph(self):
        # recompute=False: the forward op returns (y, h), and h [max_rows, 2F] reaches the backward op
        w1, w2, x, ids, tw = self.tensors()
        moe = self.cf.MoeFfn(w1, w2, num_experts=E, topk=K, max_tokens=T, recompute=False)
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        y = torch.compile(lambda x, ids, tw: moe(x, ids, tw) * 2, fullgraph=True, backend=backend)(x, ids, tw)
        self.assertEqual((tuple(y.shape), len(graphs)), ((T, H), 1))
        nodes = {}

        def walk(gm):
            for node in gm.graph.nodes:
                if node.op == "call_function" and str(node.target).startswith("ccfuse."):
                    nodes[str(node.target)] = node
            for _, sub in gm.named_children():
                walk(sub)
        walk(graphs[0])
        self.assertEqual(set(nodes), {"ccfuse.moe_ffn_keep", "ccfuse.moe_ffn_backward"})
        h = nodes["ccfuse.moe_ffn_backward"].args[-1]
        self.assertIsNotNone(h)
        val = h.meta.get("val", h.meta.get("example_value"))
        self.assertEqual(tuple(val.shape), (T * K, 2 * F))
        moe.close()

    def test_moe_layer_traces_into_one_graph(self):
        # ccfuse.layers.MoeLayer, training with the balancing count: gate, router op, router_weights,
        # the experts' forward and fused backward ops, the buffer's update, in one graph
        from ccfuse import layers
        layer = layers.MoeLayer(H, F, E, K, max_tokens=T, bias_update_rate=1e-3, device="cuda")
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        x = torch.empty(T, H, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        y = torch.compile(layer, fullgraph=True, backend=backend)(x)
        self.assertEqual((tuple(y.shape), len(graphs)), ((T, H), 1))
        targets = set()

        def walk(gm):
            targets.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
            for _, sub in gm.named_children():
                walk(sub)
        walk(graphs[0])
        # the experts keep h by default (recompute=None -> False with the fused backward)
        self.assertTrue({"ccfuse.route", "ccfuse.moe_ffn_keep", "ccfuse.moe_ffn_backward"} <= targets, targets)
        layer.experts.close()

    def test_backward_op_fake_shapes_and_checks(self):
        w1, w2, x, ids, tw = self.tensors()
        moe = self.cf.MoeFfn(w1, w2, num_experts=E, topk=K, max_tokens=T, backward="fused", recompute=True)
        g = torch.empty(T, H, dtype=torch.bfloat16, device="cuda")
        dx, dw, dw1, dw2 = torch.ops.ccfuse.moe_ffn_backward(x, ids, tw, g, w1, w2, moe._key, None)
        self.assertEqual([(tuple(t.shape), t.dtype) for t in (dx, dw, dw1, dw2)],
                         [((T, H), torch.bfloat16), ((T, K), torch.float32), ((E, 2 * F, H), torch.bfloat16),
                          ((E, H, F), torch.bfloat16)])
        with self.assertRaises(ValueError) as e:
            torch.ops.ccfuse.moe_ffn_backward(x, ids, tw, g[:, :128].contiguous(), w1, w2, moe._key, None)
        self.assertEqual(str(e.exception), "g (the output's gradient) must be [64, 256] like x, got (64, 128)")
        moe.close()
        with self.assertRaises(ValueError) as e:
            torch.ops.ccfuse.moe_ffn_backward(x, ids, tw, g, w1, w2, moe._key, None)
        self.assertEqual(str(e.exception), "no MoeFfn with handle %s (closed?)" % moe._key)

    def test_unfused_backward_refuses_compile(self):
        w1, w2, x, ids, tw = self.tensors()
        moe = self.cf.MoeFfn(w1, w2, num_experts=E, topk=K, max_tokens=T, backward="unfused")
        with self.assertRaises(Exception) as e:
            torch.compile(lambda x, ids, tw: moe(x, ids, tw), fullgraph=True, backend="eager")(x, ids, tw)
        self.assertIn("MoeFfn(backward='unfused') runs in eager mode only", str(e.exception))
        moe.close()


if __name__ == "__main__":
    unittest.main()
