// Helpers shared by the native Verilator drivers (vplayer.cpp, harness.cpp): moving bytes in and
// out of Verilated ports of any width, and the random number generator behind idle and stall
// cycles.
//
// A Verilated port of up to 64 bits is an unsigned integer (CData, SData, IData, QData); a wider
// one is a VlWide<W> of 32-bit words, least significant first. Byte i of a port is its bits
// 8*i+7..8*i (lane i of a tdata).

#pragma once

#include <cstddef>
#include <cstdint>

#include "verilated.h"

namespace vports {

// Drive `port` with the `n` little-endian bytes at `bytes` (higher bits zero).
template <typename T> inline void put(T &port, const uint8_t *bytes, int n) {
    T value = 0;
    for (int i = n - 1; i >= 0; --i) value = static_cast<T>((value << 8) | bytes[i]);
    port = value;
}

template <std::size_t W> inline void put(VlWide<W> &port, const uint8_t *bytes, int n) {
    for (std::size_t w = 0; w < W; ++w) {
        uint32_t word = 0;
        for (int k = 3; k >= 0; --k) {
            int i = static_cast<int>(w) * 4 + k;
            word = (word << 8) | (i < n ? bytes[i] : 0);
        }
        port[w] = word;
    }
}

// The low `n` bytes of `port`, little-endian, into `bytes`.
template <typename T> inline void get(const T &port, uint8_t *bytes, int n) {
    uint64_t value = port;
    for (int i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(value >> (8 * i));
}

template <std::size_t W> inline void get(const VlWide<W> &port, uint8_t *bytes, int n) {
    for (int i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(port[i / 4] >> (8 * (i % 4)));
}

// xorshift64*: fast, and the same sequence for the same seed on every machine.
class Random {
  public:
    explicit Random(uint64_t seed = 0) { reseed(seed); }
    void reseed(uint64_t seed) { state_ = seed * 0x9E3779B97F4A7C15ULL + 1; }
    uint32_t next() {
        state_ ^= state_ >> 12;
        state_ ^= state_ << 25;
        state_ ^= state_ >> 27;
        return static_cast<uint32_t>((state_ * 2685821657736338717ULL) >> 32);
    }

  private:
    uint64_t state_;
};

}  // namespace vports
