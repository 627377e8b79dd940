"""ccfuse_moe_ffn_bench --print-config: the MoE tuner's choice per case, on any machine (no GPU is
touched). Skipped where the CUDA targets were not built."""
import os
import subprocess
import unittest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "build", "ccfuse_moe_ffn_bench")


@unittest.skipUnless(os.path.exists(BENCH), "ccfuse_moe_ffn_bench not built (no CUDA toolkit)")
class MoePrintConfig(unittest.TestCase):
    def run_bench(self, *args, env=None):
        e = {k: v for k, v in os.environ.items() if not k.startswith("CCFUSE_MOE_")}
        e.update(env or {})
        return subprocess.run([BENCH, "--print-config", *args], capture_output=True, text=True, timeout=120, env=e)

    def test_choices_per_case(self):
        r = self.run_bench("--model", "qwen3", "--tokens", "4096", "16384", "--world-size", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        configs = [l.split("=", 1)[1] for l in r.stdout.splitlines() if l.startswith("moe_config=")]
        self.assertEqual(len(configs), 4)  # 4096 uniform, 4096 zipf, 16384 uniform, 16384 zipf
        orders = [c.split("send_order=")[1].split()[0] for c in configs]
        # Qwen3's 4 KB rows take the striped dispatch (16 rows a round, measured 2026-11-30), which
        # sends interleaved whatever the routing's skew.
        self.assertEqual(orders, ["interleaved"] * 4)
        self.assertTrue(all("l0_dispatch=striped(16 rows)" in c and "l0_order=expert" in c for c in configs))
        self.assertTrue(all("combine=presum" in c and "n_c=0" in c and "unit_rows=128" in c for c in configs))
        whys = [l for l in r.stdout.splitlines() if l.startswith("moe_why=")]
        self.assertIn("layer 0 dispatch striped: rows of 4096 >= 4096 bytes", whys[1])

    def test_environment_overrides_and_errors(self):
        r = self.run_bench("--model", "mixtral", "--tokens", "4096", "--routing", "uniform",
                           env={"CCFUSE_MOE_SEND_ORDER": "interleave", "CCFUSE_MOE_COMBINE": "perslot"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("combine=per-slot send_order=interleaved", r.stdout)
        self.assertIn("[send order set by CCFUSE_MOE_SEND_ORDER]", r.stdout)
        r = self.run_bench("--model", "mixtral", "--tokens", "4096", env={"CCFUSE_MOE_SEND_ORDER": "sideways"})
        self.assertEqual(r.returncode, 2)
        self.assertIn("CCFUSE_MOE_SEND_ORDER 'sideways' must be interleave or owner", r.stderr)
        r = self.run_bench("--model", "mixtral", "--world-size", "3")
        self.assertEqual(r.returncode, 2)
        self.assertIn("num_experts 8 is not divisible by the world size 3", r.stderr)


if __name__ == "__main__":
    unittest.main()
