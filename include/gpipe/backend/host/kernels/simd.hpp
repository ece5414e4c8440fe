#pragma once
// Short SIMD vectors for the host backend's elementwise kernels, as GCC/Clang vector extensions:
// they compile to SIMD instructions at every optimization level (GCC's -O2 vectorizes no loop
// whose trip count is unknown), and exact aliasing of an input and the output is fine, since each
// pack is loaded before it is stored. 16 bytes: the width every x86-64 and AArch64 CPU has, and
// enough for loops that move data rather than compute on it.
//
//   transform(n, f, out, in...):  out[i] = f(in[i]...) for i < n; f is called with packs of
//                                 width_v<T> elements, then with scalars for the tail, so it is a
//                                 generic lambda written with +, -, *, /, comparisons and ?:.

#include <cstddef>
#include <cstring>

namespace gpipe::host::simd {

template <class T>
struct PackOf;
template <>
struct PackOf<float> {
  typedef float type __attribute__((vector_size(16)));
};
template <>
struct PackOf<double> {
  typedef double type __attribute__((vector_size(16)));
};
// Pack<T>: width_v<T> elements of T.
template <class T>
using Pack = typename PackOf<T>::type;
template <class T>
inline constexpr std::size_t width_v = sizeof(Pack<T>) / sizeof(T);

template <class T>
Pack<T> load(const T* p) {
  Pack<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void store(T* p, const Pack<T>& v) {
  std::memcpy(p, &v, sizeof v);
}

template <class T, class F, class... In>
void transform(std::size_t n, F f, T* out, const In*... in) {
  constexpr std::size_t w = width_v<T>;
  const std::size_t packed = n - n % w;
  for (std::size_t i = 0; i < packed; i += w) store(out + i, f(load(in + i)...));
  for (std::size_t j = 0; j < n % w; ++j) out[packed + j] = f(in[packed + j]...);
}

}  // namespace gpipe::host::simd
