"""What ccfuse.torch_ops relies on in a real PyTorch (>= 2.8), checked on the CPU so that a torch
upgrade that renames it fails here, not on a GPU run: ProcessGroup._get_backend and
ProcessGroupNCCL._comm_ptr (init(process_group=...) borrows the NCCL communicator through them),
torch._grouped_mm's 2d x 2d form with rows past the last offset ignored (the weight gradients of
the fused MoE backward read ccfuse's max_rows buffers), and init(process_group=) on a machine
without a GPU raising ValueError rather than crashing. Skipped without a real torch
(tools/torch_cpu_env.sh installs one; tools/test.sh runs this file with it)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
try:
    import torch
    HAVE_TORCH = hasattr(torch, "_grouped_mm") and hasattr(torch, "randn")
except ImportError:
    HAVE_TORCH = False


@unittest.skipUnless(HAVE_TORCH, "needs torch >= 2.8; tools/torch_cpu_env.sh installs one")
class TorchApi(unittest.TestCase):
    def test_process_group_nccl_internals(self):
        import torch.distributed as dist
        self.assertTrue(hasattr(dist.ProcessGroup, "_get_backend"))
        from torch._C._distributed_c10d import ProcessGroupNCCL
        self.assertTrue(hasattr(ProcessGroupNCCL, "_comm_ptr"))

    def test_grouped_mm_k_split_ignores_rows_past_the_last_offset(self):
        gen = torch.Generator().manual_seed(3)
        a = torch.randn(48, 16, generator=gen).to(torch.bfloat16)
        b = torch.randn(48, 24, generator=gen).to(torch.bfloat16)
        offs = torch.tensor([8, 8, 32], dtype=torch.int32)  # group 1 empty, rows 32..47 past the end
        got = torch._grouped_mm(a.t(), b, offs=offs).float()
        self.assertEqual(tuple(got.shape), (3, 16, 24))
        want = [a[:8].float().t() @ b[:8].float(), torch.zeros(16, 24), a[8:32].float().t() @ b[8:32].float()]
        for g in range(3):
            err = float((got[g] - want[g]).norm() / max(float(want[g].norm()), 1e-30)) if g != 1 else float(got[1].abs().max())
            self.assertLess(err, 1e-2, "group %d" % g)

    def test_init_on_a_group_without_a_gpu(self):
        import tempfile
        import torch.distributed as dist
        if torch.cuda.is_available():
            self.skipTest("a GPU is present: this checks the no-GPU error")
        lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "libccfuse_c.so")
        if not os.path.exists(lib):
            self.skipTest("libccfuse_c.so not built")
        from ccfuse import torch_ops as cf
        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "store"), rank=0, world_size=1)
            try:
                with self.assertRaises(ValueError) as e:
                    cf.init(lib, process_group=dist.group.WORLD)
                self.assertEqual(str(e.exception), "process_group: no CUDA device here (ccfuse's Team lives on a GPU)")
                self.assertIsNone(cf._lib)
            finally:
                dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main()
