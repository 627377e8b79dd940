"""The C ABI through ctypes (python/ccfuse/_capi.py) on any machine: the errors that come before
any GPU work. Skipped where libccfuse_c.so was not built (no CUDA toolkit). The GPU path runs in
tools/torch_async_tp_bench.py --ccfuse-lib, checked against PyTorch async-TP's output."""
import os
import subprocess
import sys
import unittest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
LIB = os.path.join(ROOT, "build", "libccfuse_c.so")

from ccfuse import _capi as ccfuse_ctypes  # noqa: E402


@unittest.skipUnless(os.path.exists(LIB), "libccfuse_c.so not built (no CUDA toolkit)")
class CApi(unittest.TestCase):
    def run_child(self, code):
        # A child process: the library keeps a process-wide Team, and the launcher variables
        # must be absent.
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        prog = ("import sys; sys.path.insert(0, %r)\nfrom ccfuse import _capi as ccfuse_ctypes\n"
                "lib = ccfuse_ctypes.Ccfuse(%r)\n" % (os.path.join(ROOT, "python"), LIB)) + code
        return subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)

    def expect_error(self, call, message):
        r = self.run_child("try:\n    %s\n    print('no error')\nexcept ccfuse_ctypes.CcfuseError as e:\n"
                           "    print('error:', e)\n" % call)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "error: " + message)

    def test_errors_name_the_argument_and_the_rule(self):
        self.expect_error('lib.tp_create("gemm", 8, 8, 8)',
                          "op 'gemm' is not a fused TP op (ag_gemm, gemm_rs, gemm_ar)")
        self.expect_error('lib.tp_create("ag_gemm", 8, 8, 8)', "no Team: call ccfuse_init_from_env() first")
        self.expect_error("lib.world_size()", "no Team: call ccfuse_init_from_env() first")
        self.expect_error("lib.init_from_env()", "environment variable RANK is not set: launch with torchrun, "
                                                 "srun or mpirun, or use Team::create")
        self.expect_error("ccfuse_ctypes.TpOp(lib, None, 'ag_gemm').run(0, 0, 0, 0)",
                          "op must be a handle from ccfuse_tp_create, got null")
        self.expect_error('lib._check(lib._dll.ccfuse_tp_create(b"ag_gemm", 8, 8, 8, 2, None))', "out must not be null")
        self.expect_error('lib.tp_create("ag_gemm", 8, 8, 8, dtype="fp32")', "dtype 'fp32' must be one of bf16, fp16")
        self.expect_error('lib._check(lib._dll.ccfuse_tp_create_typed(b"ag_gemm", 8, 8, 8, 1, 2, '
                          'ccfuse_ctypes.ctypes.byref(ccfuse_ctypes.ctypes.c_void_p())))',
                          "dtype 2 must be 0 (bf16) or 1 (fp16)")
        self.expect_error("ccfuse_ctypes.TpOp(lib, None, 'ag_gemm').gathered()",
                          "op must be a handle from ccfuse_tp_create, got null")
        self.expect_error("lib._check(lib._dll.ccfuse_tp_gathered(None, None))", "out must not be null")

    def test_moe_entry_points(self):
        self.expect_error("lib.moe_ffn_create(64, 256, 128, 8, 2)", "no Team: call ccfuse_init_from_env() first")
        self.expect_error("lib._check(lib._dll.ccfuse_moe_ffn_create(64, 256, 128, 8, 2, 1, 2, 0.0, "
                          "ccfuse_ctypes.ctypes.byref(ccfuse_ctypes.ctypes.c_void_p())))",
                          "b_kn 2 must be 0 (weights [.., N, K]) or 1 ([.., K, N])")
        self.expect_error("ccfuse_ctypes.MoeFfn(lib, None).run(0, 0, 0, 0, 0, 0, 0, 0)",
                          "ffn must be a handle from ccfuse_moe_ffn_create, got null")
        self.expect_error("lib.swiglu_permutation(100)", "ffn 100 must be a positive multiple of 128 (SwiGLU tiles)")
        # the permutation itself: per 256-row tile, 128 gate rows then the 128 matching up rows
        r = self.run_child("p = lib.swiglu_permutation(256)\nprint(p[0], p[127], p[128], p[255], p[256], p[384], len(p))\n")
        self.assertEqual(r.stdout.split(), ["0", "127", "256", "383", "128", "384", "512"], r.stderr)

    def test_gemm_entry_points(self):
        # single-GPU GEMMs need no Team; their argument checks come before any CUDA call
        self.expect_error("lib.gemm(0, 8, 8, 1, 1, 1, 0)", "m, n and k (0, 8, 8) must be positive")
        self.expect_error("lib.gemm(8, 8, 8, 0, 1, 1, 0)", "a must not be null")
        self.expect_error("lib.gemm(8, 8, 8, 1, 1, 1, 0, dtype='fp32')", "dtype 'fp32' must be one of bf16, fp16")
        self.expect_error("lib._check(lib._dll.ccfuse_gemm(8, 8, 8, 2, 0, None, None, None, None, None))",
                          "dtype 2 must be 0 (bf16) or 1 (fp16)")
        self.expect_error("lib._check(lib._dll.ccfuse_gemm(8, 8, 8, 0, 3, None, None, None, None, None))",
                          "b_kn 3 must be 0 (B is [n, k]) or 1 (B is [k, n])")
        self.expect_error("lib.gemm_workspace_bytes(8, 0, 8)", "m, n and k (8, 0, 8) must be positive")
        self.expect_error("lib.grouped_gemm_workspace_bytes(0)", "num_groups 0 must be positive")
        self.expect_error("lib.grouped_gemm(0, 64, 64, 64, 1, 1, 1, 1, 1, 0)", "num_groups 0 must be positive")
        self.expect_error("lib.grouped_gemm(4, 64, 0, 64, 1, 1, 1, 1, 1, 0)",
                          "max_rows, n and k (64, 0, 64) must be positive")
        self.expect_error("lib.grouped_gemm(4, 64, 64, 64, 1, 1, 1, 0, 1, 0)", "group_rows must not be null")
        self.expect_error("lib.grouped_gemm(4, 64, 64, 64, 1, 1, 1, 1, 0, 0)", "workspace must not be null")
        r = self.run_child("print(lib.grouped_gemm_workspace_bytes(8) >= 8 * 4)\n")
        self.assertEqual(r.stdout.strip(), "True", r.stderr)

    def test_finalize_without_team_is_fine(self):
        r = self.run_child("lib.finalize()\nprint('ok')\n")
        self.assertEqual(r.stdout.strip(), "ok", r.stderr)


if __name__ == "__main__":
    unittest.main()
