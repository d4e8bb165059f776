// derivc CPU emulation: the execution model. Compiled once (cached by codegen.emu.compile) and
// linked into every emulated kernel.
//
// One block at a time; its threads are cooperative fibers (a small x86-64 context switch, one
// stack each) switched only where a thread must wait: barriers, warp / warpgroup collectives,
// mbarrier waits (and, in the random order, at some asynchronous-proxy operations too). A fiber
// runs until it blocks; the scheduler picks the next runnable one forward, reverse or at random,
// so a missing barrier shows as poisoned data under one order or the other.
//
// Asynchronous operations complete as late as the program allows and poison their destination
// at issue: cp.async at cp.async.wait_group, TMA when a waiter finds the mbarrier phase blocked
// only on its transaction count, wgmma when a lane waits for its group (the result reaches each
// lane's registers at that lane's own wait). Errors go through fail(): the fiber switches back to
// the scheduler and the launch returns the message.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <setjmp.h>
#include <sys/mman.h>

#include "derivc_emu.h"

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

// the kernel's static __shared__ variables (derivc_emu.h puts them in this section; the linker
// names its bounds; absent when the kernel has none)
extern unsigned char __start_derivc_emu_static_shared[] __attribute__((weak));
extern unsigned char __stop_derivc_emu_static_shared[] __attribute__((weak));

extern "C" void derivc_emu_switch(void** save_sp, void* to_sp);
asm(R"(
.text
.p2align 4
.type derivc_emu_switch,@function
derivc_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size derivc_emu_switch, .-derivc_emu_switch
)");

namespace derivc_emu {
namespace {

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
};

struct Barrier { int count, arrived; unsigned gen; };

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
    std::uint32_t a_regs[128][4];
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
};

State* g;

// ---------------------------------------------------------------- scheduling primitives
void switch_to_scheduler() {
    Fiber* f = g->cur;
    derivc_emu_switch(&f->sp, g->sched_sp);
}

void block_on(Wait w, const void* obj, long long a = 0, long long b = 0) {
    Fiber* f = g->cur;
    f->runnable = false;
    f->wait = w;
    f->wait_obj = obj;
    f->wait_a = a;
    f->wait_b = b;
    switch_to_scheduler();
    f->wait = Wait::None;
}

void yield() { switch_to_scheduler(); }

void maybe_yield() {
    if (g->order != RANDOM) return;
    g->rng ^= g->rng << 13; g->rng ^= g->rng >> 7; g->rng ^= g->rng << 17;
    if (g->rng & 1) yield();
}

void wake(const void* obj) {
    for (int i = 0; i < g->nthreads; ++i) {
        Fiber& f = g->fibers[i];
        if (!f.done && !f.runnable && f.wait_obj == obj) f.runnable = true;
    }
}

Fiber& me() {
    if (!g || !g->cur) fail("a device operation outside a running thread");
    return *g->cur;
}

// ---------------------------------------------------------------- shared memory
void check_smem(unsigned addr, unsigned long long nbytes, const char* what) {
    if (addr < kDynStart || addr + nbytes > (unsigned long long)kDynStart + g->smem_bytes)
        fail("%s: shared access [0x%x, 0x%llx) outside the dynamic shared window [0x%x, 0x%x)", what, addr,
             addr + nbytes, kDynStart, kDynStart + g->smem_bytes);
}

void poison(unsigned addr, unsigned nbytes) { std::memset(g->window + addr, 0xFF, nbytes); }

// ---------------------------------------------------------------- barriers
void complete_bar(Barrier& b) {
    b.arrived = 0;
    ++b.gen;
    wake(&b);
}

bool bar_ready(const Barrier& b) {
    return b.arrived > 0 && b.arrived + (b.count == g->nthreads ? g->exited : 0) >= b.count;
}

void bar_arrive_wait(int id, int count) {
    Barrier& b = g->bars[id];
    if (b.arrived == 0) b.count = count;
    else if (b.count != count)
        fail("bar.sync %d: thread count %d, but threads already waiting there passed %d", id, count, b.count);
    ++b.arrived;
    if (bar_ready(b)) {
        complete_bar(b);
        yield();  // let the order pick who runs first after the barrier
        return;
    }
    unsigned gen = b.gen;
    while (b.gen == gen) block_on(Wait::Bar, &b, id, count);
}

// ---------------------------------------------------------------- collectives
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

const char* coll_name(int kind) {
    switch (kind) {
        case COLL_SHFL: return "a warp shuffle";
        case COLL_LDSM: return "ldmatrix";
        case COLL_MMA: return "mma.sync";
        case COLL_WGMMA: return "wgmma.mma_async";
        case COLL_SYNCWARP: return "__syncwarp";
        default: return "nothing";
    }
}

