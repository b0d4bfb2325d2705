// Native harness: one generated top-level module, Verilated into a shared library that Python
// drives through ctypes (iwarp_tb.harness). Everything per cycle happens here, so a simulation
// runs at millions of cycles per second; Python only queues work and collects results.
//
// What it drives, every cycle of the single clock `clk` (reset `rst` is held for 4 cycles first):
// * every AXI-Stream input (s_axis_*): queued transfers, one at a time, with an optional random
//   idle cycle before each (probability per stream, seeded);
// * every AXI-Stream output (m_axis_*): tready, high with a probability per stream (1 by
//   default), and a record of every transfer;
// * with HARNESS_PHY_GMII or HARNESS_PHY_XGMII, a PHY: queued Ethernet frames go into the
//   MAC's RX pins with preamble, SFD, FCS and a 12-byte gap (IEEE 802.3 clauses 35 and 46),
//   and frames on its TX pins are decoded, checked (preamble, FCS, PHY errors) and recorded.
//
// The per-top parts (which ports exist, their widths, the stream glue) come from
// harness_glue.h, which iwarp_tb.harness generates into the build folder from the port list; it
// defines make_streams, drive_streams, sample_streams, set_port, get_port and the PHY choice.
//
// Build-time defines: VTOP (the Verilated class), VTOP_H (its header), HARNESS_TRACE_FST or
// HARNESS_TRACE_VCD (a waveform of every cycle, when a path is given to hs_new).
//
// Per cycle: inputs and tready are driven, clk falls and the model settles, handshakes and PHY
// pins are sampled, clk rises. A transfer happens in the cycle where tvalid and tready are both
// high before the rising edge.

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "verilated.h"
#include VTOP_H
#include "vports.h"

#if defined(HARNESS_TRACE_FST)
#include "verilated_fst_c.h"
using Trace = VerilatedFstC;
#elif defined(HARNESS_TRACE_VCD)
#include "verilated_vcd_c.h"
using Trace = VerilatedVcdC;
#endif

#define HARNESS_API extern "C" __attribute__((visibility("default")))

namespace {

using vports::get;
using vports::put;

constexpr uint64_t kAlways = 1ULL << 32;

// A random event of a given probability: `threshold` out of 2^32 (0 never, kAlways always).
struct Chance {
    explicit Chance(uint64_t always) : threshold(always) {}
    bool draw() {
        if (threshold >= kAlways) return true;
        return threshold != 0 && random.next() < threshold;
    }
    uint64_t threshold;
    vports::Random random;
};

// Transfers of one stream, column by column: `bytes` of tdata each, tkeep, tlast, tuser.
struct Transfers {
    explicit Transfers(int tdata_bytes) : bytes(tdata_bytes) {}
    std::size_t size() const { return last.size(); }
    void clear() {
        data.clear();
        keep.clear();
        last.clear();
        user.clear();
    }
    int bytes;
    std::vector<uint8_t> data;
    std::vector<uint64_t> keep;
    std::vector<uint8_t> last, user;
};

// An s_axis port: transfers waiting to be offered, the one on the port, idle cycles.
struct Input : Transfers {
    explicit Input(int tdata_bytes) : Transfers(tdata_bytes), idle(0) {}
    // Whether a transfer is on the port this cycle (it stays there until accepted).
    bool offer() {
        if (!offering && head < size()) offering = !idle.draw();
        return offering;
    }
    const uint8_t *front_data() const { return &data[head * bytes]; }
    uint64_t front_keep() const { return keep[head]; }
    uint8_t front_last() const { return last[head]; }
    uint8_t front_user() const { return user[head]; }
    void accept() {
        offering = false;
        if (++head == size()) {
            clear();
            head = 0;
        }
    }
    std::size_t head = 0;
    bool offering = false;
    Chance idle;
};

// An m_axis port: tready (random) and the transfers it took.
struct Output : Transfers {
    explicit Output(int tdata_bytes) : Transfers(tdata_bytes), ready(kAlways) {}
    bool draw_ready() { return ready_now = ready.draw(); }
    // Record one transfer; true when it ends a packet (or the stream has no tlast).
    bool record(const uint8_t *tdata, uint64_t tkeep, uint8_t tlast, uint8_t tuser) {
        data.insert(data.end(), tdata, tdata + bytes);
        keep.push_back(tkeep);
        last.push_back(tlast);
        user.push_back(tuser);
        return tlast;
    }
    bool ready_now = false;
    Chance ready;
};

}  // namespace

#include "harness_glue.h"

