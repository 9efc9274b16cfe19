// The CPU decode step's greedy token (gqa_jax/cpu_kernels.py builds and calls it): for each of B
// rows of logits laid out [V, B] (the step's out-major output layer), the first index of the row's
// largest logit, or of its first NaN: jnp.argmax's answer.
//
// 16 rows at a time (fewer than 16 that divide 16: 16 / B tokens of every row in one vector, its
// lanes merged per row at the end), the vocabulary in four runs side by side (four independent
// chains of compares), merged in order so that a tie keeps the first index. A NaN is found by its
// bits, which -ffast-math leaves alone. One thread: the logits are 1 MB at the mini's shape, read in
// about as long as a helper on XLA's pool takes to start.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu_vectors.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace gqa_jax_cpu;

struct Best {
  f16v x;    // the largest logit so far (a NaN once one was seen)
  i16v at;   // its index
  i16v nan;  // all ones once a NaN was taken
};

inline i16v is_nan(f16v x) {
  i16v bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7fffffff) > 0x7f800000;
}

// b with x at index at taken in, every index b has seen being before at.
inline void take(Best& b, f16v x, i16v at) {
  const i16v now = ((x > b.x) | is_nan(x)) & ~b.nan;
  b.x = now ? x : b.x;
  b.at = now ? at : b.at;
  b.nan |= is_nan(x);
}

// a with b merged in, every index b has seen being after a's.
inline void merge(Best& a, const Best& b) {
  const i16v now = (((b.x > a.x) & ~b.nan) | b.nan) & ~a.nan;  // a NaN, else larger
  a.x = now ? b.x : a.x;
  a.at = now ? b.at : a.at;
  a.nan |= b.nan;
}

// The four runs over n vectors at x, x + stride, ...; vector u's lane i holds index u * step +
// first[i]. Returns the runs merged: each lane's best over its own indices.
Best runs(const float* x, int64_t n, int64_t stride, int32_t step, i16v first) {
  constexpr int R = 4;
  const int64_t run = (n + R - 1) / R;
  Best b[R];
  for (int r = 0; r < R; ++r) {  // each run starts at its first vector (past n: the last, taken again)
    const int64_t u = std::min(n - 1, r * run);
    const f16v x0 = load(x + u * stride);
    b[r] = {x0, first + static_cast<int32_t>(u * step), is_nan(x0)};
  }
  for (int64_t v = 1; v < run; ++v)
    for (int r = 0; r < R; ++r)
      if (r * run + v < n) take(b[r], load(x + (r * run + v) * stride), first + static_cast<int32_t>((r * run + v) * step));
  for (int r = 1; r < R; ++r) merge(b[0], b[r]);
  return b[0];
}

bool nan_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7fffffffu) > 0x7f800000u;
}

// One row's best (value x at index at) with a candidate y at index v: a NaN wins and stays, else the
// larger, else (a tie) the smaller index.
void better(float& x, int32_t& at, float y, int32_t v) {
  const bool xn = nan_bits(x), yn = nan_bits(y);
  if (xn != yn ? yn : (xn ? v < at : (y > x || (y == x && v < at)))) x = y, at = v;
}

// B < 16 rows, 16 % B == 0: lane i of a vector is row i % B, its tokens 16 / B apart; the lanes of a
// row merged, then the tokens past the last whole vector one at a time.
void argmax_narrow(const float* x, int64_t V, int64_t B, int32_t* out) {
  const int64_t P = L / B, n = V / P;  // tokens per vector, whole vectors
  float best[L];
  int32_t at[L];
  for (int64_t b = 0; b < B; ++b) best[b] = x[b], at[b] = 0;
  if (n > 0) {
    i16v first;
    for (int i = 0; i < L; ++i) first[i] = static_cast<int32_t>(i / B);
    const Best r = runs(x, n, L, static_cast<int32_t>(P), first);
    for (int i = 0; i < L; ++i) better(best[i % B], at[i % B], r.x[i], r.at[i]);
  }
  for (int64_t v = n * P; v < V; ++v)
    for (int64_t b = 0; b < B; ++b) better(best[b], at[b], x[v * B + b], static_cast<int32_t>(v));
  for (int64_t b = 0; b < B; ++b) out[b] = at[b];
}

ffi::Error Argmax(ffi::Buffer<ffi::F32> logits, ffi::ResultBuffer<ffi::S32> out) {
  auto d = logits.dimensions();  // [V, B]
  const int64_t V = d[0], B = d[1];
  if (V < 1) return ffi::Error::InvalidArgument("argmax over an empty vocabulary");
  const float* x = logits.typed_data();
  int32_t* o = out->typed_data();
  if (B < L && L % B == 0) {  // 1, 2, 4 or 8 rows
    argmax_narrow(x, V, B, o);
    return ffi::Error::Success();
  }
  const i16v first = {};  // every lane's first index: 0
  int64_t b0 = 0;
  for (; b0 + L <= B; b0 += L) {  // 16 rows at a time
    const Best r = runs(x + b0, V, B, 1, first);
    std::memcpy(o + b0, &r.at, sizeof(r.at));
  }
  for (; b0 < B; ++b0) {  // the last rows, one at a time
    float best = x[b0];
    int32_t at = 0;
    for (int64_t v = 1; v < V; ++v) better(best, at, x[v * B + b0], static_cast<int32_t>(v));
    o[b0] = at;
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GqaArgmax, Argmax,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::S32>>());