// Open (or join) the collective of lane `lane` of a group; checks the lanes agree on what it is.
Rendezvous& join(Rendezvous& r, int kind, unsigned long long mask, int lane, int group_lanes, const char* what) {
    if (!((mask >> lane) & 1ull)) fail("%s: lane %d executes it but is not in the mask 0x%llx", what, lane, mask);
    if (r.kind == COLL_NONE) {
        int n = 0;
        for (int l = 0; l < group_lanes; ++l) {
            if (!((mask >> l) & 1ull)) continue;
            int t = (int)(&r - g->warps) * group_lanes + l;
            if (t >= g->nthreads || g->fibers[t].done)
                fail("%s: lane %d of the mask 0x%llx %s", what, l, mask, t >= g->nthreads ? "does not exist" : "has exited");
            ++n;
        }
        r.kind = kind;
        r.mask = mask;
        r.expected = n;
        r.arrived = 0;
    } else if (r.kind != kind || r.mask != mask) {
        fail("%s (mask 0x%llx): lanes disagree: other lanes wait in %s with mask 0x%llx", what, mask,
             coll_name(r.kind), r.mask);
    }
    return r;
}

int lane_of(int tid) { return tid & 31; }

// ---------------------------------------------------------------- mbarriers and TMA
Mbar* find_mbar(unsigned addr, const char* what) {
    for (int i = 0; i < g->nmbars; ++i)
        if (g->mbars[i].addr == addr && g->mbars[i].live) return &g->mbars[i];
    fail("%s: no mbarrier initialized at shared address 0x%x", what, addr);
}

void check_phase(Mbar& m) {
    if (m.pending == 0 && m.tx == 0) {
        ++m.phase;
        m.pending = m.count;
        wake(&m);
    }
}

bool tma_pending(unsigned bar) {
    for (Tma* t = g->tmas; t; t = t->next)
        if (t->bar == bar) return true;
    return false;
}

void complete_tmas(Mbar& m) {
    Tma** link = &g->tmas;
    while (*link) {
        Tma* t = *link;
        if (t->bar != m.addr) { link = &t->next; continue; }
        std::memcpy(g->window + t->dst, t->data, t->bytes);
        m.tx -= t->bytes;
        *link = t->next;
        std::free(t->data);
        std::free(t);
    }
    if (m.pending == 0 && m.tx < 0)
        fail("mbarrier 0x%x: TMA loads completed %lld bytes more than its expect_tx announced", m.addr, -m.tx);
    check_phase(m);
}

// ---------------------------------------------------------------- wgmma queue
void wg_compute_upto(int wg, WgOp* last) {
    for (WgOp* op = g->wg_ops[wg]; op; op = op->next) {
        if (!op->computed) {
            const int nd = op->n / 2;
            float* ptrs[128];
            for (int l = 0; l < 128; ++l) {
                float* dst = op->buf + l * nd;
                if (op->chain[l]) {
                    std::memcpy(dst, op->chain[l]->buf + l * nd, nd * sizeof(float));
                    --op->chain[l]->refs;
                } else {
                    std::memcpy(dst, op->in + l * nd, nd * sizeof(float));
                }
                ptrs[l] = dst;
            }
            ops::wgmma(op->dtype, op->n, g->window, g->window_size, op->da, op->rs ? op->a_regs : nullptr, op->db,
                       op->tnsp_a, op->tnsp_b, op->scale_d, ptrs);
            op->computed = true;
        }
        if (op == last) return;
    }
}

void wg_free_done(int wg) {
    WgOp** link = &g->wg_ops[wg];
    while (*link) {
        WgOp* op = *link;
        if (op->computed && op->delivered == 128 && op->refs == 0) {
            *link = op->next;
            std::free(op->in);
            std::free(op->buf);
            std::free(op);
        } else {
            link = &op->next;
        }
    }
}

void free_block_state() {
    for (WgOp*& head : g->wg_ops) {
        while (head) {
            WgOp* n = head->next;
            std::free(head->in);
            std::free(head->buf);
            std::free(head);
            head = n;
        }
    }
    while (g->tmas) {
        Tma* n = g->tmas->next;
        std::free(g->tmas->data);
        std::free(g->tmas);
        g->tmas = n;
    }
    for (int i = 0; i < g->nthreads; ++i) {
        std::free(g->fibers[i].cps);
        g->fibers[i].cps = nullptr;
    }
}

