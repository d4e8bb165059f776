// derivc CPU emulation: the instructions the wrappers call (shared memory, conversions, cp.async,
// warp collectives, wgmma, mbarriers, TMA), on the state of the running launch
// (derivc_emu_internal.h). Asynchronous operations poison their destination at issue and complete
// as late as the program allows; whole-group semantics come from derivc_emu_ops.h.
#include "derivc_emu_internal.h"

namespace derivc_emu {
namespace rt {

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
            for (int l = 0; op->rs && l < 128; ++l)  // the instruction may read them until the wait
                if (std::memcmp(op->a_ptr[l], op->a_regs[l], 16))
                    fail("wgmma.mma_async (A in registers, group %u): lane %d of warpgroup %d changed its A registers "
                         "before wgmma.wait_group", op->group, l, wg);
            ops::wgmma(op->dtype, op->n, async_proxy_view(), g->window_size, op->da, op->rs ? op->a_regs : nullptr, op->db,
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

}  // namespace rt

using namespace rt;

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
    generic_write(addr, nbytes);
    maybe_yield(8);
}

void ld_shared(unsigned addr, void* bytes, int nbytes) {
    check_smem(addr, nbytes, "ld.shared");
    if (addr % nbytes) fail("ld.shared of %d bytes at misaligned address 0x%x", nbytes, addr);
    std::memcpy(bytes, g->window + addr, nbytes);
    maybe_yield(8);
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
    maybe_yield(8);
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
        if ((long long)c.group < limit) {
            std::memcpy(g->window + c.dst, c.data, 16);
            generic_write(c.dst, 16);
        }
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
        if (!op->chain[lane]) {  // nothing but this wgmma may write these registers since its issue
            const unsigned* bits = reinterpret_cast<const unsigned*>(op->d[lane]);
            for (int i = 0; i < nd; ++i)
                if (bits[i] != 0xFFFFFFFFu)
                    fail("wrote accumulator register %d of a wgmma.mma_async (m64n%dk16, group %u) before its "
                         "wgmma.wait_group", i, op->n, op->group);
        }
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
    if (rs) {
        std::memcpy(x.a[lane], a4, 16);
        x.val[lane] = reinterpret_cast<std::uintptr_t>(a4);
    }
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
            op->a_ptr[l] = reinterpret_cast<const std::uint32_t*>(static_cast<std::uintptr_t>(q.val[l]));
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
void fence_proxy_async() {
    fence_generic_writes(me());
    maybe_yield();
}
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
    const unsigned bytes = ops::tma_load_tile(*static_cast<const ops::TensorMap*>(tensor_map), (std::uint32_t)rank,
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
}  // namespace derivc_emu

void __syncwarp(unsigned mask) {
    using namespace derivc_emu::rt;
    Fiber& f = me();
    Rendezvous& r = join(g->warps[f.tid / 32], COLL_SYNCWARP, mask, lane_of(f.tid), 32, "bar.warp.sync");
    rendezvous(r, [](Rendezvous&) {});
}
