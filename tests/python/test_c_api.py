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
        self.expect_error('lib.tp_create("ag_gemm", 8, 8, 8)', "no Team: call ccfuse_init_from_env() or ccfuse_init_from_comm() first")
        self.expect_error("lib.world_size()", "no Team: call ccfuse_init_from_env() or ccfuse_init_from_comm() first")
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
        self.expect_error("lib.init_from_comm(None)", "nccl_comm must be a valid ncclComm_t, got null")

    def test_moe_entry_points(self):
        self.expect_error("lib.moe_ffn_create(64, 256, 128, 8, 2)", "no Team: call ccfuse_init_from_env() or ccfuse_init_from_comm() first")
        self.expect_error("lib._check(lib._dll.ccfuse_moe_ffn_create(64, 256, 128, 8, 2, 1, 2, 0.0, "
                          "ccfuse_ctypes.ctypes.byref(ccfuse_ctypes.ctypes.c_void_p())))",
                          "b_kn 2 must be 0 (weights [.., N, K]) or 1 ([.., K, N])")
        self.expect_error("ccfuse_ctypes.MoeFfn(lib, None).run(0, 0, 0, 0, 0, 0, 0, 0)",
                          "ffn must be a handle from ccfuse_moe_ffn_create, got null")
        self.expect_error("lib.moe_ffn_backward_create(64, 256, 128, 8, 2)",
                          "no Team: call ccfuse_init_from_env() or ccfuse_init_from_comm() first")
        self.expect_error("lib._check(lib._dll.ccfuse_moe_ffn_backward_create(64, 256, 128, 8, 2, 1, 0, 2, 0.0, "
                          "ccfuse_ctypes.ctypes.byref(ccfuse_ctypes.ctypes.c_void_p())))",
                          "w1_swiglu_tiles 2 must be 0 (gate rows, then up rows) or 1 (ccfuse_swiglu_permutation order)")
        self.expect_error("ccfuse_ctypes.MoeFfnBackward(lib, None).run(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)",
                          "bwd must be a handle from ccfuse_moe_ffn_backward_create, got null")
        self.expect_error("ccfuse_ctypes.MoeFfnBackward(lib, None).operands()",
                          "bwd must be a handle from ccfuse_moe_ffn_backward_create, got null")
        self.expect_error("lib.swiglu_permutation(100)", "ffn 100 must be a positive multiple of 128 (SwiGLU tiles)")
        # the permutation itself: per 256-row tile, 128 gate rows then the 128 matching up rows
        r = self.run_child("p = lib.swiglu_permutation(256)\nprint(p[0], p[127], p[128], p[255], p[256], p[384], len(p))\n")
        self.assertEqual(r.stdout.split(), ["0", "127", "256", "383", "128", "384", "512"], r.stderr)

    def test_team_entry_points(self):
        # further Teams (ccfuse_team_create_from_comm) and the _on create functions: their checks
        # come before any NCCL call; a null team means the process's Team, with its error
        v = "ccfuse_ctypes.ctypes.byref(ccfuse_ctypes.ctypes.c_void_p())"
        self.expect_error("lib.team_from_comm(None)", "nccl_comm must be a valid ncclComm_t, got null")
        self.expect_error("lib._check(lib._dll.ccfuse_team_create_from_comm(1, None))", "out must not be null")
        self.expect_error("lib._check(lib._dll.ccfuse_team_world_size(None, %s))" % v.replace("c_void_p", "c_int"),
                          "team must be a handle from ccfuse_team_create_from_comm, got null")
        self.expect_error("lib._check(lib._dll.ccfuse_tp_create_on(None, b'ag_gemm', 8, 8, 8, 1, 0, %s))" % v,
                          "no Team: call ccfuse_init_from_env() or ccfuse_init_from_comm() first")
        self.expect_error("lib._check(lib._dll.ccfuse_tp_create_on(None, b'gemm', 8, 8, 8, 1, 0, %s))" % v,
                          "op 'gemm' is not a fused TP op (ag_gemm, gemm_rs, gemm_ar)")
        self.expect_error("lib._check(lib._dll.ccfuse_moe_ffn_create_on(None, 64, 256, 128, 8, 2, 1, 0, 0.0, %s))" % v,
                          "no Team: call ccfuse_init_from_env() or ccfuse_init_from_comm() first")
        self.expect_error("lib._check(lib._dll.ccfuse_moe_ffn_create_on(None, 64, 256, 128, 8, 2, 3, 0, 0.0, %s))" % v,
                          "swiglu 3 must be 0 or 1")
        self.expect_error("lib._check(lib._dll.ccfuse_moe_ffn_backward_create_on(None, 64, 256, 128, 8, 2, 1, 0, 0, "
                          "0.0, %s))" % v, "no Team: call ccfuse_init_from_env() or ccfuse_init_from_comm() first")
        r = self.run_child("lib._check(lib._dll.ccfuse_team_destroy(None))\nprint('ok')\n")
        self.assertEqual(r.stdout.strip(), "ok", r.stderr)
        # the Python side: team= must be one of this library's open Teams
        self.expect_error("lib.moe_ffn_create(64, 256, 128, 8, 2, team=object())",
                          "team must be a Team from this library's team_from_comm (or None), got object")
        self.expect_error("lib.tp_create('ag_gemm', 8, 8, 8, team=ccfuse_ctypes.Team(lib, None))",
                          "team was closed: make its ops on an open Team")
        self.expect_error("ccfuse_ctypes.Team(lib, None).world_size()", "this Team was closed")

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
        # the K-grouped form (weight gradients): c [G, m, n]; m and n are the output's, rows the contraction
        self.expect_error("lib.kgrouped_gemm(0, 64, 64, 64, 1, 1, 1, 1, 1, 0)", "num_groups 0 must be at least 1")
        self.expect_error("lib.kgrouped_gemm(4, 64, 100, 64, 1, 1, 1, 1, 1, 0)",
                          "m 100 must be a multiple of 8 for bf16 (TMA needs 16-byte aligned rows of A [rows, m])")
        self.expect_error("lib.kgrouped_gemm(4, 0, 64, 64, 1, 1, 1, 1, 1, 0)",
                          "max_rows 0 must be positive (the bound on the rows of all groups)")
        self.expect_error("lib.kgrouped_gemm(4, 64, 64, 64, 1, 1, 1, 0, 1, 0)", "group_rows must not be null")
        self.expect_error("lib.kgrouped_gemm(4, 64, 64, 64, 1, 1, 1, 1, 0, 0)", "workspace must not be null")
        # ... and its accumulating form (c fp32 +=): the same checks, through its own entry point
        self.expect_error("lib.kgrouped_gemm(0, 64, 64, 64, 1, 1, 1, 1, 1, 0, accumulate=True)",
                          "num_groups 0 must be at least 1")
        self.expect_error("lib.kgrouped_gemm(4, 64, 64, 64, 1, 1, 0, 1, 1, 0, accumulate=True)", "c must not be null")
        self.expect_error("lib.kgrouped_gemm(4, 64, 64, 36, 1, 1, 1, 1, 1, 0, accumulate=True)",
                          "n 36 must be a multiple of 8 for bf16 (TMA needs 16-byte aligned rows of B [rows, n] and C)")
        self.expect_error("lib._check(lib._dll.ccfuse_kgrouped_gemm_accumulate(4, 64, 64, 64, 2, 1, 1, 1, 1, 1, None))",
                          "dtype 2 must be 0 (bf16) or 1 (fp16)")
        r = self.run_child("print(lib.grouped_gemm_workspace_bytes(8) >= 8 * 4)\n")
        self.assertEqual(r.stdout.strip(), "True", r.stderr)

    def test_router_entry_points(self):
        # the GPU router needs no Team; RouterConfig's validation (moe::validate, route_gpu's own
        # limits) comes before any CUDA call. Capacity configs that can bind query CUB for the
        # workspace size (a CUDA device), so only dropless or non-binding ones succeed here.
        ws = "lib.route_workspace_bytes"
        self.expect_error(ws + "(8, 9, 16)", "topk 9 must not exceed num_experts 8")
        self.expect_error(ws + "(8, 0, 16)", "topk 0 must be at least 1")
        self.expect_error(ws + "(0, 1, 16)", "num_experts 0 must be at least 1")
        self.expect_error(ws + "(10, 2, 16, world_size=4)", "num_experts 10 is not divisible by world_size 4")
        self.expect_error(ws + "(8, 2, 16, world_size=0)", "world_size 0 must be at least 1")
        self.expect_error(ws + "(8, 2, 16, capacity_factor=-1.0)", "capacity_factor -1 must be >= 0 (0 = dropless)")
        self.expect_error(ws + "(8, 2, 16, capacity_factor=-0.5, drop='probability')",
                          "capacity_factor -0.5 must be >= 0 (0 = dropless)")
        self.expect_error(ws + "(8, 2, 16, capacity_factor=float('nan'))",
                          "capacity_factor nan must be >= 0 (0 = dropless)")
        self.expect_error(ws + "(8, 2, 16, capacity_factor=float('inf'))", "capacity_factor inf must be finite")
        self.expect_error(ws + "(2048, 2, 16)", "num_experts 2048 exceeds the GPU router's limit of 1024")
        self.expect_error(ws + "(8, 2, -1)", "num_tokens -1 must be >= 0")
        self.expect_error(ws + "(8, 2, 2**31)", "num_tokens * topk = 2147483648 * 2 exceeds INT32_MAX")
        # bad strings: the binding's own check, naming the argument and the allowed values
        self.expect_error(ws + "(8, 2, 16, score='softmx')", "score 'softmx' must be one of softmax, sigmoid")
        self.expect_error(ws + "(8, 2, 16, drop='capacity')", "drop 'capacity' must be one of position, probability")
        self.expect_error("lib.route(8, 2, 1, 16, None, 1, 1, 1, 1, None, None, score='relu')",
                          "score 'relu' must be one of softmax, sigmoid")
        self.expect_error("lib.route(8, 2, 1, 16, None, 1, 1, 1, 1, None, None, drop=1)",
                          "drop 1 must be one of position, probability")
        # bad codes through the raw ABI: the library names the argument and the allowed values
        raw_ws = ("lib._check(lib._dll.ccfuse_moe_route_workspace_bytes(8, 2, %d, %d, 0.0, %d, 1, 16, "
                  "ccfuse_ctypes.ctypes.byref(ccfuse_ctypes.ctypes.c_int64())))")
        self.expect_error(raw_ws % (2, 1, 0), "score 2 must be 0 (softmax) or 1 (sigmoid)")
        self.expect_error(raw_ws % (0, 2, 0), "normalize 2 must be 0 or 1")
        self.expect_error(raw_ws % (0, 1, 3), "drop 3 must be 0 (by position) or 1 (by probability)")
        self.expect_error(raw_ws % (-1, 1, 0), "score -1 must be 0 (softmax) or 1 (sigmoid)")
        self.expect_error("lib._check(lib._dll.ccfuse_moe_route_workspace_bytes(8, 2, 0, 1, 0.0, 0, 1, 16, None))",
                          "bytes must not be null")
        raw_route = ("lib._check(lib._dll.ccfuse_moe_route(8, 2, %d, 1, 0.0, %d, 1, 1, 16, None, 1, 1, 1, 1, None, "
                     "None))")
        self.expect_error(raw_route % (2, 0), "score 2 must be 0 (softmax) or 1 (sigmoid)")
        self.expect_error(raw_route % (1, 2), "drop 2 must be 0 (by position) or 1 (by probability)")
        # route: the config's errors, then its pointers (dropless: no workspace, no CUDA call yet)
        route = "lib.route(%s, None, None%s)"
        self.expect_error(route % ("8, 9, 1, 16, None, 1, 1, 1, 1", ""), "topk 9 must not exceed num_experts 8")
        self.expect_error(route % ("12, 2, 1, 16, None, 1, 1, 1, 1", ", world_size=8"),
                          "num_experts 12 is not divisible by world_size 8")
        self.expect_error(route % ("8, 2, 1, 16, None, 1, 1, 1, 1", ", capacity_factor=-2.0"),
                          "capacity_factor -2 must be >= 0 (0 = dropless)")
        self.expect_error(route % ("8, 2, 1, 16, None, 1, 1, 0, 1", ""), "tokens_per_expert must not be null")
        self.expect_error(route % ("8, 2, 1, 16, None, 1, 1, 1, 0", ""), "dropped must not be null")
        self.expect_error(route % ("8, 2, 0, 16, None, 1, 1, 1, 1", ""), "logits must not be null")
        self.expect_error(route % ("8, 2, 1, 16, None, 0, 1, 1, 1", ""), "topk_ids must not be null")
        self.expect_error(route % ("8, 2, 1, 16, None, 1, 0, 1, 1", ""), "topk_weights must not be null")
        # workspace sizes that need no device: dropless, a capacity that cannot bind (ceil(100 * 16 *
        # 2 / 8) >= 16 tokens), no tokens
        r = self.run_child("print(lib.route_workspace_bytes(8, 2, 1024), lib.route_workspace_bytes(256, 8, 4096, "
                           "score='sigmoid', normalize=False, world_size=8), "
                           "lib.route_workspace_bytes(8, 2, 16, capacity_factor=100.0), "
                           "lib.route_workspace_bytes(8, 2, 0, capacity_factor=1.0, drop='probability'))\n")
        self.assertEqual(r.stdout.split(), ["0", "0", "0", "0"], r.stderr)

    def test_finalize_without_team_is_fine(self):
        r = self.run_child("lib.finalize()\nprint('ok')\n")
        self.assertEqual(r.stdout.strip(), "ok", r.stderr)


if __name__ == "__main__":
    unittest.main()