// ---------------------------------------------------------------- fibers
void fiber_exit_checks(Fiber& f) {
    for (int i = 0; i < f.ncp; ++i)
        fail("exits with a cp.async to shared 0x%x (group %u) never waited for (cp.async.wait_group)",
             f.cps[i].dst, f.cps[i].group);
    int wg = f.tid / 128;
    for (WgOp* op = g->wg_ops[wg]; op; op = op->next)
        if (op->id >= f.wg_next)
            fail("exits with a wgmma.mma_async (m64n%dk16, group %u) issued and never waited for (wgmma.wait_group)",
                 op->n, op->group);
    Rendezvous& r = g->warps[f.tid / 32];
    if (r.kind != COLL_NONE && ((r.mask >> lane_of(f.tid)) & 1ull))
        fail("exits while lanes of its warp wait for it in %s (mask 0x%llx)", coll_name(r.kind), r.mask);
}

void fiber_entry() {
    g->thunk(g->args);
    Fiber& f = *g->cur;
    fiber_exit_checks(f);
    f.done = true;
    --g->live;
    ++g->exited;
    for (Barrier& b : g->bars)
        if (bar_ready(b)) complete_bar(b);
    switch_to_scheduler();
    __builtin_unreachable();
}

void* fresh_stack(int i) {
    unsigned char* top = g->stacks + (std::size_t)(i + 1) * (kStack + kPage);
    void** sp = reinterpret_cast<void**>(top);
    sp[-1] = nullptr;                                   // fake return address of fiber_entry
    sp[-2] = reinterpret_cast<void*>(&fiber_entry);     // where the first switch returns
    for (int k = 3; k <= 8; ++k) sp[-k] = nullptr;      // rbp rbx r12 r13 r14 r15
    unsigned* ctl = reinterpret_cast<unsigned*>(&sp[-9]);
    ctl[0] = 0x1F80;                                    // mxcsr: round to nearest, exceptions masked
    ctl[1] = 0x037F;                                    // x87 control word
    return &sp[-9];
}

void describe_wait(const Fiber& f, char* out, std::size_t n) {
    switch (f.wait) {
        case Wait::Bar: {
            const Barrier& b = g->bars[f.wait_a];
            std::snprintf(out, n, "bar.sync %lld, %lld (%d arrived, %d exited)", f.wait_a, f.wait_b, b.arrived,
                          g->exited);
            break;
        }
        case Wait::Coll: {
            const Rendezvous& r = *static_cast<const Rendezvous*>(f.wait_obj);
            std::snprintf(out, n, "%s (mask 0x%llx, %d of %d lanes arrived)", coll_name(r.kind), r.mask, r.arrived,
                          r.expected);
            break;
        }
        case Wait::Mbar: {
            const Mbar& m = *static_cast<const Mbar*>(f.wait_obj);
            std::snprintf(out, n, "mbarrier 0x%x parity %lld (phase %u, %d of %d arrivals pending, tx %lld)", m.addr,
                          f.wait_b, m.phase, m.pending, m.count, m.tx);
            break;
        }
        default: std::snprintf(out, n, "nothing");
    }
}

void report_deadlock() {
    char* out = g->err;
    std::size_t cap = sizeof(g->err), len = 0;
    len += std::snprintf(out, cap, "block (%u,%u,%u): deadlock, every live thread waits:", blockIdx.x, blockIdx.y,
                         blockIdx.z);
    int i = 0;
    while (i < g->nthreads && len < cap - 1) {
        if (g->fibers[i].done) { ++i; continue; }
        char what[256], next[256];
        describe_wait(g->fibers[i], what, sizeof what);
        int j = i + 1;
        while (j < g->nthreads && !g->fibers[j].done) {
            describe_wait(g->fibers[j], next, sizeof next);
            if (std::strcmp(what, next)) break;
            ++j;
        }
        if (j - i == 1) len += std::snprintf(out + len, cap - len, " thread %d: %s;", i, what);
        else len += std::snprintf(out + len, cap - len, " threads %d-%d: %s;", i, j - 1, what);
        i = j;
    }
    if (g->exited && len < cap - 1) std::snprintf(out + len, cap - len, " (%d threads exited)", g->exited);
    g->failed = true;
}

Fiber* pick(int& cursor) {
    const int n = g->nthreads;
    int start = cursor;
    if (g->order == RANDOM) {
        g->rng ^= g->rng << 13; g->rng ^= g->rng >> 7; g->rng ^= g->rng << 17;
        start = (int)(g->rng % (std::uint64_t)n);
    }
    const int step = g->order == REVERSE ? -1 : 1;
    for (int k = 0; k < n; ++k) {
        int i = ((start + step * k) % n + n) % n;
        Fiber& f = g->fibers[i];
        if (!f.done && f.runnable) {
            cursor = ((i + step) % n + n) % n;
            return &f;
        }
    }
    return nullptr;
}

