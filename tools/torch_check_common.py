"""The start and end that the torchrun GPU checks share (tools/torch_*_check.py): one process per
GPU, torch.distributed over NCCL, ccfuse's Team; every record's common fields (meta); the relative
error they compare with (rel); at the end every rank's records into one JSONL file (rank 0
writes), the failures summed over the ranks, the Team and the group torn down, and the exit code
(1 if any rank failed a case)."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist


def start(cf, ccfuse_lib):
    """-> (rank, world size, this rank's device); cf is ccfuse.torch_ops."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    cf.init(ccfuse_lib)
    return dist.get_rank(), dist.get_world_size(), torch.device("cuda", local)


def meta(tool, dev, **extra):
    """The fields every record of a check carries: tool, GPU, world size and rank, date (UTC),
    the staged binaries' commit (CCFUSE_COMMIT, tools/gpu_env.sh), torch's version; then extra."""
    return {"tool": tool, "gpu": torch.cuda.get_device_name(dev), "world_size": dist.get_world_size(),
            "rank": dist.get_rank(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": os.environ.get("CCFUSE_COMMIT", "unknown"), "torch": torch.__version__, **extra}


def rel(got, ref):
    """||got - ref|| / ||ref|| in fp64; inf where the shapes differ or got holds a NaN or an inf
    (so that no tolerance passes it)."""
    got, ref = got.detach().double(), ref.detach().double()
    if got.shape != ref.shape or not bool(torch.isfinite(got).all()):
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def finish(cf, tool, records, failures, json_path, dev):
    r, w = dist.get_rank(), dist.get_world_size()
    if json_path:
        gathered = [None] * w
        dist.all_gather_object(gathered, records)
        if r == 0:
            with open(json_path, "a") as f:
                for recs in gathered:
                    for rec in recs:
                        f.write(json.dumps(rec, default=str) + "\n")
    total = torch.tensor([failures], device=dev)
    dist.all_reduce(total)
    cf.finalize()
    dist.destroy_process_group()
    if r == 0:
        print("%s: %d failing case(s) over %d rank(s)" % (tool, int(total.item()), w))
    sys.exit(1 if total.item() else 0)
