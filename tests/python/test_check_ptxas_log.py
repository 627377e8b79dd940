"""tools/check_ptxas_log.sh: the build guard against ptxas serializing wgmma (C7515)."""
import os
import subprocess
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "tools", "check_ptxas_log.sh")


def run_on(text):
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        return subprocess.run(["bash", SCRIPT, path], capture_output=True, text=True, timeout=30)
    finally:
        os.unlink(path)


class CheckPtxasLog(unittest.TestCase):
    def test_clean_log_passes(self):
        r = run_on("[1/2] Building CUDA object src/gemm/gemm.cu.o\n"
                   "ptxas info    : Used 168 registers\n[2/2] Linking CXX executable ccfuse\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")

    def test_serialized_wgmma_fails_and_names_the_kernel(self):
        r = run_on("[1/2] Building CUDA object src/gemm/gemm.cu.o\n"
                   "ptxas /tmp/x.ptx, line 9; warning : Advisory: (C7515) Potential Performance Loss: "
                   "wgmma.mma_async instructions are serialized due to non wgmma instructions defining "
                   "accumulator registers of a wgmma between start and end of the pipeline stage in the "
                   "function '_Z11gemm_kernelIiEvv'\n")
        self.assertEqual(r.returncode, 3)
        self.assertIn("C7515", r.stderr)
        self.assertIn("_Z11gemm_kernelIiEvv", r.stderr)

    def test_missing_argument_is_an_error(self):
        r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("usage", r.stderr)


if __name__ == "__main__":
    unittest.main()
