// test_emu.cpp -- checks cuda_emu.h against CUDA's definitions of its primitives, on known inputs.
//
//   g++ -std=c++17 -I notebooks/labs/emu -I flash_attention_cuda/kernels notebooks/labs/emu/test_emu.cpp -o t && ./t
// prints one "ok NAME" / "FAIL NAME: ..." line per check, then "ALL OK" or "FAILED n"; exit code 0 only if all pass.
// tests/test_labs_cuda.py compiles and runs it.
#include "cuda_emu.h"
#include "common.cuh"

static int g_failed = 0;
static void check(bool ok, const char* name, const char* detail = "") {
    printf("%s %s%s%s\n", ok ? "ok" : "FAIL", name, ok ? "" : ": ", ok ? "" : detail);
    if (!ok) ++g_failed;
}

// every thread writes its results here, indexed by linear thread id
static int r_xor[64], r_down[64], r_up[64], r_idx[64], r_idx16[64], r_xor8[64], r_down8[64];
static unsigned r_ballot[64];
static int r_any[64], r_all[64];
static float r_max[64], r_sum[64];
static int r_after_barrier[64];
static int r_half[64];

static void body_primitives(void*) {
    const int t = threadIdx.x, lane = t % 32;
    const int v = 100 * (t / 32) + lane;  // known input: warp * 100 + lane
    r_xor[t] = __shfl_xor_sync(0xffffffffu, v, 5);
    r_down[t] = __shfl_down_sync(0xffffffffu, v, 3);
    r_up[t] = __shfl_up_sync(0xffffffffu, v, 2);
    r_idx[t] = __shfl_sync(0xffffffffu, v, 7);
    r_idx16[t] = __shfl_sync(0xffffffffu, v, 3, 16);    // width 16: lane 3 of each half
    r_xor8[t] = __shfl_xor_sync(0xffffffffu, v, 9, 8);  // width 8: a later segment gives the own value
    r_down8[t] = __shfl_down_sync(0xffffffffu, v, 6, 8);
    r_ballot[t] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    r_any[t] = __any_sync(0xffffffffu, lane == 31 && t / 32 == 1);
    r_all[t] = __all_sync(0xffffffffu, lane < 40);
    r_max[t] = fa::warp_reduce_max(lane == 13 ? 7.5f : (float)(lane % 5));
    r_sum[t] = fa::warp_reduce_sum((float)lane);
    if (lane < 16) r_half[t] = __shfl_xor_sync(0x0000ffffu, v, 1);  // a half-warp collective
    else r_half[t] = -1;
    // __syncthreads: every thread writes its slot before, then reads its neighbour's after
    __shared__ int slots[64];
    slots[t] = 1000 + t;
    __syncthreads();
    r_after_barrier[t] = slots[(t + 37) % 64];
}

static void body_diverged(void*) {
    const int lane = threadIdx.x % 32;
    float x = 1.0f;
    if (lane != 4) x = fa::warp_reduce_sum(x);  // lane 4 skips the shuffles
    __syncthreads();
    (void)x;
}

static void body_syncthreads_skipped(void*) {
    if (threadIdx.x < 40) __syncthreads();  // threads 40..63 exit: they count as arrived (as on sm_70+)
}

static int g_order[2];
static void body_blocks(void*) {  // blocks run one after another; each sees its own blockIdx
    if (threadIdx.x == 0) g_order[blockIdx.x] = blockIdx.x + 10 * blockIdx.y + 100 * (int)gridDim.x;
}

int main() {
    char err[512] = "";
    int rc = emu::launch(dim3(1), dim3(64), body_primitives, nullptr, err, sizeof err);
    check(rc == 0, "launch of two warps", err);
    bool ok_xor = true, ok_down = true, ok_up = true, ok_idx = true, ok_idx16 = true, ok_xor8 = true, ok_down8 = true,
         ok_ballot = true, ok_any = true, ok_all = true, ok_max = true, ok_sum = true, ok_bar = true, ok_half = true;
    unsigned want_ballot = 0;
    for (int b = 0; b < 32; b += 3) want_ballot |= 1u << b;
    for (int t = 0; t < 64; ++t) {
        const int w = 100 * (t / 32), lane = t % 32;
        ok_xor &= r_xor[t] == w + (lane ^ 5);
        ok_down &= r_down[t] == w + (lane + 3 < 32 ? lane + 3 : lane);
        ok_up &= r_up[t] == w + (lane >= 2 ? lane - 2 : lane);
        ok_idx &= r_idx[t] == w + 7;
        ok_idx16 &= r_idx16[t] == w + (lane / 16) * 16 + 3;
        ok_xor8 &= r_xor8[t] == w + ((lane ^ 9) < (lane / 8) * 8 + 8 ? lane ^ 9 : lane);  // earlier segment: read
        ok_down8 &= r_down8[t] == w + ((lane % 8) + 6 < 8 ? lane + 6 : lane);
        ok_ballot &= r_ballot[t] == want_ballot;
        ok_any &= r_any[t] == (t / 32 == 1);
        ok_all &= r_all[t] == 1;
        ok_max &= r_max[t] == 7.5f;
        ok_sum &= r_sum[t] == 496.0f;
        ok_bar &= r_after_barrier[t] == 1000 + (t + 37) % 64;
        ok_half &= r_half[t] == (lane < 16 ? w + (lane ^ 1) : -1);
    }
    check(ok_xor, "__shfl_xor_sync: lane i gets lane i^5");
    check(ok_down, "__shfl_down_sync: lane i gets lane i+3, or its own value past lane 31");
    check(ok_up, "__shfl_up_sync: lane i gets lane i-2, or its own value below lane 0");
    check(ok_idx, "__shfl_sync: every lane gets lane 7");
    check(ok_idx16, "__shfl_sync width 16: lane 3 of each half");
    check(ok_xor8, "__shfl_xor_sync width 8: a source in a later segment gives the own value, an earlier one is read");
    check(ok_down8, "__shfl_down_sync width 8: stays inside the 8-lane segment");
    check(ok_ballot, "__ballot_sync: bit b set iff lane b's predicate holds");
    check(ok_any, "__any_sync: per warp");
    check(ok_all, "__all_sync");
    check(ok_max, "fa::warp_reduce_max: every lane gets the max");
    check(ok_sum, "fa::warp_reduce_sum: every lane gets 0 + 1 + ... + 31 = 496");
    check(ok_half, "a half-warp collective (mask 0xffff) completes without the other half");
    check(ok_bar, "__syncthreads: writes before it are seen by every thread after it");

    err[0] = 0;
    rc = emu::launch(dim3(1), dim3(32), body_diverged, nullptr, err, sizeof err);
    check(rc == 1 && strstr(err, "lane 4 at __syncthreads") && strstr(err, "__shfl_xor_sync"),
          "a shuffle that lane 4 skips is reported, not hung", err);
    printf("   (message: %s)\n", err);

    err[0] = 0;
    rc = emu::launch(dim3(1), dim3(64), body_syncthreads_skipped, nullptr, err, sizeof err);
    check(rc == 0, "__syncthreads with exited threads completes", err);

    rc = emu::launch(dim3(2, 3), dim3(32), body_blocks, nullptr, err, sizeof err);
    check(rc == 0 && g_order[0] == 0 + 20 + 200 && g_order[1] == 1 + 20 + 200, "blockIdx / gridDim per block");

    if (g_failed) {
        printf("FAILED %d\n", g_failed);
        return 1;
    }
    printf("ALL OK\n");
    return 0;
}
