/* ccfuse/c_api.h: a C ABI over the fused tensor-parallel ops, for Python (ctypes) and other
 * languages. One process per GPU, launched by torchrun or any launcher that sets RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (the Team bootstraps on MASTER_PORT + 1,
 * or CCFUSE_BOOTSTRAP_PORT). Pointers are device pointers (e.g. torch's tensor.data_ptr()) and the
 * stream a cudaStream_t (torch.cuda.current_stream().cuda_stream); nothing synchronises the host.
 *
 *   ccfuse_init_from_env()                        the process's Team (collective, once)
 *   ccfuse_init_from_comm(nccl_comm)              or: the Team around the caller's ncclComm_t
 *                                                 (e.g. torch's process group's; collective)
 *   ccfuse_tp_create("ag_gemm", m, n, k, 1, &op)  a fused op for one shape (collective)
 *   ccfuse_tp_run(op, a, b, c, stream)            one call (collective, in stream order)
 *   ccfuse_tp_destroy(op); ccfuse_finalize()      collective, before the launcher's teardown
 *
 * More Teams, one per further NCCL communicator (e.g. the tensor-parallel ops on the TP group's,
 * the MoE FFN on the expert-parallel group's; added 2026-12-07):
 *   ccfuse_team_create_from_comm(nccl_comm, &team)             collective over that communicator
 *   ccfuse_tp_create_on(team, "gemm_rs", m, n, k, 1, 0, &op)    (and ccfuse_moe_ffn_create_on,
 *                                                               ccfuse_moe_ffn_backward_create_on)
 *   ccfuse_team_destroy(team)                                   collective
 * A null team in the _on functions means the process's Team (ccfuse_init_*): ccfuse_tp_create_typed
 * (op, ...) is ccfuse_tp_create_on(NULL, op, ...). Every op holds its Team: a Team freed by
 * ccfuse_finalize or ccfuse_team_destroy while its ops live is released when the last of them is
 * destroyed (destroy ops first, in the same order on every rank: releasing a Team is collective).
 *
 * Shapes follow the `ccfuse` tool: m is the global M and k the global K. ag_gemm: a = A_r
 * [m/W, k], c = [m, n]; gemm_rs: a = A_r [m, k/W], c = this rank's rows [m/W, n]; gemm_ar:
 * a = A_r [m, k/W], c = [m, n]. b is B_r: [k', n] row-major with b_kn = 1 (a torch [K, N]
 * tensor), [n, k'] with b_kn = 0 (a torch Linear weight), k' = k (ag_gemm) or k/W. bf16
 * (ccfuse_tp_create) or bf16 / fp16 (ccfuse_tp_create_typed). ag_gemm's gathered A:
 * ccfuse_tp_gathered(op, &ptr) (for the weight gradient).
 *
 * The expert-parallel MoE FFN (ccfuse/moe/moe_ffn.h; E experts, rank r owns E/W of them):
 *   ccfuse_moe_ffn_create(max_tokens, H, F, E, topk, swiglu, b_kn, imbalance, &ffn)  (collective)
 *   ccfuse_moe_ffn_run(ffn, x, T, topk_ids, topk_w, w1, w2, out, stream)            (collective)
 * x [T, H] bf16, topk_ids [T, topk] int32 (-1 = dropped), topk_w [T, topk] float, out [T, H] bf16;
 * w1 [E/W, 2F, H] (b_kn = 0, Linear weights) or [E/W, H, 2F] with its 2F gate/up rows (columns)
 * in ccfuse_swiglu_permutation order (with swiglu; [.., F, H] / [.., H, F] without), w2 [E/W, H,
 * F] (b_kn = 0) or [E/W, F, H]. imbalance: the routing skew the MoE tuner is given (most rows a
 * rank receives / the mean, e.g. from the previous step; 0 = unknown), see docs/moe-tuner.md.
 * ccfuse_swiglu_permutation(F, perm): perm[i] (2F entries) = the row of [gate rows | up rows]
 * that becomes row i of w1.
 *
 * Single-GPU GEMMs on the current device (the engine of ccfuse/gemm/gemm.h with its own choice of
 * config; no Team needed). dtype 0 = bf16, 1 = fp16; inputs and outputs in that dtype, fp32
 * accumulation; pointers 16-byte aligned, rows contiguous (leading dimensions = the row lengths).
 *   ccfuse_gemm_workspace_bytes(m, n, k, dtype, b_kn, &bytes)  0 unless the engine splits K
 *   ccfuse_gemm(m, n, k, dtype, b_kn, a, b, c, workspace, stream)  c [m, n] = a [m, k] @ b, b [k, n]
 *                                                          (b_kn = 1) or [n, k] (b_kn = 0)
 * workspace: that many bytes of device memory (16-byte aligned, used in stream order), or null for
 * the library's own per-device buffers, which calls on concurrent streams must not share.
 *   ccfuse_grouped_gemm_workspace_bytes(num_groups, &bytes)
 *   ccfuse_grouped_gemm(G, max_rows, n, k, dtype, b_kn, a, b, c, group_rows, workspace, stream)
 * The grouped form (MoE experts): group_rows = G int32 counts in device memory (read on the device:
 * no host sync, CUDA-graph capturable); group g's rows [off_g, off_g + rows_g) of c [max_rows, n]
 * = the same rows of a [max_rows, k] @ b[g], b [G, k, n] (b_kn = 1) or [G, n, k] (b_kn = 0);
 * off_g is the prefix sum of the counts. Rows past the counts' total are not written; rows past
 * max_rows are dropped. workspace: device memory of ccfuse_grouped_gemm_workspace_bytes bytes,
 * 16-byte aligned, used in stream order (one per concurrently running call).
 *   ccfuse_kgrouped_gemm(G, max_rows, m, n, dtype, a, b, c, group_rows, workspace, stream)
 * The K-grouped form (the experts' weight gradients): c[g] [m, n] = a_g^T @ b_g, a_g and b_g being
 * group g's rows [off_g, off_g + rows_g) of a [max_rows, m] and b [max_rows, n]; c [G, m, n] (zeros
 * for a group without rows); torch._grouped_mm(a.t(), b, offs=cumsum(rows)) computes the same.
 * m and n multiples of 8; workspace as for ccfuse_grouped_gemm (ccfuse_grouped_gemm_workspace_bytes).
 *   ccfuse_kgrouped_gemm_accumulate(G, max_rows, m, n, dtype, a, b, c_f32, group_rows, workspace, stream)
 * The same sums added into c_f32 [G, m, n] fp32 (c[g] += a_g^T @ b_g; a group without rows leaves
 * its c[g] as it is): Megatron's gradient-accumulation fusion into the fp32 main_grad.
 *
 * The GPU MoE router (ccfuse/moe/router_gpu.h, docs/moe-routing.md; no Team needed): top-k experts
 * per token from the caller's fp32 gate logits, with an optional capacity.
 *   ccfuse_moe_route_workspace_bytes(E, topk, score, normalize, cf, drop, W, T, &bytes)
 *   ccfuse_moe_route(E, topk, score, normalize, cf, drop, W, logits, T, bias, topk_ids, topk_weights,
 *                    tokens_per_expert, dropped, workspace, stream)
 * score 0 = softmax, 1 = sigmoid; normalize 1: the k weights sum to 1; cf = capacity_factor (0 =
 * dropless, else each expert keeps at most ceil(cf * T * topk / E) entries); drop 0 = by position
 * (earlier tokens keep their slot), 1 = by probability (the highest weights stay); W = world_size
 * (only checked: E % W == 0). logits [T, E] fp32, bias [E] fp32 or null, topk_ids [T, topk] int32
 * (-1 = dropped), topk_weights [T, topk] fp32 (0 when dropped), tokens_per_expert [E] int32,
 * dropped one int64: all device memory, E <= 1024.
 *
 * Every function returns 0 on success; otherwise nonzero, and ccfuse_last_error() (this thread's
 * last failure) names the argument and the rule it broke.
 */
