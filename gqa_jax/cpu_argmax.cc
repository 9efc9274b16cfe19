// The CPU decode step's greedy token (gqa_jax/cpu_kernels.py builds and calls it): for each of B
// rows of logits laid out [V, B] (the step's out-major output layer), the first index of the row's
// largest logit, or of its first NaN: jnp.argmax's answer.
//
// 16 rows at a time, the vocabulary in four runs side by side (four independent chains of
// compares), merged in order so that a tie keeps the first index. A NaN is found by its bits, which
// -ffast-math leaves alone. One thread: the logits are 1 MB at the mini's shape, read in about as
// long as a helper on XLA's pool takes to start.
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
  const i16v now = ((b.x > a.x) & ~b.nan | b.nan) & ~a.nan;
  a.x = now ? b.x : a.x;
  a.at = now ? b.at : a.at;
  a.nan |= b.nan;
}

void argmax16(const float* x, int64_t V, int64_t B, int32_t* out) {  // 16 rows, from column x
  constexpr int R = 4;
  const int64_t run = (V + R - 1) / R;
  Best b[R];
  for (int r = 0; r < R; ++r) {  // each run starts at its first index (past V: the last, taken again)
    const int64_t at = std::min(V - 1, r * run);
    const f16v x0 = load(x + at * B);
    b[r] = {x0, i16v{} + static_cast<int32_t>(at), is_nan(x0)};
  }
  for (int64_t v = 1; v < run; ++v)
    for (int r = 0; r < R; ++r)
      if (r * run + v < V) take(b[r], load(x + (r * run + v) * B), i16v{} + static_cast<int32_t>(r * run + v));
  for (int r = 1; r < R; ++r) merge(b[0], b[r]);
  std::memcpy(out, &b[0].at, sizeof(b[0].at));
}

bool nan_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7fffffffu) > 0x7f800000u;
}

ffi::Error Argmax(ffi::Buffer<ffi::F32> logits, ffi::ResultBuffer<ffi::S32> out) {
  auto d = logits.dimensions();  // [V, B]
  const int64_t V = d[0], B = d[1];
  if (V < 1) return ffi::Error::InvalidArgument("argmax over an empty vocabulary");
  const float* x = logits.typed_data();
  int32_t* o = out->typed_data();
  int64_t b0 = 0;
  for (; b0 + L <= B; b0 += L) argmax16(x + b0, V, B, o + b0);
  for (; b0 < B; ++b0) {  // the last rows, one at a time
    int64_t at = 0;
    for (int64_t v = 1; v < V && !nan_bits(x[at * B + b0]); ++v)
      if (nan_bits(x[v * B + b0]) || x[v * B + b0] > x[at * B + b0]) at = v;
    o[b0] = static_cast<int32_t>(at);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GqaArgmax, Argmax,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::S32>>());
