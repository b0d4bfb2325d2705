// Beat player: a native Verilator driver for one AXI-Stream input and one AXI-Stream output.
//
// cocotb drives signals from Python a cycle at a time, which caps it near 10^5 cycles per second.
// Bulk checks (millions of beats) and cycle-exact benchmarks run here instead: this program plays
// beats prepared by iwarp_tb.beats into s_axis, holds m_axis_tready low at random, and records
// every m_axis transfer with its cycle. It knows nothing of packets: splitting and reassembly
// stay in Python, in one place.
//
// Build-time defines (set by iwarp_tb.runner): VTOP (the Verilated class), VTOP_H (its header),
// IN_BYTES, OUT_BYTES, and HAS_S_TKEEP/HAS_S_TLAST/HAS_S_TUSER/HAS_M_TKEEP/HAS_M_TLAST/HAS_M_TUSER.
//
// Usage: vplayer STIMULUS OUTPUT SEED IDLE_PERCENT READY_PERCENT DRAIN_CYCLES
//   STIMULUS: columns {u64 n; u8 data[n][IN_BYTES]; u64 keep[n]; u8 last[n]; u8 user[n]}
//             (iwarp_tb.beats.to_columns writes them)
//   OUTPUT:   records {u64 cycle; u8 last; u8 user; u64 keep; u8 data[OUT_BYTES]}
// Before offering each beat it idles (valid low) for a cycle with probability IDLE_PERCENT/100,
// repeatedly; each cycle it drives m_axis_tready high with probability READY_PERCENT/100.
// After the last input beat is accepted it runs until DRAIN_CYCLES pass with no output transfer.
// If the DUT makes no transfer at all for DRAIN_CYCLES while a beat waits, it reports a hang and
// exits with status 3.
// Prints one JSON line: cycles, first and last input cycles, last output cycle, counts.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "verilated.h"
#include VTOP_H
#include "vports.h"

using vports::get;
using vports::put;

bool read_all(FILE *f, void *buf, std::size_t size) {
    return size == 0 || std::fread(buf, size, 1, f) == 1;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        std::fprintf(stderr, "usage: %s STIMULUS OUTPUT SEED IDLE_PERCENT READY_PERCENT DRAIN\n",
                     argv[0]);
        return 2;
    }
    FILE *in = std::fopen(argv[1], "rb");
    FILE *out = std::fopen(argv[2], "wb");
    if (!in || !out) {
        std::perror("vplayer: open");
        return 2;
    }
    vports::Random random{std::strtoull(argv[3], nullptr, 0)};
    const uint32_t idle_percent = std::strtoul(argv[4], nullptr, 0);
    const uint32_t ready_percent = std::strtoul(argv[5], nullptr, 0);
    const uint64_t drain = std::strtoull(argv[6], nullptr, 0);

    uint64_t count = 0;
    if (!read_all(in, &count, 8)) count = 0;
    std::vector<uint8_t> data(count * IN_BYTES), last(count), user(count);
    std::vector<uint64_t> keep(count);
    if (!read_all(in, data.data(), data.size()) || !read_all(in, keep.data(), 8 * count) ||
        !read_all(in, last.data(), count) || !read_all(in, user.data(), count)) {
        std::fprintf(stderr, "vplayer: truncated stimulus\n");
        return 2;
    }
    std::fclose(in);
    VerilatedContext context;
    VTOP top{&context};
    top.clk = 0;
    top.rst = 1;
    top.s_axis_tvalid = 0;
    top.m_axis_tready = 0;
    for (int i = 0; i < 4; ++i) {
        top.clk = 0; top.eval();
        top.clk = 1; top.eval();
    }
    top.rst = 0;

    std::size_t next = 0;
    bool offering = false;  // a beat is on s_axis and must stay there until accepted
    uint64_t cycle = 0, quiet = 0, stuck = 0, first_in = UINT64_MAX, last_in = 0, last_out = 0;
    uint64_t outputs = 0;
    uint8_t out_data[OUT_BYTES];
    while (next < count || quiet < drain) {
        if (!offering && next < count)
            offering = !(idle_percent && random.next() % 100 < idle_percent);
        const bool offer = offering;
        top.s_axis_tvalid = offer;
        if (offer) {
            put(top.s_axis_tdata, &data[next * IN_BYTES], IN_BYTES);
#ifdef HAS_S_TKEEP
            top.s_axis_tkeep = keep[next];
#endif
#ifdef HAS_S_TLAST
            top.s_axis_tlast = last[next];
#endif
#ifdef HAS_S_TUSER
            top.s_axis_tuser = user[next];
#endif
        }
        const bool ready = random.next() % 100 < ready_percent;
        top.m_axis_tready = ready;
        top.clk = 0;
        top.eval();
        const bool in_fire = offer && top.s_axis_tready;
        const bool out_fire = ready && top.m_axis_tvalid;
        if (out_fire) {
            uint8_t out_last = 1, out_user = 0;
            uint64_t out_keep = 0;
            get(top.m_axis_tdata, out_data, OUT_BYTES);
#ifdef HAS_M_TKEEP
            out_keep = top.m_axis_tkeep;
#endif
#ifdef HAS_M_TLAST
            out_last = top.m_axis_tlast;
#endif
#ifdef HAS_M_TUSER
            out_user = top.m_axis_tuser;
#endif
            std::fwrite(&cycle, 8, 1, out);
            std::fwrite(&out_last, 1, 1, out);
            std::fwrite(&out_user, 1, 1, out);
            std::fwrite(&out_keep, 8, 1, out);
            std::fwrite(out_data, OUT_BYTES, 1, out);
            last_out = cycle;
            ++outputs;
        }
        top.clk = 1;
        top.eval();

        if (in_fire) {
            if (first_in == UINT64_MAX) first_in = cycle;
            last_in = cycle;
            ++next;
            offering = false;
        }
        quiet = (next < count || out_fire) ? 0 : quiet + 1;
        stuck = (offer && !in_fire && !out_fire) ? stuck + 1 : 0;
        if (stuck > drain) {
            std::fprintf(stderr, "vplayer: hang: input beat %zu of %zu not accepted for %llu "
                         "cycles and no output (cycle %llu)\n", next, (std::size_t)count,
                         (unsigned long long)stuck, (unsigned long long)cycle);
            return 3;
        }
        ++cycle;
    }
    std::fclose(out);
    top.final();
    std::printf("{\"cycles\": %llu, \"first_in_cycle\": %llu, \"last_in_cycle\": %llu, "
                "\"last_out_cycle\": %llu, \"in_beats\": %zu, \"out_transfers\": %llu}\n",
                (unsigned long long)cycle, (unsigned long long)(count ? first_in : 0),
                (unsigned long long)last_in, (unsigned long long)last_out, (std::size_t)count,
                (unsigned long long)outputs);
    return 0;
}