#ifndef CCFUSE_C_API_H_
#define CCFUSE_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ccfuse_team ccfuse_team;
typedef struct ccfuse_tp_op ccfuse_tp_op;
typedef struct ccfuse_moe_ffn ccfuse_moe_ffn;
typedef struct ccfuse_moe_ffn_backward ccfuse_moe_ffn_backward;

int ccfuse_init_from_env(void);
/* The process's Team around an NCCL communicator the caller owns (torch's ProcessGroupNCCL's, a
 * tensor-parallel subgroup's): its ranks, its device; ccfuse_finalize does not destroy it, and it
 * must outlive the Team. The NCCL library loaded must be the one ccfuse was built against (major.
 * minor). Collective over the communicator's ranks; fails if a Team exists (ccfuse_finalize first). */
int ccfuse_init_from_comm(void* nccl_comm);
int ccfuse_world_size(int* out);
/* A further Team around an NCCL communicator the caller owns (not destroyed with the Team; it must
 * outlive every op made on the Team), beside the process's one; collective over its ranks. */
int ccfuse_team_create_from_comm(void* nccl_comm, ccfuse_team** out);
int ccfuse_team_world_size(ccfuse_team* team, int* out);
int ccfuse_team_destroy(ccfuse_team* team);
/* The op's default configuration; ag_gemm takes the TP tuner's transport (the copy engine where
 * the push is dense, tp::ag_copy_engine_pays; docs/tp-tuner.md), as `ccfuse bench` does. */
