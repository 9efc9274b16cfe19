// The CPU decode step's attention (gqa_jax/cpu_kernels.py builds and calls it): one query
// position of N heads over a cache of K key/value heads, G = N / K query heads per K/V head.
//
// One work item is a (batch row, K/V head): its G query rows, its S cached keys and values. The
// items are split over XLA's intra-op threads. Within an item the cache is read once, in order,
// for all G rows, and no key or value is copied out: one row's logits of a block of 16 keys are 16
// vector products summed across by one transpose (transpose_sum); G >= 2 rows' are the block
// transposed once and H multiply-adds per row (logits_grouped). The values are accumulated for up
// to 8 rows at once, each value read once for them (weigh). Only the visible keys' blocks are
// scored and only the visible span's values read (a decode step's self cache is visible up to its
// position). The math is grouped_attention's (gqa_jax/attention.py): logits q.k, times an int8
// key's scale, plus the bias; hidden keys get weight 0, and a row with every key hidden attends
// uniformly, as a softmax over the masked logit does; a value's scale multiplies its weight, and
// the row's sum of weights divides its output.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "cpu_vectors.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace gqa_jax_cpu;

inline f16v splat(float x) { return f16v{} + x; }

inline float lane_max(f16v x) {
  float m = x[0];
  for (int i = 1; i < L; ++i) m = std::max(m, x[i]);
  return m;
}

inline float lane_sum(f16v x) {
  float t = 0.f;
  for (int i = 0; i < L; ++i) t += x[i];
  return t;
}

// p[0, n) as a vector, lanes from n on 0 (n < L: a block's tail past the buffer's end).
inline f16v load_part(const float* p, int64_t n) {
  if (n >= L) return load(p);
  f16v r = {};
  std::memcpy(&r, p, n * sizeof(float));
  return r;
}

constexpr float kFloor = -80.f;  // exp() argument floor: exp(-80) ~ 2e-35, a normal float

// x[j] holds 16 partial products of key j; returns lane j = the sum of x[j]'s lanes.
inline f16v transpose_sum(f16v x[16]) {
  f16v a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {  // lanes 0-7: key 2i's halves summed; 8-15: key 2i+1's
    f16v lo = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    f16v hi = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    a[i] = lo + hi;
  }
  for (int i = 0; i < 4; ++i) {  // 4 lanes per key: keys 4i .. 4i+3
    f16v lo = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    f16v hi = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    b[i] = lo + hi;
  }
  for (int i = 0; i < 2; ++i) {  // 2 lanes per key: keys 8i .. 8i+7
    f16v lo = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
    f16v hi = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    c[i] = lo + hi;
  }
  f16v lo = __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  f16v hi = __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return lo + hi;
}

// x[j] lane d -> x[d] lane j: the 16 x 16 block transposed, its quarter, eighth, ... blocks swapped.
template <int B>
inline void swap_blocks(f16v& a, f16v& b) {  // a, b: rows i and i + B of the block, (i & B) == 0
#define GQA_LO(d) ((((d) & B) == 0) ? (d) : L + (d) - B)
#define GQA_HI(d) ((((d) & B) == 0) ? (d) + B : L + (d))
  const f16v lo = __builtin_shufflevector(a, b, GQA_LO(0), GQA_LO(1), GQA_LO(2), GQA_LO(3), GQA_LO(4), GQA_LO(5), GQA_LO(6),
                                          GQA_LO(7), GQA_LO(8), GQA_LO(9), GQA_LO(10), GQA_LO(11), GQA_LO(12), GQA_LO(13),
                                          GQA_LO(14), GQA_LO(15));
  const f16v hi = __builtin_shufflevector(a, b, GQA_HI(0), GQA_HI(1), GQA_HI(2), GQA_HI(3), GQA_HI(4), GQA_HI(5), GQA_HI(6),
                                          GQA_HI(7), GQA_HI(8), GQA_HI(9), GQA_HI(10), GQA_HI(11), GQA_HI(12), GQA_HI(13),
                                          GQA_HI(14), GQA_HI(15));
#undef GQA_LO
#undef GQA_HI
  a = lo;
  b = hi;
}

template <int B>
inline void swap_all(f16v x[L]) {
  for (int i = 0; i < L; ++i)
    if ((i & B) == 0) swap_blocks<B>(x[i], x[i + B]);
}

inline void transpose(f16v x[L]) {
  swap_all<8>(x);
  swap_all<4>(x);
  swap_all<2>(x);
  swap_all<1>(x);
}

