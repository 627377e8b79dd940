"""The expert-parallel SwiGLU MoE FFN's backward, recomputed and unfused (torch only).

ccfuse's fused forward (torch_ops.MoeFfn) keeps nothing for the backward; this module recomputes
what the backward needs from the forward's inputs and the incoming gradient, with plain torch
collectives and grouped GEMMs. Correct first: the fused backward (the forward's two layers with
dispatch and combine swapped, docs/moe-layers.md "The backward pass") will replace it.

Per rank (W ranks, E experts, E_local = E / W contiguous per rank), for this rank's tokens:
  x [T, H], topk_ids [T, k] int (-1 = dropped), topk_w [T, k] float32, g = d loss / d out [T, H],
  w1 [E_local, 2F, H] (per expert the gate rows, then the up rows: Linear weights), w2 [E_local, H, F].
The forward: out_t = sum over kept slots j of p_j * (silu(x_t W1g^T) * (x_t W1u^T)) W2^T.
Steps of backward() (one host sync: the row counts of the all-to-all):
  1. every kept (token, slot) goes to its expert's owner with x_t, g_t, its local expert and p_j
     (one all-to-all of rows, one of two floats per row);
  2. the owner sorts them by expert and recomputes h = x W1^T (gate and up), a = silu(gate) * up;
  3. u = g W2 (the gradient at a before the router weight), d p = <u, a>, d a = p u,
     d h = SwiGLU'(h, d a); d x rows = d h W1; d W1 = d h^T x, d W2 = (p g)^T a, per expert;
  4. d x rows and d p go back to the tokens' owners (the reverse all-to-all), which sum d x over
     the slots of each token (fp32).
Exchange objects carry the rows (rank, world_size, rows(tensors, send_counts)): DistExchange over
torch.distributed, or any object with the same methods (the tests simulate W ranks with threads).
"""
import torch


class LocalExchange:
    """W = 1: every row stays."""
    rank, world_size = 0, 1

    def rows(self, tensors, send_counts):
        return list(tensors), [int(send_counts.sum())]


class DistExchange:
    """All-to-all over torch.distributed's default group (the ranks of ccfuse's Team)."""

    def __init__(self, group=None):
        import torch.distributed as dist
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def rows(self, tensors, send_counts):
        """tensors: each [n, ...] ordered by destination rank, send_counts [W] (rows per
        destination). Returns the received tensors, ordered by source rank, and the counts per
        source (host ints)."""
        send_counts = send_counts.to(torch.int64)
        recv_counts = torch.empty_like(send_counts)
        self.dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()  # the one host sync
        out = []
        for t in tensors:
            r = t.new_empty((sum(recv),) + tuple(t.shape[1:]))
            self.dist.all_to_all_single(r, t.contiguous(), recv, send, group=self.group)
            out.append(r)
        return out, recv


def torch_gmm(a, b, counts, b_is_weight):
    """Per group g, its rows of a @ b[g] (b [G, K, N]) or a @ b[g]^T (b_is_weight, b [G, N, K])."""
    if a.shape[0] == 0:
        return a.new_empty((0, b.shape[1] if b_is_weight else b.shape[2]))
    offs = torch.cumsum(counts.to(torch.int32), 0, dtype=torch.int32)
    return torch._grouped_mm(a, b.transpose(-2, -1) if b_is_weight else b, offs=offs)


def torch_gmm_wgrad(a, b, counts):
    """Per group g: a_g^T @ b_g ([G, a's columns, b's columns]; zeros for an empty group)."""
    if a.shape[0] == 0:
        return a.new_zeros((counts.shape[0], a.shape[1], b.shape[1]))
    offs = torch.cumsum(counts.to(torch.int32), 0, dtype=torch.int32)
    return torch._grouped_mm(a.t(), b, offs=offs)