int ccfuse_tp_create(const char* op, int64_t m, int64_t n, int64_t k, int b_kn, ccfuse_tp_op** out);
/* The same with the element type: dtype 0 = bf16 (what ccfuse_tp_create takes), 1 = fp16. */
int ccfuse_tp_create_typed(const char* op, int64_t m, int64_t n, int64_t k, int b_kn, int dtype, ccfuse_tp_op** out);
/* ccfuse_tp_create_typed on `team` (null: the process's Team). */
int ccfuse_tp_create_on(ccfuse_team* team, const char* op, int64_t m, int64_t n, int64_t k, int b_kn, int dtype,
                        ccfuse_tp_op** out);
int ccfuse_tp_run(ccfuse_tp_op* op, const void* a, const void* b, void* c, void* stream);
/* ag_gemm only: the gathered A [M, K] of this op's last call (every rank's band, in rank order), a
 * device pointer into the op's symmetric buffer. It holds the last call's rows until the op's next
 * call on this rank: work that reads it must be enqueued, in stream order, before that call (the
 * peers write into it only after this rank enters that call's entry barrier). */
int ccfuse_tp_gathered(ccfuse_tp_op* op, const void** out);
int ccfuse_tp_destroy(ccfuse_tp_op* op);
int ccfuse_moe_ffn_create(int64_t max_tokens, int64_t hidden, int64_t ffn, int num_experts, int topk, int swiglu,
                          int b_kn, double imbalance, ccfuse_moe_ffn** out);
/* ccfuse_moe_ffn_create on `team` (null: the process's Team): E / W experts a rank, W its size. */
int ccfuse_moe_ffn_create_on(ccfuse_team* team, int64_t max_tokens, int64_t hidden, int64_t ffn, int num_experts,
                             int topk, int swiglu, int b_kn, double imbalance, ccfuse_moe_ffn** out);
int ccfuse_moe_ffn_run(ccfuse_moe_ffn* ffn, const void* x, int64_t num_tokens, const int32_t* topk_ids,
                       const float* topk_w, const void* w1, const void* w2, void* out, void* stream);
/* Training: ccfuse_moe_ffn_run that also keeps layer 0's pre-activation in preact_out, bf16
 * [preact_rows, 2F] (swiglu; [preact_rows, F] without), preact_rows in [1, max_rows] (0: max_rows,
 * from ccfuse_moe_ffn_max_rows, the receive bound), for ccfuse_moe_ffn_backward_run_saved (which
 * then skips recomputing it, unless the call received more rows than preact_rows: then it
 * recomputes, decided on the device). */
int ccfuse_moe_ffn_run_keep(ccfuse_moe_ffn* ffn, const void* x, int64_t num_tokens, const int32_t* topk_ids,
                            const float* topk_w, const void* w1, const void* w2, void* out, void* preact_out,
                            int64_t preact_rows, void* stream);
int ccfuse_moe_ffn_max_rows(ccfuse_moe_ffn* ffn, int64_t* out);
int ccfuse_moe_ffn_describe(ccfuse_moe_ffn* ffn, const char** out);
int ccfuse_moe_ffn_destroy(ccfuse_moe_ffn* ffn);
/* The MoE FFN's backward (ccfuse/moe/moe_ffn.h, MoeFfnBackward; collective): with the forward's
 * arguments and g = d loss / d out [T, H] bf16, writes dx [T, H] bf16 and dtopk_w [T, topk] float
 * (0 for dropped slots). w1_swiglu_tiles: w1's 2F rows (columns for b_kn = 1) in
 * ccfuse_swiglu_permutation order (1, as ccfuse_moe_ffn_run takes them) or gate rows then up rows
 * (0: torch's Linear weights). The weight gradients are left to the caller: operands() gives the
 * received x rows [max_rows, H], d h [max_rows, 2F] (w1's column order), the received g rows
 * [max_rows, H], p * a [max_rows, F] (bf16) and the rows per local expert (int32 [E/W], device),
 * in expert order: d W1_e = d h_e^T x_e, d W2_e = g_e^T (p a)_e (Linear layouts; transposed for
 * b_kn = 1). They hold this call's rows until the next run on this rank. */