// exp(x) for x in [kFloor, 0] (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, e^r by a polynomial).
inline f16v exp_neg(f16v x) {
  const f16v fx = x * 1.44269504088896341f - 0.5f;  // <= 0: truncation rounds n to nearest
  const i16v n = __builtin_convertvector(fx, i16v);
  const f16v nf = __builtin_convertvector(n, f16v);
  const f16v r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  f16v p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const f16v y = p * r * r + r + 1.f;
  const i16v bits = (n + 127) << 23;  // 2^n, n >= -116: a normal float
  f16v scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

struct Item {
  const float* q;      // [G, H]
  const void* k;       // [S, H]
  const void* v;       // [S, H]
  const float* ks;     // [S] or null
  const float* vs;     // [S] or null
  const float* bias;   // [G, S] rows at stride bias_stride, or null
  int64_t bias_stride;
  const bool* mask;    // [S] or null
  float* out;          // [G, H]
};

// Where a block of 16 raw logits q.k goes: times an int8 key's scale, plus the bias, hidden keys
// (and those past the cache's end) at -3e38, stored in row g of l [G, Sp]; each row's running
// maximum kept lane by lane.
struct Rows {
  float* l;            // [G, Sp]
  int64_t Sp, S;
  const float* live;   // [Sp] 1: a visible key; 0: hidden, or past the cache's end
  const float* ksc;    // [S] the keys' scales, or null (a float cache)
  const float* bias;   // [G, S] rows at stride bias_stride, or null
  int64_t bias_stride;
  bool any;            // false: every key hidden, every logit taken as 0 (a uniform softmax)
  f16v* mx;            // [G]

  void put(int64_t g, int64_t s0, f16v x) const {
    if (ksc) x *= load_part(ksc + s0, S - s0);
    if (bias) x += load_part(bias + g * bias_stride + s0, S - s0);
    if (!any) x = f16v{};
    x = load(live + s0) != 0.f ? x : -3.0e38f;
    std::memcpy(l + g * Sp + s0, &x, sizeof(x));
    mx[g] = x > mx[g] ? x : mx[g];
  }
};

// The logits of one query row (G = 1) over the keys of blocks [b0, b1), H = HV * 16: each key's
// products with the row, 16 keys' summed across at once.
template <typename T, int HV>
void logits_one(const Item& it, int64_t b0, int64_t b1, const Rows& rows) {
  const T* k = static_cast<const T*>(it.k);
  constexpr int H = HV * L;
  f16v qv[HV];
  for (int hv = 0; hv < HV; ++hv) qv[hv] = load(it.q + hv * L);
  for (int64_t s0 = b0; s0 < b1; s0 += L) {
    f16v x[L];
    for (int j = 0; j < L; ++j) {
      const int64_t s = std::min<int64_t>(s0 + j, rows.S - 1);
      f16v p = qv[0] * load(k + s * H);
      for (int hv = 1; hv < HV; ++hv) p += qv[hv] * load(k + s * H + hv * L);
      x[j] = p;
    }
    rows.put(0, s0, transpose_sum(x));
  }
}

// The same for G >= 2 rows: each block of 16 keys transposed once (a vector per head dim, a lane
// per key), then each row's logits are H multiply-adds of its query's elements with those vectors.
template <typename T, int HV>
void logits_grouped(const Item& it, int64_t G, int64_t b0, int64_t b1, const Rows& rows) {
  const T* k = static_cast<const T*>(it.k);
  constexpr int H = HV * L;
  for (int64_t s0 = b0; s0 < b1; s0 += L) {
    f16v kt[HV][L];  // kt[hv][d]: dim hv * 16 + d of the block's 16 keys
    for (int hv = 0; hv < HV; ++hv) {
      for (int j = 0; j < L; ++j) kt[hv][j] = load(k + std::min<int64_t>(s0 + j, rows.S - 1) * H + hv * L);
      transpose(kt[hv]);
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = it.q + g * H;
      f16v a0 = {}, a1 = {};
      for (int hv = 0; hv < HV; ++hv)
        for (int d = 0; d < L; d += 2) {
          a0 += qg[hv * L + d] * kt[hv][d];
          a1 += qg[hv * L + d + 1] * kt[hv][d + 1];
        }
      rows.put(g, s0, a0 + a1);
    }
  }
}

// out[r] = inv[r] * (sum over keys [s_lo, s_hi) of p[r * Sp + s] * v[s]), for R rows at once (each
// value read once for them), U keys deep so that at least 8 sums are in flight.
template <typename T, int HV, int R>
void weigh(const T* v, const float* p, const float* inv, int64_t Sp, int64_t s_lo, int64_t s_hi, float* out) {
  constexpr int H = HV * L, U = R * HV >= 8 ? 1 : 8 / (R * HV);
  f16v acc[U][R][HV] = {};
  int64_t s = s_lo;
  for (; s + U <= s_hi; s += U)
    for (int u = 0; u < U; ++u) {
      f16v vv[HV];
      for (int hv = 0; hv < HV; ++hv) vv[hv] = load(v + (s + u) * H + hv * L);
      for (int r = 0; r < R; ++r) {
        const float w = p[r * Sp + s + u];
        for (int hv = 0; hv < HV; ++hv) acc[u][r][hv] += w * vv[hv];
      }
    }
  for (; s < s_hi; ++s)
    for (int hv = 0; hv < HV; ++hv) {
      const f16v vv = load(v + s * H + hv * L);
      for (int r = 0; r < R; ++r) acc[0][r][hv] += p[r * Sp + s] * vv;
    }
  for (int r = 0; r < R; ++r)
    for (int hv = 0; hv < HV; ++hv) {
      f16v o = acc[0][r][hv];
      for (int u = 1; u < U; ++u) o += acc[u][r][hv];
      o *= inv[r];
      std::memcpy(out + r * H + hv * L, &o, sizeof(o));
    }
}

// The G rows' weighted values, in runs of as many rows as 16 accumulators hold.
template <typename T, int HV>
void values(const Item& it, int64_t G, int64_t Sp, int64_t s_lo, int64_t s_hi, const float* l, const float* inv) {
  const T* v = static_cast<const T*>(it.v);
  constexpr int H = HV * L;
  int64_t g = 0;
  if constexpr (8 * HV <= 16)
    for (; g + 8 <= G; g += 8) weigh<T, HV, 8>(v, l + g * Sp, inv + g, Sp, s_lo, s_hi, it.out + g * H);
  if constexpr (4 * HV <= 16)
    for (; g + 4 <= G; g += 4) weigh<T, HV, 4>(v, l + g * Sp, inv + g, Sp, s_lo, s_hi, it.out + g * H);
  if constexpr (2 * HV <= 16)
    for (; g + 2 <= G; g += 2) weigh<T, HV, 2>(v, l + g * Sp, inv + g, Sp, s_lo, s_hi, it.out + g * H);
  for (; g < G; ++g) weigh<T, HV, 1>(v, l + g * Sp, inv + g, Sp, s_lo, s_hi, it.out + g * H);
}

// Vectors of scratch one item of G rows over S keys takes (Sp = S rounded up to 16).
inline int64_t scratch_size(int64_t G, int64_t Sp) { return G + (G * Sp + Sp) / L + (G + L - 1) / L; }

// One item: its rows' logits over the visible keys' blocks, each row's softmax over them (its sum
// applied to the output), the weighted values of the visible span.
template <typename T, int HV>
void attend(const Item& it, int64_t G, int64_t S, f16v* scratch) {
  constexpr bool quant = std::is_same_v<T, int8_t>;
  const int64_t Sp = (S + L - 1) / L * L;
  f16v* mx = scratch;                                  // [G] the rows' running maxima
  float* l = reinterpret_cast<float*>(scratch + G);    // [G, Sp] logits, then unnormalized weights
  float* live = l + G * Sp;                            // [Sp]
  float* inv = live + Sp;                              // [G] 1 / each row's sum of weights
  bool any = false;
  for (int64_t s = 0; s < Sp; ++s) {
    live[s] = s < S && (!it.mask || it.mask[s]) ? 1.f : 0.f;
    any |= live[s] != 0.f;
  }
  if (!any) std::fill(live, live + S, 1.f);  // every key hidden: the softmax of equal logits, uniform
  int64_t first = 0, last = S - 1;  // the visible keys' span
  while (live[first] == 0.f) ++first;
  while (live[last] == 0.f) --last;
  const int64_t b0 = first / L * L, b1 = (last / L + 1) * L;  // in whole blocks of L keys
  for (int64_t g = 0; g < G; ++g) mx[g] = splat(-3.0e38f);
  const Rows rows{l, Sp, S, live, it.ks, it.bias, it.bias_stride, any, mx};
  if (G == 1)
    logits_one<T, HV>(it, b0, b1, rows);
  else
    logits_grouped<T, HV>(it, G, b0, b1, rows);
  for (int64_t g = 0; g < G; ++g) {
    float* lg = l + g * Sp;
    const float m = lane_max(mx[g]);
    f16v sum = {};
    for (int64_t s0 = b0; s0 < b1; s0 += L) {
      const f16v x = load(lg + s0) - m;
      f16v p = load(live + s0) * exp_neg(x > kFloor ? x : kFloor);
      sum += p;
      if constexpr (quant) p *= load_part(it.vs + s0, S - s0);
      std::memcpy(lg + s0, &p, sizeof(p));
    }
    inv[g] = 1.f / lane_sum(sum);
  }
  values<T, HV>(it, G, Sp, first, last + 1, l, inv);
}

template <typename T>
ffi::Error Attend(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                  ffi::Buffer<ffi::F32> ks, ffi::Buffer<ffi::F32> vs, ffi::Buffer<ffi::F32> bias,
                  ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions();  // [B, N, H]
  auto kd = k.dimensions();  // [B, K, S, H]
  const int64_t B = qd[0], N = qd[1], H = qd[2], K = kd[1], S = kd[2], G = N / K;
  if (H % L || H > 8 * L) return ffi::Error::InvalidArgument("head dim must be a multiple of 16, at most 128");
  const bool quant = ks.element_count() > 0;
  const int64_t bias_b = bias.element_count() ? bias.dimensions()[0] : 0;  // [1 or B, N, S]
  const int64_t mask_b = mask.element_count() ? mask.dimensions()[0] : 0;  // [1 or B, S]
  const float* qp = q.typed_data();
  const T* kp = static_cast<const T*>(k.untyped_data());
  const T* vp = static_cast<const T*>(v.untyped_data());
  const float* bp = bias_b ? bias.typed_data() : nullptr;
  const bool* mp = mask_b ? mask.typed_data() : nullptr;
  float* op = out->typed_data();
  const int64_t Sp = (S + L - 1) / L * L;
  const int64_t items = B * K;
  auto one = [=](int64_t i, f16v* scratch) {
    const int64_t b = i / K, kh = i % K;
    Item it{qp + (b * N + kh * G) * H, kp + i * S * H, vp + i * S * H,
            quant ? ks.typed_data() + i * S : nullptr, quant ? vs.typed_data() + i * S : nullptr,
            bp ? bp + ((bias_b == 1 ? 0 : b) * N + kh * G) * S : nullptr, S,
            mp ? mp + (mask_b == 1 ? 0 : b) * S : nullptr, op + (b * N + kh * G) * H};
    switch (H / L) {
      case 1: attend<T, 1>(it, G, S, scratch); break;
      case 2: attend<T, 2>(it, G, S, scratch); break;
      case 3: attend<T, 3>(it, G, S, scratch); break;
      case 4: attend<T, 4>(it, G, S, scratch); break;
      case 5: attend<T, 5>(it, G, S, scratch); break;
      case 6: attend<T, 6>(it, G, S, scratch); break;
      case 7: attend<T, 7>(it, G, S, scratch); break;
      default: attend<T, 8>(it, G, S, scratch); break;
    }
  };
  // The items are taken a few at a time from a shared counter, by this thread and by helpers it
  // schedules on XLA's intra-op pool. It never waits for a helper that has not started (it takes
  // what is left itself; a late helper finds nothing), only for items a helper is running: no
  // spinning on a busy machine.
  struct Shared {
    alignas(64) std::atomic<int64_t> next{0};
    alignas(64) std::atomic<int64_t> done{0};
  };
  auto shared = std::make_shared<Shared>();
  const int64_t helpers = std::min(items, std::max<int64_t>(1, pool.num_threads())) - 1;
  const int64_t chunk = std::max<int64_t>(1, items / (4 * (helpers + 1)));  // items per take
  auto drain = [=] {
    std::vector<f16v> scratch;
    for (int64_t lo; (lo = shared->next.fetch_add(chunk, std::memory_order_relaxed)) < items;) {
      if (scratch.empty()) scratch.resize(scratch_size(G, Sp));
      const int64_t hi = std::min(items, lo + chunk);
      for (int64_t i = lo; i < hi; ++i) one(i, scratch.data());
      shared->done.fetch_add(hi - lo, std::memory_order_release);
    }
  };
  for (int64_t p = 0; p < helpers; ++p) pool.Schedule([drain] { drain(); });
  drain();
  while (shared->done.load(std::memory_order_acquire) < items) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

#define BIND                                                                                       \
  ffi::Ffi::Bind()                                                                                 \
      .Ctx<ffi::ThreadPool>()                                                                      \
      .Arg<ffi::Buffer<ffi::F32>>()                                                                \
      .Arg<ffi::AnyBuffer>()                                                                       \
      .Arg<ffi::AnyBuffer>()                                                                       \
      .Arg<ffi::Buffer<ffi::F32>>()                                                                \
      .Arg<ffi::Buffer<ffi::F32>>()                                                                \
      .Arg<ffi::Buffer<ffi::F32>>()                                                                \
      .Arg<ffi::Buffer<ffi::PRED>>()                                                               \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(GqaAttendF32, Attend<float>, BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(GqaAttendS8, Attend<int8_t>, BIND);
