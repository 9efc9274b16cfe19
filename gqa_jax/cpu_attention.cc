// The CPU decode step's attention (gqa_jax/cpu_attention.py builds and calls it): one query
// position of N heads over a cache of K key/value heads, G = N / K query heads per K/V head.
//
// One work item is a (batch row, K/V head): its G query rows, its S cached keys and values. The
// items are split over XLA's intra-op threads. Within an item the cache is read once, in order,
// and no key or value is ever copied: the logits of a block of 16 keys are 16 vector products
// summed across by one transpose (transpose_sum), and the values are accumulated four keys deep.
// Only the visible keys' blocks are scored and only visible values read (a decode step's self
// cache is visible up to its position). The math is grouped_attention's (gqa_jax/attention.py):
// logits q.k, times an int8 key's scale, plus the bias; hidden keys get weight 0, and a row with
// every key hidden attends uniformly, as a softmax over the masked logit does; a value's scale
// multiplies its weight.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float f16v __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register
constexpr int L = 16;  // lanes of an f16v; a head's dim is a multiple of L
constexpr float kFloor = -80.f;  // exp() argument floor: exp(-80) ~ 2e-35, a normal float

template <typename T>
inline f16v load(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    f16v x;
    std::memcpy(&x, p, sizeof(x));
    return x;
  } else {
#if defined(__AVX512F__)
    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    f16v r;
    std::memcpy(&r, &x, sizeof(r));
    return r;
#elif defined(__AVX2__)
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
    f16v r;
    std::memcpy(&r, &lo, 32);
    std::memcpy(reinterpret_cast<char*>(&r) + 32, &hi, 32);
    return r;
#else
    f16v r;
    for (int i = 0; i < L; ++i) r[i] = static_cast<float>(p[i]);
    return r;
#endif
  }
}

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

// Logits l [G, Sp] of G query rows over the keys of blocks [b0, b1) (Sp = S rounded up to 16),
// H = HV * 16: each key times each query row, 16 keys' products summed across at once.
template <typename T, int HV>
void logits(const Item& it, int64_t G, int64_t S, int64_t Sp, int64_t b0, int64_t b1, float* l) {
  const T* k = static_cast<const T*>(it.k);
  constexpr int H = HV * L;
  f16v qv[HV];
  for (int64_t g = 0; g < G; ++g) {
    for (int hv = 0; hv < HV; ++hv) qv[hv] = load(it.q + g * H + hv * L);
    for (int64_t s0 = b0; s0 < b1; s0 += L) {
      f16v x[L];
      for (int j = 0; j < L; ++j) {
        const int64_t s = std::min<int64_t>(s0 + j, S - 1);
        f16v p = qv[0] * load(k + s * H);
        for (int hv = 1; hv < HV; ++hv) p += qv[hv] * load(k + s * H + hv * L);
        x[j] = p;
      }
      f16v d = transpose_sum(x);
      std::memcpy(l + g * Sp + s0, &d, sizeof(d));
    }
  }
}

template <typename T, int HV>
void attend(const Item& it, int64_t G, int64_t S, float* scratch) {
  constexpr int H = HV * L;
  const int64_t Sp = (S + L - 1) / L * L;
  float* l = scratch;          // [G, Sp]
  float* live = l + G * Sp;    // [S]
  bool any = false;
  for (int64_t s = 0; s < S; ++s) {
    live[s] = (!it.mask || it.mask[s]) ? 1.f : 0.f;
    any |= live[s] != 0.f;
  }
  if (!any) std::fill(live, live + S, 1.f);  // every key hidden: the softmax of equal logits, uniform
  int64_t first = 0, last = S - 1;  // the visible keys' span, in whole blocks of L keys
  while (live[first] == 0.f) ++first;
  while (live[last] == 0.f) --last;
  const int64_t b0 = first / L * L, b1 = std::min(Sp, (last / L + 1) * L), e = std::min(b1, S);
  logits<T, HV>(it, G, S, Sp, b0, b1, l);
  for (int64_t g = 0; g < G; ++g) {
    float* lg = l + g * Sp;
    for (int64_t s = b0; s < e; ++s) {
      const float x = any ? lg[s] * (it.ks ? it.ks[s] : 1.f) + (it.bias ? it.bias[g * it.bias_stride + s] : 0.f) : 0.f;
      lg[s] = live[s] != 0.f ? x : -3.0e38f;
    }
    float mx = -3.0e38f;
    for (int64_t s = b0; s < e; ++s) mx = std::max(mx, lg[s]);
    float sum = 0.f;
    for (int64_t s = b0; s < e; ++s) {
      const float p = live[s] * std::exp(std::max(lg[s] - mx, kFloor));
      lg[s] = p;
      sum += p;
    }
    const float inv = 1.f / sum;
    for (int64_t s = b0; s < e; ++s) lg[s] *= inv * (it.vs ? it.vs[s] : 1.f);
  }
  // The weighted values, visible keys only (a hidden key's weight is 0), four accumulators deep.
  int32_t* idx = reinterpret_cast<int32_t*>(live + S);  // [S] the visible keys
  int64_t n = 0;
  for (int64_t s = 0; s < S; ++s)
    if (live[s] != 0.f) idx[n++] = static_cast<int32_t>(s);
  const T* v = static_cast<const T*>(it.v);
  for (int64_t g = 0; g < G; ++g) {
    const float* pg = l + g * Sp;
    f16v acc[4][HV] = {};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int u = 0; u < 4; ++u) {
        const int64_t s = idx[i + u];
        for (int hv = 0; hv < HV; ++hv) acc[u][hv] += pg[s] * load(v + s * H + hv * L);
      }
    for (; i < n; ++i)
      for (int hv = 0; hv < HV; ++hv) acc[0][hv] += pg[idx[i]] * load(v + idx[i] * H + hv * L);
    for (int hv = 0; hv < HV; ++hv) {
      const f16v o = (acc[0][hv] + acc[1][hv]) + (acc[2][hv] + acc[3][hv]);
      std::memcpy(it.out + g * H + hv * L, &o, sizeof(o));
    }
  }
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
  auto one = [=](int64_t i, float* scratch) {
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
    std::vector<float> scratch;
    for (int64_t lo; (lo = shared->next.fetch_add(chunk, std::memory_order_relaxed)) < items;) {
      if (scratch.empty()) scratch.resize(G * Sp + 2 * S);
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
