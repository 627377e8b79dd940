"""tools/torch_moe_layer_bench.py (the serial MoE-layer baseline): its torch-free parts (arguments,
cases, Zipf probabilities, the pure-Python routing twin, split sizes, records) always; where torch
is installed, also the routing against its twin and the whole layer on CPU (gloo, 1 and 2 ranks,
a small custom shape, both dispatch modes) against the fp64 reference.
Run: python3 -m unittest discover -s tests/python"""
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "torch_moe_layer_bench.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
_torch_loaded_before = "torch" in sys.modules
import torch_moe_layer_bench as mb  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None


class ImportTest(unittest.TestCase):
    def test_import_needs_no_torch_and_keeps_multicast_off(self):
        if not _torch_loaded_before:
            self.assertNotIn("torch", sys.modules)
        self.assertEqual(os.environ.get("NCCL_NVLS_ENABLE"), "0")


class ZipfTest(unittest.TestCase):
    def test_probabilities(self):
        self.assertEqual(mb.zipf_probs(4, "uniform"), [0.25] * 4)
        p = mb.zipf_probs(2)
        self.assertAlmostEqual(p[0], 1.0 / (1.0 + 2 ** -1.2), places=12)
        self.assertAlmostEqual(p[0], 0.6967305, places=6)
        self.assertAlmostEqual(p[1], 0.3032695, places=6)
        p = mb.zipf_probs(256)
        self.assertAlmostEqual(sum(p), 1.0, places=12)
        self.assertEqual(p, sorted(p, reverse=True))
        self.assertAlmostEqual(p[0] / p[9], 10 ** 1.2, places=9)
        with self.assertRaises(ValueError):
            mb.zipf_probs(0)
        with self.assertRaises(ValueError):
            mb.zipf_probs(8, "one_hot")

    def test_softmax_and_topk(self):
        top, w = mb.topk_softmax([0.0, 2.0, 1.0, 2.0], 3)
        self.assertEqual(top, [1, 3, 2])  # tie: lower index first
        e = math.e
        self.assertAlmostEqual(w[0], e / (2 * e + 1))
        self.assertAlmostEqual(w[2], 1 / (2 * e + 1))


class RoutingTest(unittest.TestCase):
    def test_distinct_normalised(self):
        ids, w = mb.route_python(random.Random(5), 300, 16, 4, "zipf")
        self.assertEqual(len(ids), 300)
        for row, ws in zip(ids, w):
            self.assertEqual(len(set(row)), 4)
            self.assertTrue(all(0 <= e < 16 for e in row))
            self.assertAlmostEqual(sum(ws), 1.0)
            self.assertEqual(ws, sorted(ws, reverse=True))
        self.assertEqual(sum(mb.expert_counts(ids, 16)), 1200)

    def test_top1_follows_the_probabilities(self):
        n = 20000
        for routing in ("uniform", "zipf"):
            ids, _ = mb.route_python(random.Random(11), n, 8, 1, routing)
            counts = mb.expert_counts(ids, 8)
            for c, p in zip(counts, mb.zipf_probs(8, routing)):
                self.assertLess(abs(c / n - p), 0.015, (routing, counts))

    def test_zipf_is_skewed_uniform_is_not(self):
        ids, _ = mb.route_python(random.Random(3), 2000, 8, 2, "zipf")
        z = mb.expert_counts(ids, 8)
        ids, _ = mb.route_python(random.Random(3), 2000, 8, 2, "uniform")
        u = mb.expert_counts(ids, 8)
        self.assertGreater(z[0], 3 * z[7])
        self.assertGreater(z[0], 0.3 * 2000)  # expert 0 is in about 2/3 of the tokens' top-2
        self.assertLess(max(u) - min(u), 0.2 * 500)
        # EP = 2: the first rank's half of the experts gets most of the zipf rows
        first, second = mb.rank_splits(z, 2)
        self.assertGreater(first, 2 * second)
        self.assertEqual(first + second, 4000)

    def test_bad_topk(self):
        with self.assertRaises(ValueError):
            mb.route_python(random.Random(1), 1, 4, 5, "uniform")


