/* ccfuse/c_api.h: a C ABI over the fused tensor-parallel ops, for Python (ctypes) and other
 * languages. One process per GPU, launched by torchrun or any launcher that sets RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (the Team bootstraps on MASTER_PORT + 1,
 * or CCFUSE_BOOTSTRAP_PORT). Pointers are device pointers (e.g. torch's tensor.data_ptr()) and the
 * stream a cudaStream_t (torch.cuda.current_stream().cuda_stream); nothing synchronises the host.
 *
 *   ccfuse_init_from_env()                        the process's Team (collective, once)
 *   ccfuse_tp_create("ag_gemm", m, n, k, 1, &op)  a fused op for one shape (collective)
 *   ccfuse_tp_run(op, a, b, c, stream)            one call (collective, in stream order)
 *   ccfuse_tp_destroy(op); ccfuse_finalize()      collective, before the launcher's teardown
 *
 * Shapes follow the `ccfuse` tool: m is the global M and k the global K. ag_gemm: a = A_r
 * [m/W, k], c = [m, n]; gemm_rs: a = A_r [m, k/W], c = this rank's rows [m/W, n]; gemm_ar:
 * a = A_r [m, k/W], c = [m, n]. b is B_r: [k', n] row-major with b_kn = 1 (a torch [K, N]
 * tensor), [n, k'] with b_kn = 0 (a torch Linear weight), k' = k (ag_gemm) or k/W. bf16 only.
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

typedef struct ccfuse_tp_op ccfuse_tp_op;

int ccfuse_init_from_env(void);
int ccfuse_world_size(int* out);
int ccfuse_tp_create(const char* op, int64_t m, int64_t n, int64_t k, int b_kn, ccfuse_tp_op** out);
int ccfuse_tp_run(ccfuse_tp_op* op, const void* a, const void* b, void* c, void* stream);
int ccfuse_tp_destroy(ccfuse_tp_op* op);
int ccfuse_finalize(void);
const char* ccfuse_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CCFUSE_C_API_H_ */
