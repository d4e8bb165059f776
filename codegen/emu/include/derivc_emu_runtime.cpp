// derivc CPU emulation: the execution model's scheduler (the instructions are in
// derivc_emu_instr.cpp). Compiled once (cached by codegen.emu.compile) and linked into every
// emulated kernel.
//
// One block at a time; its threads are cooperative fibers (a small x86-64 context switch, one
// stack each) switched only where a thread must wait: barriers, warp / warpgroup collectives,
// mbarrier waits (and, in the random order, at some memory and asynchronous operations too). A fiber
// runs until it blocks; the scheduler picks the next runnable one forward, reverse or at random,
// so a missing barrier shows as poisoned data under one order or the other.
//
// Asynchronous operations complete as late as the program allows and poison their destination
// at issue: cp.async at cp.async.wait_group, TMA when a waiter finds the mbarrier phase blocked
// only on its transaction count, wgmma when a lane waits for its group (the result reaches each
// lane's registers at that lane's own wait). Errors go through fail(): the fiber switches back to
// the scheduler and the launch returns the message.
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include "derivc_emu_internal.h"

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
namespace rt {

State* g;

// ---------------------------------------------------------------- scheduling primitives
void switch_to_scheduler() {
    Fiber* f = g->cur;
    derivc_emu_switch(&f->sp, g->sched_sp);
}

void block_on(Wait w, const void* obj, long long a, long long b) {
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

// the random order also switches threads at some memory operations: one in `one_in`
void maybe_yield(unsigned one_in) {
    if (g->order != RANDOM) return;
    g->rng ^= g->rng << 13; g->rng ^= g->rng >> 7; g->rng ^= g->rng << 17;
    if ((g->rng >> 17) % one_in == 0) yield();
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

// ---------------------------------------------------------------- proxies
// A generic-proxy write (st.shared, a landed cp.async) reaches the async proxy (wgmma) only after
// the writing thread's fence.proxy.async; until then wgmma reads the chunk as poison.
void generic_write(unsigned addr, unsigned nbytes) {
    Fiber& f = *g->cur;
    for (unsigned c = addr / 16; c <= (addr + nbytes - 1) / 16; ++c) {
        if (f.nunfenced == f.capunfenced) {
            f.capunfenced = f.capunfenced ? 2 * f.capunfenced : 64;
            f.unfenced = static_cast<unsigned*>(std::realloc(f.unfenced, sizeof(unsigned) * f.capunfenced));
        }
        f.unfenced[f.nunfenced++] = c;
        ++g->unfenced[c];
        ++g->nunfenced;
    }
}

void fence_generic_writes(Fiber& f) {
    for (int i = 0; i < f.nunfenced; ++i) --g->unfenced[f.unfenced[i]];
    g->nunfenced -= f.nunfenced;
    f.nunfenced = 0;
}

const unsigned char* async_proxy_view() {
    if (g->nunfenced == 0) return g->window;
    std::memcpy(g->proxy_view, g->window, g->window_size);
    for (unsigned c = 0; c < g->window_size / 16; ++c)
        if (g->unfenced[c]) std::memset(g->proxy_view + 16 * c, 0xFF, 16);
    return g->proxy_view;
}

// ---------------------------------------------------------------- barriers
void complete_bar(Barrier& b) {
    b.arrived = 0;
    std::memset(b.lanes, 0, sizeof b.lanes);
    ++b.gen;
    wake(&b);
}

unsigned live_lanes(int w) {
    unsigned live = 0;
    for (int l = 0; l < 32 && w * 32 + l < g->nthreads; ++l)
        if (!g->fibers[w * 32 + l].done) live |= 1u << l;
    return live;
}

bool bar_ready(const Barrier& b) {
    if (b.arrived == 0) return false;
    const bool whole_cta = b.count == g->nthreads;
    int warps = 0;
    for (int w = 0; w < g->nwarps; ++w) {
        const unsigned live = live_lanes(w);
        if (live ? (b.lanes[w] & live) == live : whole_cta) ++warps;
    }
    return warps * 32 >= b.count || (whole_cta && warps == g->nwarps);
}

void bar_arrive_wait(int id, int count) {
    Barrier& b = g->bars[id];
    if (b.arrived == 0) b.count = count;
    else if (b.count != count)
        fail("bar.sync %d: thread count %d, but threads already waiting there passed %d", id, count, b.count);
    ++b.arrived;
    b.lanes[g->cur->tid / 32] |= 1u << (g->cur->tid % 32);
    if (bar_ready(b)) {
        complete_bar(b);
        yield();  // let the order pick who runs first after the barrier
        return;
    }
    unsigned gen = b.gen;
    while (b.gen == gen) block_on(Wait::Bar, &b, id, count);
}

// ---------------------------------------------------------------- collectives
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
        std::free(g->fibers[i].unfenced);
        g->fibers[i].unfenced = nullptr;
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

// A kernel access to unmapped memory (a global index far outside every tensor's guard zones) or
// a fiber stack overflow: the fiber's run ends with an error instead of the process.
struct sigaction old_segv, old_bus;
stack_t old_altstack;
alignas(16) unsigned char fault_stack[64 * 1024];

void on_fault(int sig, siginfo_t* si, void* ctx) {
    if (!g || !g->cur) {  // not a kernel thread: let the previous handler (or the default) have it
        sigaction(SIGSEGV, &old_segv, nullptr);
        sigaction(SIGBUS, &old_bus, nullptr);
        return;
    }
    const unsigned char* a = static_cast<const unsigned char*>(si->si_addr);
    const Fiber& f = *g->cur;
    const unsigned char* guard = g->stacks + (std::size_t)f.tid * (kStack + kPage);
    const unsigned char* sp = reinterpret_cast<const unsigned char*>(
        static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_RSP]);
    if ((a >= guard && a < guard + kPage) || sp < guard + kPage)
        std::snprintf(g->err, sizeof g->err, "block (%u,%u,%u) thread %d: stack overflow (%zu KiB per thread)",
                      blockIdx.x, blockIdx.y, blockIdx.z, f.tid, kStack / 1024);
    else
        std::snprintf(g->err, sizeof g->err,
                      "block (%u,%u,%u) thread %d (warp %d lane %d): %s at address %p, outside every buffer",
                      blockIdx.x, blockIdx.y, blockIdx.z, f.tid, f.tid / 32, f.tid % 32,
                      sig == SIGBUS ? "bus error" : "invalid memory access", si->si_addr);
    g->failed = true;
    switch_to_scheduler();  // the fiber is abandoned; SA_NODEFER left the signal unblocked
}

void install_fault_handler() {
    stack_t ss{};
    ss.ss_sp = fault_stack;
    ss.ss_size = sizeof fault_stack;
    sigaltstack(&ss, &old_altstack);
    struct sigaction sa{};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
}

void remove_fault_handler() {
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    sigaltstack(&old_altstack, nullptr);
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
    unsigned char *lo = __start_derivc_emu_static_shared, *hi = __stop_derivc_emu_static_shared;
    if (lo && hi > lo) std::memset(lo, 0xFF, hi - lo);
    std::memset(g->bars, 0, sizeof g->bars);
    std::memset(g->warps, 0, sizeof(Rendezvous) * g->nwarps);
    std::memset(g->groups, 0, sizeof(Rendezvous) * ((g->nthreads + 127) / 128));
    std::memset(g->wg_ops, 0, sizeof g->wg_ops);
    std::memset(g->wg_ids, 0, sizeof g->wg_ids);
    g->nmbars = 0;
    g->tmas = nullptr;
    std::memset(g->unfenced, 0, sizeof(unsigned short) * (g->window_size / 16 + 1));
    g->nunfenced = 0;
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

}  // namespace rt

using namespace rt;

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
    s->unfenced = static_cast<unsigned short*>(std::calloc(s->window_size / 16 + 1, sizeof(unsigned short)));
    s->proxy_view = static_cast<unsigned char*>(std::malloc(s->window_size));
    s->stacks_len = (std::size_t)threads * (kStack + kPage);
    void* st = mmap(nullptr, s->stacks_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    const char* result = nullptr;
    if (st == MAP_FAILED || !s->window || !s->warps || !s->groups || !s->unfenced || !s->proxy_view) {
        result = "derivc_emu: out of memory for the block";
    } else {
        s->stacks = static_cast<unsigned char*>(st);
        for (int i = 0; i < threads; ++i) mprotect(s->stacks + (std::size_t)i * (kStack + kPage), kPage, PROT_NONE);
        jmp_buf jb;
        s->host_jmp = &jb;
        blockDim = dim3{(unsigned)threads, 1, 1};
        gridDim = dim3{(unsigned)gx, (unsigned)gy, (unsigned)gz};
        install_fault_handler();
        if (setjmp(jb) == 0) {
            for (int z = 0; z < gz && !s->failed; ++z)
                for (int y = 0; y < gy && !s->failed; ++y)
                    for (int x = 0; x < gx && !s->failed; ++x) {
                        blockIdx = uint3{(unsigned)x, (unsigned)y, (unsigned)z};
                        run_block();
                    }
        }
        remove_fault_handler();
        if (s->failed) {
            std::snprintf(err, sizeof err, "%s", s->err);
            result = err;
        }
        munmap(st, s->stacks_len);
    }
    std::free(s->window);
    std::free(s->warps);
    std::free(s->groups);
    std::free(s->unfenced);
    std::free(s->proxy_view);
    std::free(s);
    g = nullptr;
    return result;
}
}  // namespace derivc_emu

void __syncthreads() {
    derivc_emu::rt::me();
    derivc_emu::rt::bar_arrive_wait(0, derivc_emu::rt::g->nthreads);
}