void run_block() {
    std::memset(g->window, 0xFF, g->window_size);  // shared memory is garbage at block start
    if (__start_derivc_emu_static_shared && __stop_derivc_emu_static_shared > __start_derivc_emu_static_shared)
        std::memset(__start_derivc_emu_static_shared, 0xFF,
                    __stop_derivc_emu_static_shared - __start_derivc_emu_static_shared);
    std::memset(g->bars, 0, sizeof g->bars);
    std::memset(g->warps, 0, sizeof(Rendezvous) * g->nwarps);
    std::memset(g->groups, 0, sizeof(Rendezvous) * ((g->nthreads + 127) / 128));
    std::memset(g->wg_ops, 0, sizeof g->wg_ops);
    std::memset(g->wg_ids, 0, sizeof g->wg_ids);
    g->nmbars = 0;
    g->tmas = nullptr;
    g->live = g->nthreads;
    g->exited = 0;
    for (int i = 0; i < g->nthreads; ++i) {
        Fiber& f = g->fibers[i];
        std::memset(&f, 0, sizeof f);
        f.tid = i;
        f.runnable = true;
        f.sp = fresh_stack(i);
    }
    int cursor = g->order == REVERSE ? g->nthreads - 1 : 0;
    while (g->live > 0 && !g->failed) {
        Fiber* f = pick(cursor);
        if (!f) { report_deadlock(); break; }
        g->cur = f;
        threadIdx = uint3{(unsigned)f->tid, 0, 0};
        derivc_emu_switch(&g->sched_sp, f->sp);
        g->cur = nullptr;
    }
    if (!g->failed) {
        for (Tma* t = g->tmas; t; t = t->next) {
            std::snprintf(g->err, sizeof g->err,
                          "block (%u,%u,%u): a TMA load to shared 0x%x on mbarrier 0x%x was never waited for",
                          blockIdx.x, blockIdx.y, blockIdx.z, t->dst, t->bar);
            g->failed = true;
            break;
        }
    }
    free_block_state();
}

}  // namespace

// ---------------------------------------------------------------- errors
[[noreturn]] void fail(const char* fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g && g->cur) {
        std::snprintf(g->err, sizeof g->err, "block (%u,%u,%u) thread %d (warp %d lane %d): %s", blockIdx.x,
                      blockIdx.y, blockIdx.z, g->cur->tid, g->cur->tid / 32, g->cur->tid % 32, msg);
        g->failed = true;
        switch_to_scheduler();
        std::abort();  // an abandoned fiber is never resumed
    }
    if (g && g->host_jmp) {
        std::snprintf(g->err, sizeof g->err, "%s", msg);
        g->failed = true;
        longjmp(*g->host_jmp, 1);
    }
    std::fprintf(stderr, "derivc_emu: %s\n", msg);
    std::abort();
}

// ---------------------------------------------------------------- the API the wrappers call
unsigned char* dynamic_smem() { return g->window + kDynStart; }

unsigned smem_addr(const void* p) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    if (c < g->window || c > g->window + g->window_size)
        fail("cvta.to.shared of a pointer outside shared memory");
    return (unsigned)(c - g->window);
}

void st_shared(unsigned addr, const void* bytes, int nbytes) {
    check_smem(addr, nbytes, "st.shared");
    if (addr % nbytes) fail("st.shared of %d bytes at misaligned address 0x%x", nbytes, addr);
    std::memcpy(g->window + addr, bytes, nbytes);
}

void ld_shared(unsigned addr, void* bytes, int nbytes) {
    check_smem(addr, nbytes, "ld.shared");
    if (addr % nbytes) fail("ld.shared of %d bytes at misaligned address 0x%x", nbytes, addr);
    std::memcpy(bytes, g->window + addr, nbytes);
}

float cvt_f32_f16(unsigned short h) { return ops::f16_bits_to_f32(h); }
unsigned short cvt_rn_f16_f32(float x) { return ops::f32_to_f16_rn(x); }
float cvt_f32_bf16(unsigned short h) { return ops::bf16_bits_to_f32(h); }
unsigned short cvt_rn_bf16_f32(float x) { return ops::f32_to_bf16_rn(x); }
unsigned cvt_rn_f16x2_f32(float hi, float lo) {
    return ((unsigned)ops::f32_to_f16_rn(hi) << 16) | ops::f32_to_f16_rn(lo);
}
unsigned cvt_rn_bf16x2_f32(float hi, float lo) {
    return ((unsigned)ops::f32_to_bf16_rn(hi) << 16) | ops::f32_to_bf16_rn(lo);
}