namespace {

// IEEE 802.3 clause 3.2.9: CRC-32, reflected, sent least significant byte first.
uint32_t crc32(const uint8_t *bytes, std::size_t n) {
    static uint32_t table[256];
    if (!table[1]) {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? 0xEDB88320u : 0);
            table[i] = c;
        }
    }
    uint32_t crc = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

constexpr uint8_t kPreamble = 0x55, kSfd = 0xD5;
constexpr int kGap = 12;       // minimum inter-packet gap in bytes (clause 4.4.2)
constexpr std::size_t kMaxRaw = 1 << 16;  // a TX frame longer than this is cut and flagged

// Flags of a decoded TX frame (hs_take_frames).
constexpr uint8_t kBadFcs = 1, kPhyError = 2, kBadPreamble = 4;

#if defined(HARNESS_PHY_GMII) || defined(HARNESS_PHY_XGMII)
#define HARNESS_PHY 1

// One cycle on the PHY's pins: GMII data = rxd, ctrl = rx_dv; XGMII data = rxd, ctrl = rxc.
struct LineWord {
    uint64_t data;
    uint8_t ctrl;
};

#if defined(HARNESS_PHY_GMII)
constexpr int kPreambleBytes = 7;  // before the SFD
constexpr LineWord kIdle{0, 0};

void encode(const std::vector<uint8_t> &frame, std::vector<LineWord> &line) {
    for (int i = 0; i < kPreambleBytes; ++i) line.push_back({kPreamble, 1});
    line.push_back({kSfd, 1});
    for (uint8_t byte : frame) line.push_back({byte, 1});
    for (int i = 0; i < kGap; ++i) line.push_back(kIdle);
}
#else
constexpr uint8_t kStart = 0xFB, kTerminate = 0xFD, kIdleChar = 0x07, kErrorChar = 0xFE;
constexpr int kPreambleBytes = 6;  // between /S/ and the SFD
constexpr LineWord kIdle{0x0707070707070707ULL, 0xFF};

// /S/ in lane 0, preamble, SFD, frame, /T/, then idles up to a 12-byte gap and to the end of a
// word, so every start is in lane 0.
void encode(const std::vector<uint8_t> &frame, std::vector<LineWord> &line) {
    std::vector<std::pair<uint8_t, bool>> chars;
    chars.push_back({kStart, true});
    for (int i = 0; i < kPreambleBytes; ++i) chars.push_back({kPreamble, false});
    chars.push_back({kSfd, false});
    for (uint8_t byte : frame) chars.push_back({byte, false});
    chars.push_back({kTerminate, true});
    for (int i = 1; i < kGap || chars.size() % 8; ++i) chars.push_back({kIdleChar, true});
    for (std::size_t w = 0; w < chars.size(); w += 8) {
        LineWord word{0, 0};
        for (int j = 0; j < 8; ++j) {
            word.data |= uint64_t(chars[w + j].first) << (8 * j);
            word.ctrl |= uint8_t(chars[w + j].second) << j;
        }
        line.push_back(word);
    }
}
#endif