class SplitTest(unittest.TestCase):
    def test_local_experts(self):
        self.assertEqual(mb.local_experts(256, 2, 0), (0, 128))
        self.assertEqual(mb.local_experts(256, 2, 1), (128, 256))
        self.assertEqual(mb.local_experts(8, 4, 3), (6, 8))
        with self.assertRaises(ValueError):
            mb.local_experts(8, 3, 0)

    def test_rank_splits_and_offsets(self):
        self.assertEqual(mb.rank_splits([1, 2, 3, 4, 5, 6, 7, 8], 2), [10, 26])
        self.assertEqual(mb.rank_splits([1, 2, 3, 4, 5, 6, 7, 8], 4), [3, 7, 11, 15])
        # received from (source 0: experts 0..2), (source 1: experts 0..2)
        self.assertEqual(mb.group_offsets([1, 2, 3, 4, 0, 6], 2), ([5, 2, 9], [5, 7, 16]))
        self.assertEqual(mb.group_offsets([0, 0], 2), ([0], [0]))
        with self.assertRaises(ValueError):
            mb.rank_splits([1, 2, 3], 2)

    def test_flops(self):
        # Mixtral, 16384 rows: 2 * rows * 3 * H * F
        self.assertEqual(mb.gemm_flops(16384, 4096, 14336), 2.0 * 16384 * 3 * 4096 * 14336)
        self.assertAlmostEqual(mb.gemm_flops(16384, 4096, 14336) / 1e12, 5.772436045824, places=9)


class ArgsTest(unittest.TestCase):
    def test_defaults_and_cases(self):
        a = mb.parse_args(["--json", "x.jsonl"])
        self.assertEqual([m[0] for m in a.model], ["mixtral", "qwen3", "deepseek"])
        self.assertEqual(a.tokens, [4096, 8192, 16384])
        self.assertEqual((a.routing, a.dispatch, a.iters, a.warmup, a.sample), (["uniform", "zipf"],
                         ["alltoall", "allgather"], 20, 5, 64))
        cs = mb.cases(a)
        self.assertEqual(len(cs), 36)
        self.assertEqual(cs[0], dict(model="mixtral", hidden=4096, experts=8, topk=2, ffn=14336, tokens=4096,
                                     routing="uniform", dispatch="alltoall"))
        self.assertEqual(cs[-1], dict(model="deepseek", hidden=7168, experts=256, topk=8, ffn=2048, tokens=16384,
                                      routing="zipf", dispatch="allgather"))
        self.assertEqual(len({tuple(sorted(c.items())) for c in cs}), 36)

    def test_choices(self):
        a = mb.parse_args(["--json", "o", "--model", "dsv3", "t:64,8,2,96", "--tokens", "8192", "--routing", "zipf",
                           "--dispatch", "allgather", "--iters", "3", "--warmup", "0"])
        self.assertEqual(a.model, [("deepseek", (7168, 256, 8, 2048)), ("t", (64, 8, 2, 96))])
        cs = mb.cases(a)
        self.assertEqual([(c["model"], c["tokens"], c["routing"], c["dispatch"]) for c in cs],
                         [("deepseek", 8192, "zipf", "allgather"), ("t", 8192, "zipf", "allgather")])
        with open(os.devnull, "w") as devnull, mock.patch("sys.stderr", devnull):
            for bad in (["--model", "llama"], ["--model", "t:1,2,3,4"], ["--routing", "one_hot"],
                        ["--dispatch", "p2p"], ["--tokens", "0"], ["--iters", "0"]):
                with self.assertRaises(SystemExit, msg=bad):
                    mb.parse_args(["--json", "o"] + bad)
            with self.assertRaises(SystemExit):
                mb.parse_args([])