float ex2_approx_ftz(float x) {
    if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
    float y = exp2f(x);
    return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

float tanh_approx(float x) { return tanhf(x); }

void cp_async_cg16(unsigned dst, const void* src, int src_bytes) {
    Fiber& f = me();
    check_smem(dst, 16, "cp.async");
    if (dst % 16) fail("cp.async.cg 16 to misaligned shared address 0x%x", dst);
    if (src_bytes < 0 || src_bytes > 16) fail("cp.async.cg 16 with src-size %d (0..16)", src_bytes);
    if (reinterpret_cast<std::uintptr_t>(src) % 16) fail("cp.async.cg 16 from a misaligned global address");
    if (f.ncp == f.capcp) {
        f.capcp = f.capcp ? 2 * f.capcp : 32;
        f.cps = static_cast<CpAsync*>(std::realloc(f.cps, sizeof(CpAsync) * f.capcp));
    }
    CpAsync& c = f.cps[f.ncp++];
    c.dst = dst;
    c.group = f.cp_commits;
    std::memset(c.data, 0, 16);
    if (src_bytes) std::memcpy(c.data, src, src_bytes);
    poison(dst, 16);
}

void cp_async_commit_group() { ++me().cp_commits; }

void cp_async_wait_group(int n) {
    Fiber& f = me();
    if (n < 0) fail("cp.async.wait_group %d", n);
    // groups older than the n most recent committed ones complete; an uncommitted one never does
    long long limit = (long long)f.cp_commits - n;
    int keep = 0;
    for (int i = 0; i < f.ncp; ++i) {
        CpAsync& c = f.cps[i];
        if ((long long)c.group < limit) std::memcpy(g->window + c.dst, c.data, 16);
        else f.cps[keep++] = c;
    }
    f.ncp = keep;
    maybe_yield();
}

void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned addr, bool trans) {
    Fiber& f = me();
    const int lane = lane_of(f.tid);
    check_smem(addr, 16, "ldmatrix");
    if (addr % 16) fail("ldmatrix row address 0x%x is not 16-byte aligned", addr);
    Rendezvous& r = join(g->warps[f.tid / 32], COLL_LDSM, 0xffffffffull, lane, 32, "ldmatrix.sync.aligned.x4");
    if (r.arrived == 0) r.sub = trans;
    else if (r.sub != (int)trans) fail("ldmatrix: lanes disagree on .trans");
    unsigned* outs[4] = {&r0, &r1, &r2, &r3};
    r.arg[lane] = (int)addr;
    r.out[lane] = outs;
    rendezvous(r, [](Rendezvous& x) {
        std::uint32_t addrs[32], out[32][4];
        for (int l = 0; l < 32; ++l) addrs[l] = (std::uint32_t)x.arg[l];
        ops::ldmatrix_x4(g->window, g->window_size, addrs, x.sub != 0, out);
        for (int l = 0; l < 32; ++l) {
            unsigned** o = static_cast<unsigned**>(x.out[l]);
            for (int k = 0; k < 4; ++k) *o[k] = out[l][k];
        }
    });
}

void mma_m16n8k16(Dtype dtype, float* d, const unsigned* a, unsigned b0, unsigned b1) {
    Fiber& f = me();
    const int lane = lane_of(f.tid);
    Rendezvous& r = join(g->warps[f.tid / 32], COLL_MMA, 0xffffffffull, lane, 32, "mma.sync.aligned.m16n8k16");
    if (r.arrived == 0) r.dtype = dtype;
    else if (r.dtype != dtype) fail("mma.sync: lanes disagree on the operand type");
    for (int k = 0; k < 4; ++k) r.a[lane][k] = a[k];
    r.b[lane][0] = b0;
    r.b[lane][1] = b1;
    r.out[lane] = d;
    rendezvous(r, [](Rendezvous& x) {
        float acc[32][4];
        std::uint32_t a4[32][4];
        for (int l = 0; l < 32; ++l) {
            std::memcpy(acc[l], x.out[l], sizeof acc[l]);
            std::memcpy(a4[l], x.a[l], sizeof a4[l]);
        }
        ops::mma_m16n8k16(x.dtype, a4, x.b, acc);
        for (int l = 0; l < 32; ++l) std::memcpy(x.out[l], acc[l], sizeof acc[l]);
    });
}