// The PHY: frames into the MAC's RX pins, frames from its TX pins.
class Phy {
  public:
    void send(const uint8_t *frame, std::size_t n, bool bad_fcs) {
        std::vector<uint8_t> bytes(frame, frame + n);
        uint32_t fcs = crc32(frame, n) ^ (bad_fcs ? 1u : 0u);
        for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(fcs >> (8 * i)));
        queue_.push_back(std::move(bytes));
    }

    // The word on the RX pins this cycle.
    LineWord next_rx() {
        if (pos_ == line_.size()) {
            line_.clear();
            pos_ = 0;
            if (queue_.empty()) return kIdle;
            encode(queue_.front(), line_);
            queue_.pop_front();
        }
        return line_[pos_++];
    }

    // Decode the TX pins of one cycle; true when a frame ended.
    bool sample_tx(uint64_t data, uint8_t ctrl, bool error, uint64_t cycle) {
#if defined(HARNESS_PHY_GMII)
        if (ctrl) {
            raw_.push_back(static_cast<uint8_t>(data));
            in_frame_ = true;
            error_ |= error;
            if (raw_.size() < kMaxRaw) return false;
            error_ = true;
        }
        if (!in_frame_) return false;
        finish(cycle);
        return true;
#else
        (void)error;
        bool ended = false;
        for (int j = 0; j < 8; ++j) {
            const uint8_t byte = static_cast<uint8_t>(data >> (8 * j));
            const bool is_ctrl = (ctrl >> j) & 1;
            if (!in_frame_) {
                in_frame_ = is_ctrl && byte == kStart && (j == 0 || j == 4);
                continue;
            }
            if (!is_ctrl || byte == kErrorChar) {
                raw_.push_back(byte);
                error_ |= is_ctrl;
                if (raw_.size() < kMaxRaw) continue;
            }
            error_ |= !is_ctrl || byte != kTerminate;
            finish(cycle);
            ended = true;
        }
        return ended;
#endif
    }

    std::vector<uint8_t> records;  // {u64 cycle; u32 length; u8 flags; u8 frame[length]}

  private:
    // Check and record the frame in raw_ (preamble, SFD, frame, FCS).
    void finish(uint64_t cycle) {
        uint8_t flags = error_ ? kPhyError : 0;
        std::size_t start = 0;
        while (start < raw_.size() && raw_[start] == kPreamble) ++start;
        if (start != kPreambleBytes || start == raw_.size() || raw_[start] != kSfd)
            flags |= kBadPreamble;
        else
            ++start;
        const uint8_t *frame = raw_.data() + start;
        std::size_t n = raw_.size() - start;
        if (n >= 4) {
            n -= 4;
            uint32_t fcs = 0;
            for (int i = 3; i >= 0; --i) fcs = (fcs << 8) | frame[n + i];
            if (fcs != crc32(frame, n)) flags |= kBadFcs;
        } else {
            flags |= kBadFcs;
            n = 0;
        }
        const uint32_t length = static_cast<uint32_t>(n);
        const std::size_t at = records.size();
        records.resize(at + 13 + n);
        std::memcpy(&records[at], &cycle, 8);
        std::memcpy(&records[at + 8], &length, 4);
        records[at + 12] = flags;
        if (n) std::memcpy(&records[at + 13], frame, n);
        raw_.clear();
        in_frame_ = false;
        error_ = false;
    }

    std::deque<std::vector<uint8_t>> queue_;
    std::vector<LineWord> line_;
    std::size_t pos_ = 0;
    std::vector<uint8_t> raw_;
    bool in_frame_ = false, error_ = false;
};
#endif

VerilatedContext *make_context(bool trace) {
    auto *context = new VerilatedContext;
    context->traceEverOn(trace);
    return context;
}

class Sim {
  public:
    Sim(uint64_t seed, const char *trace_path, uint64_t period_ps)
        : context_(make_context(trace_path != nullptr)), top_(context_.get()),
          period_ps_(period_ps) {
        make_streams(inputs, outputs);
        for (std::size_t k = 0; k < inputs.size(); ++k) inputs[k].idle.random.reseed(seed + k);
        for (std::size_t k = 0; k < outputs.size(); ++k)
            outputs[k].ready.random.reseed(seed + 1000 + k);
#if defined(HARNESS_TRACE_FST) || defined(HARNESS_TRACE_VCD)
        if (trace_path) {
            trace_ = std::make_unique<Trace>();
            top_.trace(trace_.get(), 99);
            trace_->open(trace_path);
        }
#endif
        top_.rst = 1;
        for (int i = 0; i < 4; ++i) tick();
        top_.rst = 0;
    }

    ~Sim() {
        top_.final();
#if defined(HARNESS_TRACE_FST) || defined(HARNESS_TRACE_VCD)
        if (trace_) trace_->close();
#endif
    }

    // Run up to `cycles` cycles; with `until_output`, stop after one where a packet (or a
    // transfer of a stream without tlast) came out of an m_axis port, or the PHY saw a frame end.
    uint64_t run(uint64_t cycles, bool until_output) {
        uint64_t done = 0;
        while (done < cycles) {
            const bool arrived = step();
            ++done;
            if (until_output && arrived) break;
        }
        return done;
    }

    VTOP &top() { return top_; }
    void settle() { top_.eval(); }
    uint64_t cycle = 0;
    std::vector<Input> inputs;
    std::vector<Output> outputs;
#ifdef HARNESS_PHY
    Phy phy;
#endif

  private:
    bool step() {
        drive_streams(top_, inputs, outputs);
#if defined(HARNESS_PHY_GMII)
        const LineWord rx = phy.next_rx();
        top_.gmii_rxd = static_cast<uint8_t>(rx.data);
        top_.gmii_rx_dv = rx.ctrl;
        top_.gmii_rx_er = 0;
#elif defined(HARNESS_PHY_XGMII)
        const LineWord rx = phy.next_rx();
        top_.xgmii_rxd = rx.data;
        top_.xgmii_rxc = rx.ctrl;
#endif
        top_.clk = 0;
        top_.eval();
        dump(0);
        bool arrived = sample_streams(top_, inputs, outputs);
#if defined(HARNESS_PHY_GMII)
        arrived |= phy.sample_tx(top_.gmii_txd, top_.gmii_tx_en, top_.gmii_tx_er, cycle);
#elif defined(HARNESS_PHY_XGMII)
        arrived |= phy.sample_tx(top_.xgmii_txd, top_.xgmii_txc, false, cycle);
#endif
        top_.clk = 1;
        top_.eval();
        dump(period_ps_ / 2);
        ++cycle;
        ++ticks_;
        return arrived;
    }