class RecordTest(unittest.TestCase):
    CASE = dict(model="mixtral", hidden=4096, experts=8, topk=2, ffn=14336, tokens=8192, routing="zipf",
                dispatch="alltoall")

    def test_fields(self):
        times = dict(t_serial=11.152, t_gemm=9.748, t_comm=0.612, t_dispatch=0.283, t_combine=0.329)
        r = mb.build_record(self.CASE, 2, "NVIDIA H200", "abc1234", "2026-11-30T00:00:00Z", times, 3e-3,
                            "torch._grouped_mm", [16384, 16384], "n", torch="2.11.0")
        for key in ("op", "world_size", "m", "n", "k", "dtype", "gpu", "commit", "date", "t_fused_ms", "t_serial_ms",
                    "t_gemm_ms", "t_comm_ms", "t_limit_ms", "t_peer_ms", "rel_err", "experts", "topk",
                    "tokens_per_rank", "routing"):
            self.assertIn(key, r)
        self.assertEqual((r["op"], r["world_size"], r["m"], r["n"], r["k"], r["dtype"]),
                         ("moe_layer_serial", 2, 8192, 4096, 14336, "bf16"))
        self.assertIsNone(r["t_fused_ms"])
        self.assertIsNone(r["t_peer_ms"])
        self.assertEqual(r["t_limit_ms"], 9.748)
        self.assertEqual((r["t_dispatch_ms"], r["t_combine_ms"]), (0.283, 0.329))
        self.assertAlmostEqual(r["tflops_gemm"], 5.772436045824e12 / 9.748e9, places=6)  # 592.2 (DESIGN: 592)
        self.assertAlmostEqual(r["tflops_gemm"], 592.17, places=2)
        self.assertEqual((r["check"], r["grouped_mm"], r["dispatch"], r["torch"]),
                         ("PASS", "torch._grouped_mm", "alltoall", "2.11.0"))
        self.assertEqual(json.loads(json.dumps(r)), r)
        line = mb.format_line(r)
        self.assertIn("mixtral", line)
        self.assertIn("dispatch 0.283", line)

    def test_limit_and_failure(self):
        times = dict(t_serial=2.0, t_gemm=0.5, t_comm=0.9)
        r = mb.build_record(self.CASE, 2, "g", "c", "d", times, 0.5, "matmul-loop", [0, 0], "n")
        self.assertEqual(r["t_limit_ms"], 0.9)
        self.assertEqual(r["check"], "FAIL")
        self.assertEqual(r["tflops_gemm"], 0.0)

    def test_commit_falls_back_to_env(self):
        with mock.patch.object(mb.subprocess, "run", side_effect=OSError("no git")), \
                mock.patch.dict(os.environ, {"CCFUSE_COMMIT": "feed123"}):
            self.assertEqual(mb.git_commit(), "feed123")
        with mock.patch.object(mb.subprocess, "run", side_effect=OSError("no git")), \
                mock.patch.dict(os.environ, {"CCFUSE_COMMIT": ""}):
            self.assertEqual(mb.git_commit(), "unknown")


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchTest(unittest.TestCase):
    def test_route_matches_the_twin(self):
        import torch
        rng = random.Random(9)
        rows = [[rng.gauss(0, 1) for _ in range(12)] for _ in range(50)]
        ids, w = mb.route_torch(torch, torch.tensor(rows, dtype=torch.float32), 3)
        for i, row in enumerate(rows):
            top, ws = mb.topk_softmax(row, 3)
            self.assertEqual(ids[i].tolist(), top)
            for a, b in zip(w[i].tolist(), ws):
                self.assertAlmostEqual(a, b, places=5)

    def _run(self, nproc, extra):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "o.jsonl")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-port", str(29500 + random.Random().randrange(2000)), SCRIPT, "--json", out,
                   "--device", "cpu", "--iters", "2", "--warmup", "1"] + extra
            env = dict(os.environ, OMP_NUM_THREADS="1")
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
            with open(out) as f:
                return [json.loads(line) for line in f]

    def test_layer_two_ranks_cpu(self):
        recs = self._run(2, ["--model", "t:64,8,2,96", "u:48,4,3,80", "--tokens", "100", "37",
                             "--sample", "40"])
        self.assertEqual(len(recs), 2 * 2 * 2 * 2)
        for r in recs:
            self.assertEqual(r["check"], "PASS", r)
            self.assertLess(r["rel_err"], 1e-2)
            self.assertEqual(r["world_size"], 2)
            self.assertEqual(len(r["rows_per_rank"]), 2)
            if r["dispatch"] == "alltoall":
                self.assertEqual(sum(r["rows_per_rank"]), 2 * r["tokens_per_rank"] * r["topk"])
                self.assertIn("t_dispatch_ms", r)
            else:
                self.assertIn("t_reduce_scatter_ms", r)
            self.assertEqual(r["t_limit_ms"], max(r["t_gemm_ms"], r["t_comm_ms"]))
        zipf = [r for r in recs if r["routing"] == "zipf" and r["model"] == "t"]
        self.assertTrue(all(r["rows_per_rank"][0] > r["rows_per_rank"][1] for r in zipf))

    def test_layer_one_rank_cpu(self):
        recs = self._run(1, ["--model", "t:32,4,2,48", "--tokens", "20", "--routing", "zipf"])
        self.assertEqual([r["dispatch"] for r in recs], ["alltoall", "allgather"])
        for r in recs:
            self.assertEqual(r["check"], "PASS", r)
            self.assertEqual(r["rows_per_rank"], [40])


if __name__ == "__main__":
    unittest.main()