std::uint64_t shfl_sync(int kind, unsigned mask, std::uint64_t value, int lane_arg, int width) {
    Fiber& f = me();
    const int lane = lane_of(f.tid);
    if (width < 1 || width > 32 || (width & (width - 1))) fail("shuffle width %d (a power of two <= 32)", width);
    Rendezvous& r = join(g->warps[f.tid / 32], COLL_SHFL, mask, lane, 32, "shfl.sync");
    if (r.arrived == 0) { r.sub = kind; r.width = width; }
    else if (r.sub != kind || r.width != width) fail("shfl.sync: lanes disagree on the shuffle mode or width");
    std::uint64_t out = 0;
    r.val[lane] = value;
    r.arg[lane] = lane_arg;
    r.out[lane] = &out;
    rendezvous(r, [](Rendezvous& x) {
        for (int l = 0; l < 32; ++l) {
            if (!((x.mask >> l) & 1ull)) continue;
            const int seg = l & ~(x.width - 1), a = x.arg[l];
            int src = l;
            bool inside = true;
            switch (x.sub) {
                case SHFL_IDX: src = seg + (a & (x.width - 1)); break;
                case SHFL_UP: src = l - a; inside = src >= seg; break;
                case SHFL_DOWN: src = l + a; inside = src < seg + x.width; break;
                default: src = l ^ a; inside = src >= seg && src < seg + x.width; break;
            }
            if (!inside) src = l;
            if (src < 0 || src > 31 || !((x.mask >> src) & 1ull))
                fail("shfl.sync: lane %d reads lane %d, which is not in the mask 0x%llx", l, src, x.mask);
            *static_cast<std::uint64_t*>(x.out[l]) = x.val[src];
        }
    });
    return out;
}

// ---------------------------------------------------------------- wgmma
void wgmma_fence() {}

void wgmma_commit_group() { ++me().wg_commits; }

void wgmma_wait_group(int n) {
    Fiber& f = me();
    if (n < 0 || n > 7) fail("wgmma.wait_group %d (0..7)", n);
    const int wg = f.tid / 128, lane = f.tid % 128;
    const long long limit = (long long)f.wg_commits - n;
    WgOp* last = nullptr;
    for (WgOp* op = g->wg_ops[wg]; op; op = op->next)
        if (op->id >= f.wg_next && (long long)op->group < limit) last = op;
    if (!last) return;
    wg_compute_upto(wg, last);
    for (WgOp* op = g->wg_ops[wg]; op; op = op->next) {
        if (op->id < f.wg_next) continue;
        const int nd = op->n / 2;
        std::memcpy(op->d[lane], op->buf + lane * nd, nd * sizeof(float));
        ++op->delivered;
        f.wg_next = op->id + 1;
        if (op == last) break;
    }
    wg_free_done(wg);
    maybe_yield();
}

namespace {
void wgmma_issue(Dtype dtype, int n, float* d, const unsigned* a4, unsigned long long da, unsigned long long db,
                 int scale_d, int tnsp_a, int tnsp_b, bool rs) {
    Fiber& f = me();
    if (n < 8 || n > 256 || n % 8) fail("wgmma m64n%dk16: N must be a multiple of 8 in 8..256", n);
    const int wg = f.tid / 128, lane = f.tid % 128;
    Rendezvous& x = g->groups[wg];
    if (x.kind == COLL_NONE) {
        for (int t = wg * 128; t < wg * 128 + 128; ++t)
            if (t >= g->nthreads || g->fibers[t].done)
                fail("wgmma.mma_async: thread %d of the warpgroup %s", t, t >= g->nthreads ? "does not exist" : "has exited");
        x.kind = COLL_WGMMA;
        x.mask = ~0ull;
        x.expected = 128;
        x.arrived = 0;
        x.dtype = dtype; x.n = n; x.da = da; x.db = db; x.scale_d = scale_d;
        x.tnsp_a = tnsp_a; x.tnsp_b = tnsp_b; x.rs = rs;
    } else if (x.kind != COLL_WGMMA || x.dtype != dtype || x.n != n || x.da != da || x.db != db ||
               x.scale_d != scale_d || x.tnsp_a != tnsp_a || x.tnsp_b != tnsp_b || x.rs != (int)rs) {
        fail("wgmma.mma_async: lanes of warpgroup %d disagree on the instruction or its descriptors", wg);
    }
    x.out[lane] = d;
    x.commits[lane] = f.wg_commits;
    if (rs) std::memcpy(x.a[lane], a4, 16);
    rendezvous(x, [wg](Rendezvous& q) {
        WgOp* op = static_cast<WgOp*>(std::calloc(1, sizeof(WgOp)));
        const int nd = q.n / 2;
        op->id = g->wg_ids[wg]++;
        op->group = q.commits[0];
        op->dtype = q.dtype; op->n = q.n; op->scale_d = q.scale_d; op->tnsp_a = q.tnsp_a; op->tnsp_b = q.tnsp_b;
        op->rs = q.rs; op->da = q.da; op->db = q.db;
        op->in = static_cast<float*>(std::malloc(sizeof(float) * 128 * nd));
        op->buf = static_cast<float*>(std::malloc(sizeof(float) * 128 * nd));
        for (int l = 0; l < 128; ++l) {
            if (q.commits[l] != q.commits[0])
                fail("wgmma.mma_async: lanes of warpgroup %d are in different commit groups (%u vs %u)", wg,
                     q.commits[l], q.commits[0]);
            op->d[l] = static_cast<float*>(q.out[l]);
            std::memcpy(op->a_regs[l], q.a[l], 16);
            const Fiber& lf = g->fibers[wg * 128 + l];
            WgOp* chain = nullptr;  // the latest op on these registers this lane has not received yet
            WgOp** tail = &g->wg_ops[wg];
            for (WgOp* p = g->wg_ops[wg]; p; p = p->next) {
                if (p->id >= lf.wg_next && p->d[l] == op->d[l]) chain = p;
                tail = &p->next;
            }
            (void)tail;
            op->chain[l] = chain;
            if (chain) ++chain->refs;
            else std::memcpy(op->in + l * nd, op->d[l], nd * sizeof(float));
            std::memset(op->d[l], 0xFF, nd * sizeof(float));  // in flight: the registers read as NaN
        }
        WgOp** tail = &g->wg_ops[wg];
        while (*tail) tail = &(*tail)->next;
        *tail = op;
    });
}
}  // namespace