def backward(x, topk_ids, topk_w, g, w1, w2, num_experts, exchange=None, gmm=torch_gmm,
             gmm_wgrad=torch_gmm_wgrad):
    """Returns (d x [T, H] in x's dtype, d topk_w [T, k] float32 (0 for dropped slots),
    d w1 [E_local, 2F, H], d w2 [E_local, H, F]). gmm / gmm_wgrad: the grouped GEMMs (see
    torch_gmm; torch_ops passes ccfuse's grouped kernel for the row-split ones on GPUs)."""
    exchange = exchange or LocalExchange()
    t, k = topk_ids.shape
    e_local, two_f, h = w1.shape
    f = two_f // 2
    if e_local * exchange.world_size != num_experts:
        raise ValueError("w1 holds %d experts, but num_experts %d / world size %d = %s" % (
            e_local, num_experts, exchange.world_size, num_experts / exchange.world_size))
    dev = x.device
    ids = topk_ids.reshape(-1).to(torch.int64)
    slot = torch.nonzero(ids >= 0).squeeze(1)  # flat t * k + j of the kept slots
    order = torch.argsort(ids[slot], stable=True)
    slot = slot[order]
    expert = ids[slot]
    tok = torch.div(slot, k, rounding_mode="floor")
    send_counts = torch.bincount(torch.div(expert, e_local, rounding_mode="floor"), minlength=exchange.world_size)
    meta = torch.stack([(expert % e_local).to(torch.float32), topk_w.reshape(-1)[slot].to(torch.float32)], 1)
    (rows, rmeta), recv_counts = exchange.rows([torch.cat([x[tok], g.to(x.dtype)[tok]], 1), meta], send_counts)

    # the owner: rows by local expert (stable: inside an expert by source rank, then send order)
    le = rmeta[:, 0].to(torch.int64)
    perm = torch.argsort(le, stable=True)
    counts = torch.bincount(le, minlength=e_local).to(torch.int32)
    xr, gr, pr = rows[perm, :h], rows[perm, h:], rmeta[perm, 1]
    hr = gmm(xr, w1, counts, True)  # [n, 2F]: gate, up
    gate, up = hr[:, :f].float(), hr[:, f:].float()
    sig = torch.sigmoid(gate)
    silu = gate * sig
    a = (silu * up).to(x.dtype)  # as the forward rounds it between the layers
    u = gmm(gr, w2, counts, False).float()  # [n, F] = g W2 per expert (w2 [E, H, F] read as [K, N])
    dp = (u * a.float()).sum(1)
    da = u * pr[:, None]
    dh = torch.cat([da * up * sig * (1 + gate * (1 - sig)), da * silu], 1).to(x.dtype)
    dxr = gmm(dh, w1, counts, False)  # [n, H] = d h W1 per expert (w1 [E, 2F, H] read as [K, N])
    dw1 = gmm_wgrad(dh, xr, counts)  # [E, 2F, H]
    dw2 = gmm_wgrad((gr.float() * pr[:, None]).to(x.dtype), a, counts)  # [E, H, F]

    # back to the tokens' owners, in the order the rows came (the reverse all-to-all)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=dev)
    (bx, bp), _ = exchange.rows([dxr[inv], dp[inv][:, None]],
                                torch.tensor(recv_counts, dtype=torch.int64, device=dev))
    dx = torch.zeros((t, h), dtype=torch.float32, device=dev).index_add_(0, tok, bx.float()).to(x.dtype)
    dw = torch.zeros(t * k, dtype=torch.float32, device=dev)
    dw[slot] = bp[:, 0]
    return dx, dw.view(t, k), dw1.to(w1.dtype), dw2.to(w2.dtype)


def reference_forward(x, topk_ids, topk_w, w1, w2, rank, e_local):
    """The FFN for the slots whose experts rank owns (w1, w2: that rank's experts), in x's dtype
    throughout, differentiable by torch autograd: the tests' reference (run it in float64, and sum
    over the ranks' partial outputs)."""
    f = w2.shape[2]
    out = torch.zeros_like(x)
    for j in range(topk_ids.shape[1]):
        for e in range(e_local):
            sel = torch.nonzero(topk_ids[:, j] == rank * e_local + e).squeeze(1)
            if sel.numel() == 0:
                continue
            hr = x[sel] @ w1[e].t()
            a = torch.nn.functional.silu(hr[:, :f]) * hr[:, f:]
            out = out.index_add(0, sel, topk_w[sel, j:j + 1].to(x.dtype) * (a @ w2[e].t()))
    return out
