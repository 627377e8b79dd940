"""ccfuse from Python.

ccfuse._capi      ctypes binding of the C ABI (libccfuse_c.so): device pointers and streams, no torch
ccfuse.torch_ops  the fused TP ops and the MoE FFN on torch tensors (import it where torch exists)
ccfuse.moe_grad   the MoE FFN's recomputed, unfused backward (torch only; torch_ops.MoeFfn uses it)
ccfuse.layers     torch.nn modules: Megatron's parallel linears, the MoE experts and layer (router + experts)

One process per GPU under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
docs/c-api.md. This package imports no torch by itself.
"""
from ._capi import Ccfuse, CcfuseError, MoeFfn as MoeFfnHandle, MoeFfnBackward as MoeFfnBackwardHandle, TpOp  # noqa: F401

__all__ = ["Ccfuse", "CcfuseError", "MoeFfnHandle", "MoeFfnBackwardHandle", "TpOp"]
