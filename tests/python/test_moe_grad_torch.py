"""ccfuse.moe_grad (the MoE FFN's recomputed backward) against torch autograd of an fp64 reference,
on the CPU, W ranks simulated by threads. Needs a real torch (>= 2.8, torch._grouped_mm on the
CPU); skipped without one (tools/test.sh installs one for CI: tools/torch_cpu_env.sh)."""
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
try:
    import torch
    HAVE_TORCH = hasattr(torch, "_grouped_mm") and hasattr(torch, "randn")
except ImportError:
    HAVE_TORCH = False
if HAVE_TORCH:
    from ccfuse import moe_grad


class ThreadExchange:
    """One rank's view of an all-to-all among W threads (a shared mailbox and a barrier)."""

    def __init__(self, rank, world, shared):
        self.rank, self.world_size, self.shared = rank, world, shared

    def rows(self, tensors, send_counts):
        counts = send_counts.tolist()
        box, barrier = self.shared["box"], self.shared["barrier"]
        for dst in range(self.world_size):
            lo = sum(counts[:dst])
            box[(self.rank, dst)] = [t[lo:lo + counts[dst]].clone() for t in tensors]
        barrier.wait()
        got = [box[(src, self.rank)] for src in range(self.world_size)]
        barrier.wait()  # everyone has read its rows before the next exchange writes
        return [torch.cat([g[i] for g in got], 0) for i in range(len(tensors))], [g[0].shape[0] for g in got]


def run_ranks(world, fn):
    shared = {"box": {}, "barrier": threading.Barrier(world)}
    results, errors = [None] * world, []

    def body(r):
        try:
            results[r] = fn(r, ThreadExchange(r, world, shared))
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            shared["barrier"].abort()
    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


def rel(got, ref):
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


@unittest.skipUnless(HAVE_TORCH, "needs torch >= 2.8 (torch._grouped_mm); tools/torch_cpu_env.sh installs one")
class MoeGradTest(unittest.TestCase):
    def check(self, world, experts, topk, tokens, h=64, f=32, routing="uniform", drop=0.0, seed=0):
        gen = torch.Generator().manual_seed(seed)
        e_local = experts // world
        xs, ids, ws, gs = [], [], [], []
        for r in range(world):
            t = tokens[r]
            xs.append(torch.randn(t, h, generator=gen).to(torch.bfloat16))
            if routing == "uniform":
                i = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(t)]) if t else \
                    torch.zeros(0, topk, dtype=torch.int64)
            elif routing == "one_expert":  # every token's first slot on expert 1, the rest elsewhere
                i = torch.stack([torch.cat([torch.tensor([1]), 2 + torch.randperm(experts - 2, generator=gen)[:topk - 1]])
                                 for _ in range(t)]) if t else torch.zeros(0, topk, dtype=torch.int64)
            else:
                raise ValueError(routing)
            if drop:
                i[torch.rand(i.shape, generator=gen) < drop] = -1
            ids.append(i.to(torch.int32))
            ws.append(torch.rand(t, topk, generator=gen))
            gs.append(torch.randn(t, h, generator=gen).to(torch.bfloat16))
        w1 = [(torch.randn(e_local, 2 * f, h, generator=gen) * h ** -0.5).to(torch.bfloat16) for _ in range(world)]
        w2 = [(torch.randn(e_local, h, f, generator=gen) * f ** -0.5).to(torch.bfloat16) for _ in range(world)]

        got = run_ranks(world, lambda r, ex: moe_grad.backward(xs[r], ids[r], ws[r], gs[r], w1[r], w2[r], experts, ex))

        # fp64 reference: each rank's output sums every owner's experts; loss = sum_r <out_r, g_r>
        X = [x.double().requires_grad_() for x in xs]
        P = [w.double().requires_grad_() for w in ws]
        W1 = [w.double().requires_grad_() for w in w1]
        W2 = [w.double().requires_grad_() for w in w2]
        loss = 0
        for r in range(world):
            out = sum(moe_grad.reference_forward(X[r], ids[r], P[r], W1[o], W2[o], o, e_local) for o in range(world))
            loss = loss + (out * gs[r].double()).sum()
        loss.backward()
        for r in range(world):
            dx, dw, dw1, dw2 = got[r]
            self.assertEqual(tuple(dx.shape), tuple(xs[r].shape))
            self.assertEqual(dx.dtype, torch.bfloat16)
            self.assertEqual(tuple(dw.shape), tuple(ws[r].shape))
            if tokens[r]:
                self.assertLess(rel(dx, X[r].grad), 2e-2, "dx rank %d" % r)
                self.assertLess(rel(dw, P[r].grad), 2e-2, "d topk_w rank %d" % r)
                dropped = ids[r] < 0
                self.assertTrue(bool((dw[dropped] == 0).all()), "dropped slots get no weight gradient")
            self.assertLess(rel(dw1, W1[r].grad), 2e-2, "d w1 rank %d" % r)
            self.assertLess(rel(dw2, W2[r].grad), 2e-2, "d w2 rank %d" % r)
            for e in range(e_local):  # an expert no row reached: exactly zero gradient
                if not any(bool((ids[s] == r * e_local + e).any()) for s in range(world)):
                    self.assertEqual(float(dw1[e].abs().max()), 0.0)
                    self.assertEqual(float(dw2[e].abs().max()), 0.0)
        return got

    def test_one_rank(self):
        self.check(1, 4, 2, [24])

    def test_two_ranks_ragged_tokens(self):
        self.check(2, 8, 2, [24, 9], seed=1)

    def test_two_ranks_top8_drops(self):
        self.check(2, 16, 8, [16, 24], drop=0.3, seed=2)

    def test_top1_and_a_rank_without_tokens(self):
        self.check(2, 4, 1, [0, 40], seed=3)

    def test_all_tokens_on_one_expert_others_empty(self):
        self.check(2, 8, 2, [32, 16], routing="one_expert", seed=4)

    def test_four_ranks(self):
        self.check(4, 8, 3, [8, 16, 0, 24], drop=0.2, seed=5)

    def test_wrong_expert_count(self):
        x = torch.zeros(4, 64, dtype=torch.bfloat16)
        with self.assertRaisesRegex(ValueError, "num_experts"):
            moe_grad.backward(x, torch.zeros(4, 2, dtype=torch.int32), torch.zeros(4, 2), x,
                              torch.zeros(2, 64, 64, dtype=torch.bfloat16), torch.zeros(2, 64, 32, dtype=torch.bfloat16), 6)


if __name__ == "__main__":
    unittest.main()
