"""tools/torch_check_common.rel, the relative error every torchrun GPU check compares against its
tolerance: it must never let a NaN, an inf or a wrong shape pass. Needs a real torch (CPU is
enough); skipped without one (tools/test.sh installs one for CI: tools/torch_cpu_env.sh)."""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
try:
    import torch
    HAVE_TORCH = hasattr(torch, "randn") and hasattr(torch, "distributed")
except ImportError:
    HAVE_TORCH = False
if HAVE_TORCH:
    import torch_check_common as common


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class RelTest(unittest.TestCase):
    def test_equal_is_zero_and_a_known_difference_is_its_ratio(self):
        ref = torch.tensor([3.0, 4.0])
        self.assertEqual(common.rel(ref.clone(), ref), 0.0)
        self.assertAlmostEqual(common.rel(torch.tensor([3.0, 4.5]), ref), 0.1, places=12)  # 0.5 / 5

    def test_bf16_input_is_compared_in_fp64(self):
        ref = torch.randn(64, 32, generator=torch.Generator().manual_seed(3))
        err = common.rel(ref.to(torch.bfloat16), ref)
        self.assertGreater(err, 0.0)
        self.assertLess(err, 1e-2)

    def test_non_finite_or_misshaped_results_never_pass(self):
        ref = torch.ones(4, 4)
        for bad in (float("nan"), float("inf"), -float("inf")):
            got = torch.ones(4, 4)
            got[1, 2] = bad
            self.assertTrue(math.isinf(common.rel(got, ref)), bad)
        self.assertTrue(math.isinf(common.rel(torch.ones(4, 3), ref)))
        self.assertTrue(math.isinf(common.rel(torch.ones(16), ref)))


if __name__ == "__main__":
    unittest.main()
