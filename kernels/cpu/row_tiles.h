// The split of x rows into tiles of at most 4 that every projection kernel's block product is
// instantiated for (kernels/cpu/w4a8.cpp, w8a16.cpp, kernels/cpu_avx2/w4a8.cpp). Plain C++: no
// instruction set of its own, so the AVX2 library includes it as well.

#pragma once

#include <cstdint>
#include <type_traits>

namespace structserve_cpu {

// Calls tile(std::integral_constant<int, MR>{}, m) for consecutive tiles of MR x rows starting at
// m, covering rows 0 .. M - 1: tiles of 4, then one of 3, 2 or 1 for the rest. A row's result must
// not depend on its tile, so the tile's size only decides how many rows share each weight load.
template <class Tile>
inline void for_row_tiles(int64_t M, Tile&& tile) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile(std::integral_constant<int, 4>{}, m);
  switch (M - m) {
    case 3: tile(std::integral_constant<int, 3>{}, m); break;
    case 2: tile(std::integral_constant<int, 2>{}, m); break;
    case 1: tile(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

}  // namespace structserve_cpu