void wgmma_ss(Dtype dtype, int n, float* d, unsigned long long desc_a, unsigned long long desc_b, int scale_d,
              int tnsp_a, int tnsp_b) {
    wgmma_issue(dtype, n, d, nullptr, desc_a, desc_b, scale_d, tnsp_a, tnsp_b, false);
}

void wgmma_rs(Dtype dtype, int n, float* d, const unsigned* a4, unsigned long long desc_b, int scale_d, int tnsp_b) {
    wgmma_issue(dtype, n, d, a4, 0, desc_b, scale_d, 0, tnsp_b, true);
}

// ---------------------------------------------------------------- mbarriers, TMA, misc
void fence_proxy_async() { maybe_yield(); }
void fence_mbarrier_init() {}

void mbar_init(unsigned bar, unsigned count) {
    me();
    check_smem(bar, 8, "mbarrier.init");
    if (bar % 8) fail("mbarrier.init at misaligned shared address 0x%x", bar);
    if (count < 1 || count >= (1u << 20)) fail("mbarrier.init 0x%x with count %u (1 .. 2^20-1)", bar, count);
    Mbar* m = nullptr;
    for (int i = 0; i < g->nmbars; ++i)
        if (g->mbars[i].addr == bar) m = &g->mbars[i];
    if (!m) {
        if (g->nmbars == kMaxMbars) fail("more than %d mbarriers", kMaxMbars);
        m = &g->mbars[g->nmbars++];
    }
    *m = Mbar{bar, true, (int)count, (int)count, 0, 0};
}

void mbar_arrive(unsigned bar) {
    me();
    Mbar* m = find_mbar(bar, "mbarrier.arrive");
    if (--m->pending < 0) fail("mbarrier 0x%x: more arrivals than its count %d in phase %u", bar, m->count, m->phase);
    wake(m);
    check_phase(*m);
    maybe_yield();
}

void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    me();
    Mbar* m = find_mbar(bar, "mbarrier.arrive.expect_tx");
    m->tx += bytes;
    mbar_arrive(bar);
}

void mbar_wait_parity(unsigned bar, unsigned parity) {
    me();
    Mbar* m = find_mbar(bar, "mbarrier.try_wait.parity");
    if (parity > 1) fail("mbarrier.try_wait.parity with parity %u", parity);
    for (;;) {
        if ((m->phase & 1u) != parity) return;
        if (m->pending == 0 && tma_pending(bar)) {  // only the transaction count blocks: land the loads now
            complete_tmas(*m);
            continue;
        }
        block_on(Wait::Mbar, m, bar, parity);
    }
}

void tma_load(unsigned dst, const void* tensor_map, unsigned bar, int rank, const int* coords) {
    me();
    if (rank < 1 || rank > 5) fail("cp.async.bulk.tensor.%dd", rank);
    if (reinterpret_cast<std::uintptr_t>(tensor_map) % 64) fail("TMA: the tensor map is not 64-byte aligned");
    if (dst % 128) fail("TMA: destination 0x%x is not 128-byte aligned", dst);
    Mbar* m = find_mbar(bar, "cp.async.bulk.tensor (its mbarrier)");
    check_smem(dst, 1, "cp.async.bulk.tensor");
    const unsigned bytes = ops::tma_load_tile(*static_cast<const ops::TensorMap*>(tensor_map),
                                              reinterpret_cast<const std::int32_t*>(coords), g->window,
                                              g->window_size, dst);
    check_smem(dst, bytes, "cp.async.bulk.tensor");
    Tma* t = static_cast<Tma*>(std::malloc(sizeof(Tma)));
    t->next = nullptr;
    t->bar = bar;
    t->dst = dst;
    t->bytes = bytes;
    t->data = static_cast<unsigned char*>(std::malloc(bytes ? bytes : 1));
    std::memcpy(t->data, g->window + dst, bytes);
    poison(dst, bytes);  // lands when a waiter needs it (mbar_wait_parity)
    Tma** tail = &g->tmas;
    while (*tail) tail = &(*tail)->next;
    *tail = t;
    wake(m);  // a waiter blocked on the transaction count can land it now
    maybe_yield();
}

