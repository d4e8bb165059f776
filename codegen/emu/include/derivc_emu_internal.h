// derivc CPU emulation, internal: the state of the running launch and the scheduling primitives
// shared by the scheduler (derivc_emu_runtime.cpp) and the instructions (derivc_emu_instr.cpp).
// Not seen by kernels.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <setjmp.h>

#include "derivc_emu.h"

namespace derivc_emu {
namespace rt {


constexpr int kMaxThreads = 1024;
constexpr std::size_t kStack = 128 * 1024;  // per fiber, committed lazily; a guard page below
constexpr std::size_t kPage = 4096;
constexpr unsigned kDynStart = 1040;        // 16- but not 32- (nor 1024-) aligned
constexpr unsigned kMaxSmem = 232448;       // sm_90 opt-in maximum per block
constexpr int kMaxMbars = 128;

enum class Wait { None, Bar, Coll, Mbar };
enum Order { FORWARD = 0, REVERSE = 1, RANDOM = 2 };

struct CpAsync { unsigned dst; unsigned group; unsigned char data[16]; };

struct Fiber {
    void* sp;
    int tid;
    bool done, runnable;
    Wait wait;
    const void* wait_obj;
    long long wait_a, wait_b;
    CpAsync* cps;
    int ncp, capcp;
    unsigned cp_commits;
    unsigned wg_commits;
    int wg_next;  // id of the next wgmma op of its warpgroup not yet delivered to this lane
    unsigned* unfenced;  // 16-byte shared chunks it wrote through the generic proxy since its
    int nunfenced, capunfenced;  // last fence.proxy.async (wgmma reads them as poison)
};

// bar.sync arrivals count per warp (PTX ISA): a warp has arrived once every non-exited thread of
// it has; a barrier for the whole CTA also counts warps whose threads have all exited
struct Barrier { int count, arrived; unsigned gen; unsigned lanes[kMaxThreads / 32]; };

enum CollKind { COLL_NONE = 0, COLL_SHFL, COLL_LDSM, COLL_MMA, COLL_WGMMA, COLL_SYNCWARP };

struct Rendezvous {
    int kind;
    unsigned long long mask;  // participating lanes (warp: 32 bits; warpgroup: all 128)
    int expected, arrived;
    unsigned gen;
    // per-kind agreed arguments
    int sub;                  // shuffle kind / ldmatrix trans / dtype
    int width;
    Dtype dtype;
    int n, scale_d, tnsp_a, tnsp_b, rs;
    unsigned long long da, db;
    // per-lane payload
    std::uint64_t val[128];
    int arg[128];
    void* out[128];
    std::uint32_t a[128][4];
    std::uint32_t b[32][2];
    unsigned commits[128];
};

struct WgOp {
    WgOp* next;
    int id;
    unsigned group;
    Dtype dtype;
    int n, scale_d, tnsp_a, tnsp_b;
    bool rs, computed;
    unsigned long long da, db;
    std::uint32_t a_regs[128][4];       // register A at issue ...
    const std::uint32_t* a_ptr[128];    // ... and where the lane keeps them until its wait
    float* d[128];
    WgOp* chain[128];  // an earlier op whose result is this op's accumulator input, per lane
    float* in;         // captured accumulators (lanes without a chain)
    float* buf;        // result
    int delivered, refs;
};

struct Mbar { unsigned addr; bool live; int count, pending; long long tx; unsigned phase; };

struct Tma { Tma* next; unsigned bar, dst, bytes; unsigned char* data; };

struct State {
    // launch
    void (*thunk)(void**);
    void** args;
    int nthreads, nwarps, order;
    unsigned smem_bytes, window_size;
    std::uint64_t rng;
    unsigned char* window;
    unsigned char* stacks;
    std::size_t stacks_len;
    Fiber fibers[kMaxThreads];
    void* sched_sp;
    Fiber* cur;
    int live, exited;
    bool failed;
    char err[2048];
    jmp_buf* host_jmp;
    // block
    Barrier bars[16];
    Rendezvous* warps;      // nwarps
    Rendezvous* groups;     // warpgroups
    WgOp* wg_ops[kMaxThreads / 128];
    int wg_ids[kMaxThreads / 128];
    Mbar mbars[kMaxMbars];
    int nmbars;
    Tma* tmas;              // issue order
    unsigned short* unfenced;  // per 16-byte shared chunk: writers that have not fenced it yet
    long long nunfenced;
    unsigned char* proxy_view;  // what the async proxy (wgmma) sees: the window, unfenced chunks poisoned
};

extern State* g;

void switch_to_scheduler();
void block_on(Wait w, const void* obj, long long a = 0, long long b = 0);
void yield();
void maybe_yield(unsigned one_in = 2);
void wake(const void* obj);
Fiber& me();
void check_smem(unsigned addr, unsigned long long nbytes, const char* what);
void poison(unsigned addr, unsigned nbytes);
void generic_write(unsigned addr, unsigned nbytes);
void fence_generic_writes(Fiber& f);
const unsigned char* async_proxy_view();
void bar_arrive_wait(int id, int count);
const char* coll_name(int kind);
Rendezvous& join(Rendezvous& r, int kind, unsigned long long mask, int lane, int group_lanes, const char* what);
inline int lane_of(int tid) { return tid & 31; }

// The lane arrives with its payload already stored; the last arriver runs `complete`.
template <class F>
void rendezvous(Rendezvous& r, F complete) {
    if (++r.arrived == r.expected) {
        complete(r);
        r.kind = COLL_NONE;
        r.arrived = 0;
        ++r.gen;
        wake(&r);
        yield();
        return;
    }
    unsigned gen = r.gen;
    while (r.gen == gen) block_on(Wait::Coll, &r);
}

}  // namespace rt
}  // namespace derivc_emu