    // A clock cycle in reset: nothing offered, nothing taken.
    void tick() {
        top_.clk = 0;
        top_.eval();
        dump(0);
        top_.clk = 1;
        top_.eval();
        dump(period_ps_ / 2);
        ++ticks_;
    }

    void dump(uint64_t offset) {
#if defined(HARNESS_TRACE_FST) || defined(HARNESS_TRACE_VCD)
        if (trace_) trace_->dump(ticks_ * period_ps_ + offset);
#else
        (void)offset;
#endif
    }

    std::unique_ptr<VerilatedContext> context_;
    VTOP top_;
    uint64_t period_ps_;
    uint64_t ticks_ = 0;  // cycles including reset: the waveform's time base
#if defined(HARNESS_TRACE_FST) || defined(HARNESS_TRACE_VCD)
    std::unique_ptr<Trace> trace_;
#endif
};

Sim &sim(void *handle) { return *static_cast<Sim *>(handle); }

}  // namespace

HARNESS_API void *hs_new(uint64_t seed, const char *trace_path, uint64_t period_ps) {
    return new Sim(seed, trace_path, period_ps);
}

HARNESS_API void hs_free(void *h) { delete &sim(h); }

HARNESS_API uint64_t hs_run(void *h, uint64_t cycles, int until_output) {
    return sim(h).run(cycles, until_output != 0);
}

HARNESS_API uint64_t hs_cycle(void *h) { return sim(h).cycle; }

HARNESS_API void hs_set(void *h, int port, const uint8_t *bytes) {
    set_port(sim(h).top(), port, bytes);
}

HARNESS_API void hs_get(void *h, int port, uint8_t *bytes) {
    sim(h).settle();  // outputs that follow inputs set since the last cycle
    get_port(sim(h).top(), port, bytes);
}

// Queue `n` transfers on input stream `k`: tdata bytes back to back, tkeep, tlast, tuser.
HARNESS_API void hs_push(void *h, int k, uint64_t n, const uint8_t *data, const uint64_t *keep,
                         const uint8_t *last, const uint8_t *user) {
    Input &in = sim(h).inputs[k];
    in.data.insert(in.data.end(), data, data + n * in.bytes);
    in.keep.insert(in.keep.end(), keep, keep + n);
    in.last.insert(in.last.end(), last, last + n);
    in.user.insert(in.user.end(), user, user + n);
}

// Transfers of input stream `k` not yet accepted.
HARNESS_API uint64_t hs_pending(void *h, int k) {
    const Input &in = sim(h).inputs[k];
    return in.size() - in.head;
}

HARNESS_API uint64_t hs_out_count(void *h, int k) { return sim(h).outputs[k].size(); }

// Move every transfer recorded on output stream `k` into the caller's columns.
HARNESS_API void hs_pull(void *h, int k, uint8_t *data, uint64_t *keep, uint8_t *last,
                         uint8_t *user) {
    Output &out = sim(h).outputs[k];
    std::memcpy(data, out.data.data(), out.data.size());
    std::memcpy(keep, out.keep.data(), out.keep.size() * 8);
    std::memcpy(last, out.last.data(), out.last.size());
    std::memcpy(user, out.user.data(), out.user.size());
    out.clear();
}

// Probabilities as thresholds out of 2^32, and the seed of that stream's random numbers.
HARNESS_API void hs_ready(void *h, int k, uint64_t threshold, uint64_t seed) {
    Chance &ready = sim(h).outputs[k].ready;
    ready.threshold = threshold;
    ready.random.reseed(seed);
}

HARNESS_API void hs_idle(void *h, int k, uint64_t threshold, uint64_t seed) {
    Chance &idle = sim(h).inputs[k].idle;
    idle.threshold = threshold;
    idle.random.reseed(seed);
}

#ifdef HARNESS_PHY
HARNESS_API void hs_send_frame(void *h, const uint8_t *frame, uint32_t n, int bad_fcs) {
    sim(h).phy.send(frame, n, bad_fcs != 0);
}

HARNESS_API uint64_t hs_frames_size(void *h) { return sim(h).phy.records.size(); }

HARNESS_API void hs_take_frames(void *h, uint8_t *buffer) {
    std::vector<uint8_t> &records = sim(h).phy.records;
    std::memcpy(buffer, records.data(), records.size());
    records.clear();
}
#endif