void setmaxnreg(int n, bool inc) {
    me();
    if (n < 24 || n > 256 || n % 8)
        fail("setmaxnreg.%s %d: the register count must be a multiple of 8 in 24..256", inc ? "inc" : "dec", n);
}

void bar_sync(int id, int count) {
    me();
    if (id < 0 || id > 15) fail("bar.sync %d: barrier ids are 0..15", id);
    if (count <= 0 || count % 32 || count > g->nthreads)
        fail("bar.sync %d, %d: the count must be a multiple of 32 in 32..%d", id, count, g->nthreads);
    bar_arrive_wait(id, count);
}

// ---------------------------------------------------------------- launch
const char* launch(void (*thunk)(void**), void** args, int gx, int gy, int gz, int threads, int smem, int order,
                   unsigned seed) {
    static char err[2048];
    if (g) return "derivc_emu: a launch is already running in this module";
    if (threads < 1 || threads > kMaxThreads) {
        std::snprintf(err, sizeof err, "block of %d threads (1..%d)", threads, kMaxThreads);
        return err;
    }
    if (smem < 0 || (unsigned)smem > kMaxSmem) {
        std::snprintf(err, sizeof err, "%d bytes of dynamic shared memory (at most %u)", smem, kMaxSmem);
        return err;
    }
    if (gx < 1 || gy < 1 || gz < 1 || order < FORWARD || order > RANDOM) {
        std::snprintf(err, sizeof err, "bad launch: grid (%d,%d,%d), order %d", gx, gy, gz, order);
        return err;
    }
    State* s = static_cast<State*>(std::calloc(1, sizeof(State)));
    g = s;
    s->thunk = thunk;
    s->args = args;
    s->nthreads = threads;
    s->nwarps = (threads + 31) / 32;
    s->order = order;
    s->rng = 0x9E3779B97F4A7C15ull ^ ((std::uint64_t)seed * 0xD1B54A32D192ED03ull) ;
    if (!s->rng) s->rng = 1;
    s->smem_bytes = (unsigned)smem;
    s->window_size = kDynStart + (unsigned)smem;
    s->window = static_cast<unsigned char*>(std::aligned_alloc(kPage, (s->window_size + kPage - 1) / kPage * kPage));
    s->warps = static_cast<Rendezvous*>(std::calloc(s->nwarps, sizeof(Rendezvous)));
    s->groups = static_cast<Rendezvous*>(std::calloc((threads + 127) / 128, sizeof(Rendezvous)));
    s->stacks_len = (std::size_t)threads * (kStack + kPage);
    void* st = mmap(nullptr, s->stacks_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    const char* result = nullptr;
    if (st == MAP_FAILED || !s->window || !s->warps || !s->groups) {
        result = "derivc_emu: out of memory for the block";
    } else {
        s->stacks = static_cast<unsigned char*>(st);
        for (int i = 0; i < threads; ++i) mprotect(s->stacks + (std::size_t)i * (kStack + kPage), kPage, PROT_NONE);
        jmp_buf jb;
        s->host_jmp = &jb;
        blockDim = dim3{(unsigned)threads, 1, 1};
        gridDim = dim3{(unsigned)gx, (unsigned)gy, (unsigned)gz};
        if (setjmp(jb) == 0) {
            for (int z = 0; z < gz && !s->failed; ++z)
                for (int y = 0; y < gy && !s->failed; ++y)
                    for (int x = 0; x < gx && !s->failed; ++x) {
                        blockIdx = uint3{(unsigned)x, (unsigned)y, (unsigned)z};
                        run_block();
                    }
        }
        if (s->failed) {
            std::snprintf(err, sizeof err, "%s", s->err);
            result = err;
        }
        munmap(st, s->stacks_len);
    }
    std::free(s->window);
    std::free(s->warps);
    std::free(s->groups);
    std::free(s);
    g = nullptr;
    return result;
}

}  // namespace derivc_emu

void __syncwarp(unsigned mask) {
    using namespace derivc_emu;
    Fiber& f = me();
    Rendezvous& r = join(g->warps[f.tid / 32], COLL_SYNCWARP, mask, lane_of(f.tid), 32, "bar.warp.sync");
    rendezvous(r, [](Rendezvous&) {});
}

void __syncthreads() {
    derivc_emu::me();
    derivc_emu::bar_arrive_wait(0, derivc_emu::g->nthreads);
}