int ccfuse_moe_ffn_backward_create(int64_t max_tokens, int64_t hidden, int64_t ffn, int num_experts, int topk,
                                   int swiglu, int b_kn, int w1_swiglu_tiles, double imbalance,
                                   ccfuse_moe_ffn_backward** out);
int ccfuse_moe_ffn_backward_create_on(ccfuse_team* team, int64_t max_tokens, int64_t hidden, int64_t ffn,
                                      int num_experts, int topk, int swiglu, int b_kn, int w1_swiglu_tiles,
                                      double imbalance, ccfuse_moe_ffn_backward** out);
int ccfuse_moe_ffn_backward_run(ccfuse_moe_ffn_backward* bwd, const void* x, int64_t num_tokens,
                                const int32_t* topk_ids, const float* topk_w, const void* w1, const void* w2,
                                const void* g, void* dx, float* dtopk_w, void* stream);
/* ccfuse_moe_ffn_backward_run with h_saved = the preact_out of ccfuse_moe_ffn_run_keep (a layer
 * made with the same arguments, the same routing) and h_rows = its preact_rows: x is dispatched
 * without recomputing h (unless the rows exceed h_rows). */
int ccfuse_moe_ffn_backward_run_saved(ccfuse_moe_ffn_backward* bwd, const void* x, int64_t num_tokens,
                                      const int32_t* topk_ids, const float* topk_w, const void* w1, const void* w2,
                                      const void* g, const void* h_saved, int64_t h_rows, void* dx, float* dtopk_w,
                                      void* stream);
int ccfuse_moe_ffn_backward_operands(ccfuse_moe_ffn_backward* bwd, const void** x_rows, const void** dh_rows,
                                     const void** g_rows, const void** pa_rows, const int32_t** expert_rows,
                                     int64_t* max_rows);
int ccfuse_moe_ffn_backward_destroy(ccfuse_moe_ffn_backward* bwd);
int ccfuse_swiglu_permutation(int64_t ffn, int64_t* perm);
int ccfuse_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int dtype, int b_kn, int64_t* bytes);
int ccfuse_gemm(int64_t m, int64_t n, int64_t k, int dtype, int b_kn, const void* a, const void* b, void* c,
                void* workspace, void* stream);
int ccfuse_grouped_gemm_workspace_bytes(int num_groups, int64_t* bytes);
int ccfuse_grouped_gemm(int num_groups, int64_t max_rows, int64_t n, int64_t k, int dtype, int b_kn, const void* a,
                        const void* b, void* c, const int32_t* group_rows, void* workspace, void* stream);
int ccfuse_kgrouped_gemm(int num_groups, int64_t max_rows, int64_t m, int64_t n, int dtype, const void* a,
                         const void* b, void* c, const int32_t* group_rows, void* workspace, void* stream);
int ccfuse_kgrouped_gemm_accumulate(int num_groups, int64_t max_rows, int64_t m, int64_t n, int dtype, const void* a,
                                    const void* b, float* c, const int32_t* group_rows, void* workspace,
                                    void* stream);
/* Bytes of device workspace ccfuse_moe_route needs for num_tokens tokens: 0 for dropless configs
 * (capacity_factor 0) and whenever the capacity cannot bind (capacity >= num_tokens); otherwise
 * the radix sort's buffers, sized by querying CUB on the current device. Checks the arguments as
 * ccfuse_moe_route does. */
int ccfuse_moe_route_workspace_bytes(int num_experts, int topk, int score, int normalize, double capacity_factor,
                                     int drop, int world_size, int64_t num_tokens, int64_t* bytes);
/* Routes num_tokens tokens on the current device, in stream order (no host sync, no allocation,
 * CUDA-graph capturable, deterministic): the top-k experts by (score + bias) (ties: the lower
 * expert id), weighted by the unbiased scores. Every call overwrites tokens_per_expert (per expert,
 * after drops) and dropped (entries dropped by the capacity); num_tokens == 0 just zeroes them.
 * workspace: ccfuse_moe_route_workspace_bytes bytes, 256-byte aligned (null when that is 0). The
 * data are not checked: non-finite logits give unspecified ids, still in [0, E). */
int ccfuse_moe_route(int num_experts, int topk, int score, int normalize, double capacity_factor, int drop,
                     int world_size, const float* logits, int64_t num_tokens, const float* bias, int32_t* topk_ids,
                     float* topk_weights, int32_t* tokens_per_expert, int64_t* dropped, void* workspace, void* stream);
int ccfuse_finalize(void);
const char* ccfuse_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CCFUSE_C_API_H_ */
