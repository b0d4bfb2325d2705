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
//   and frames on its TX pins are decoded, checked (preamble, FCS, PHY errors) and recorded;
// * taps (HARNESS_LINE_GMII or HARNESS_LINE_XGMII): more TX pins of the module (a link inside
//   it), decoded and recorded as the PHY's;
// * every AXI4 manager port (m_axi_*): a HostMemory, an AXI4 subordinate with latency, random
//   stalls, protocol checks and a shadow-memory check of every byte written;
// * every AXI4-Lite subordinate port (s_axil_*): a RegisterMaster, an AXI4-Lite manager doing
//   one access at a time for Python (hs_reg_write, hs_reg_read run the clock until the answer).
//
// The per-top parts (which ports exist, their widths, the stream and AXI glue) come from
// harness_glue.h, which iwarp_tb.harness generates into the build folder from the port list; it
// defines make_streams, drive_streams, sample_streams, set_port, get_port, make_memories,
// drive_memories, sample_memories, make_registers, drive_registers, sample_registers and the
// PHY choice.
//
// Build-time defines: VTOP (the Verilated class), VTOP_H (its header), HARNESS_TRACE_FST or
// HARNESS_TRACE_VCD (a waveform of every cycle while tracing is on, when a path is given to
// hs_new; hs_trace pauses and resumes it).
//
// Per cycle: inputs, tready and the AXI ports' inputs are driven, clk falls and the model
// settles, handshakes and PHY pins are sampled, clk rises. A transfer happens in the cycle where
// valid and ready are both high before the rising edge.

#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
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

// ---------------------------------------------------------------------------------------------
// AXI4 host memory (ARM IHI 0022): a subordinate on each of the module's AXI4 manager ports.

constexpr std::size_t kMaxBursts = 64;   // bursts accepted and not yet answered, per direction
constexpr std::size_t kMaxRecords = 64;  // violations and faults kept (all are counted)
constexpr uint32_t kIncr = 1;            // axburst INCR
constexpr uint8_t kOkay = 0, kSlvErr = 2, kDecErr = 3;
constexpr uint64_t kPage = 4096;         // no burst crosses a 4 KiB boundary (A3.4.1)

// An AW or AR request as the manager offers it.
struct AxiAddress {
    uint64_t addr = 0;
    uint32_t id = 0, len = 0, size = 0, burst = 0;
    bool operator==(const AxiAddress &o) const {
        return addr == o.addr && id == o.id && len == o.len && size == o.size && burst == o.burst;
    }
};

// A W beat as the manager offers it: `data` lane by lane, `strb` one bit per lane (8 a byte).
struct AxiBeat {
    std::vector<uint8_t> data, strb;
    bool last = false;
    bool operator==(const AxiBeat &o) const {
        return data == o.data && strb == o.strb && last == o.last;
    }
};

// What the module drives on an AXI4 manager port, copied from its pins each cycle by the glue
// (payloads only while their valid is high).
struct ManagerPins {
    bool awvalid = false, wvalid = false, bready = false, arvalid = false, rready = false;
    AxiAddress aw, ar;
    AxiBeat w;
};

// What the memory drives back, copied to the module's pins each cycle by the glue.
struct SubordinatePins {
    bool awready = false, wready = false, arready = false;
    bool bvalid = false, rvalid = false, rlast = false;
    uint32_t bid = 0, rid = 0;
    uint8_t bresp = kOkay, rresp = kOkay;
    std::vector<uint8_t> rdata;
};

// A transfer offered and not taken at a clock edge: it must be offered again unchanged (A3.2.1).
template <typename T> struct Held {
    bool on = false;
    T value;
};

// Host memory behind one AXI4 manager port: a flat byte array from address 0, and a shadow of
// it, one "writable" flag per byte, that Python sets (hs_mem_allow).
//
// Handshakes: awready and arready are high while fewer than kMaxBursts bursts of their direction
// wait (a write from its AW to its B transfer, a read from its AR to its last R beat); wready is
// high while an accepted AW still needs data (W is not taken ahead of its AW, which A3.3.1
// allows). Each of the three ready signals is low, and a B or R transfer not yet offered is held
// back, with probability `stall` per cycle. Answers come in acceptance order: a write's B from
// `latency` + 1 cycles after its last W beat, a read's first R beat from `latency` + 1 cycles
// after its AR, its other beats back to back.
//
// A burst is checked when its address is taken: INCR, full width (axsize is log2 of the data
// bytes), not across 4 KiB, and inside the memory; its W beats as they come: wlast on the last
// beat only, no strobe below an unaligned start address. Each breach is a fault (a line of text
// with its cycle): the burst is answered DECERR if it reaches beyond the memory, else SLVERR; it
// writes nothing, and its R beats carry zeros. A good write burst is buffered and applied when
// its last beat arrives, strobed bytes only, and each byte outside writable memory is left
// unwritten: the burst's stray bytes are recorded as one violation (the first stray byte, the
// span to the last, the cycle of the last beat) and the response is still OKAY.
class HostMemory {
  public:
    HostMemory(int data_bytes, uint64_t size)
        : memory(size), writable(size), stall(0), bytes_(data_bytes) {
        while ((1 << size_code_) < data_bytes) ++size_code_;
        in.w.data.resize(data_bytes);
        in.w.strb.resize((data_bytes + 7) / 8);
        out.rdata.resize(data_bytes);
    }

    // Set this cycle's outputs (`out`) from the state after the last clock edge.
    void drive(uint64_t cycle) {
        out.awready = writing_.size() + responses_.size() < kMaxBursts && !stall.draw();
        out.wready = !writing_.empty() && !stall.draw();
        out.arready = reads_.size() < kMaxBursts && !stall.draw();
        if (!out.bvalid && !responses_.empty() && responses_.front().from <= cycle &&
            !stall.draw()) {
            out.bvalid = true;
            out.bid = responses_.front().id;
            out.bresp = responses_.front().resp;
        }
        if (!out.rvalid && !reads_.empty() && reads_.front().from <= cycle && !stall.draw()) {
            const ReadBurst &r = reads_.front();
            out.rvalid = true;
            out.rid = r.request.id;
            out.rresp = r.resp;
            out.rlast = r.beats == r.request.len;
            if (r.resp == kOkay)
                std::memcpy(out.rdata.data(), &memory[beat_addr(r.request, r.beats)], bytes_);
            else
                std::fill(out.rdata.begin(), out.rdata.end(), 0);
        }
    }

    // Take this cycle's transfers (`in` against `out`), before the clock edge.
    void sample(uint64_t cycle) {
        check_held(held_aw_, "AW", in.awvalid, out.awready, in.aw, cycle);
        check_held(held_w_, "W", in.wvalid, out.wready, in.w, cycle);
        check_held(held_ar_, "AR", in.arvalid, out.arready, in.ar, cycle);
        if (in.wvalid && out.wready) take_beat(cycle);
        if (in.awvalid && out.awready) writing_.push_back({in.aw, check(in.aw, "write", cycle)});
        if (out.bvalid && in.bready) {
            responses_.pop_front();
            out.bvalid = false;
        }
        if (in.arvalid && out.arready) {
            reads_.push_back({in.ar, check(in.ar, "read", cycle), cycle + 1 + latency});
            ++read_bursts;
        }
        if (out.rvalid && in.rready) {
            ReadBurst &r = reads_.front();
            if (r.resp == kOkay) read_bytes += bytes_;
            if (r.beats++ == r.request.len) reads_.pop_front();
            out.rvalid = false;
        }
    }

    ManagerPins in;
    SubordinatePins out;
    std::vector<uint8_t> memory, writable;
    uint64_t latency = 0;
    Chance stall;
    // Counters: bursts taken (reads at AR, writes at their last W beat), bytes in R beats of
    // OKAY reads and bytes written, faults and violations (the first kMaxRecords of each kept).
    uint64_t read_bursts = 0, write_bursts = 0, read_bytes = 0, write_bytes = 0;
    uint64_t fault_count = 0, violation_count = 0;
    std::string faults;               // one line per fault kept
    std::vector<uint64_t> violations;  // {first stray byte, span, cycle} per violation kept

  private:
    // An accepted write burst: its request and the response its address earned.
    struct WriteBurst {
        AxiAddress request;
        uint8_t resp;
        uint32_t beats = 0;  // W beats taken
    };
    // A write response, offered from cycle `from`.
    struct Response {
        uint32_t id;
        uint8_t resp;
        uint64_t from;
    };
    // An accepted read burst, its first beat offered from cycle `from`.
    struct ReadBurst {
        AxiAddress request;
        uint8_t resp;
        uint64_t from;
        uint32_t beats = 0;  // R beats taken
    };

    // The address of beat `beat` of a full-width INCR burst (the first may start unaligned).
    uint64_t beat_addr(const AxiAddress &a, uint32_t beat) const {
        return (a.addr & ~uint64_t(bytes_ - 1)) + uint64_t(beat) * bytes_;
    }

    void fault(uint64_t cycle, const std::string &reason) {
        if (fault_count++ < kMaxRecords)
            faults += "cycle " + std::to_string(cycle) + ": " + reason + "\n";
    }

    static std::string describe(const char *kind, const AxiAddress &a) {
        char text[96];
        std::snprintf(text, sizeof text, "%s burst at 0x%llx, %u beats", kind,
                      static_cast<unsigned long long>(a.addr), a.len + 1);
        return text;
    }

    // A3.2.1: once valid is high it stays high, with the same payload, until ready.
    template <typename T>
    void check_held(Held<T> &held, const char *channel, bool valid, bool ready, const T &value,
                    uint64_t cycle) {
        if (held.on && !valid)
            fault(cycle, std::string(channel) + " valid dropped before ready");
        else if (held.on && !(value == held.value))
            fault(cycle, std::string(channel) + " payload changed before ready");
        held.on = valid && !ready;
        if (held.on) held.value = value;
    }

    // The response a burst's address earns, with a fault recorded for each rule it breaks.
    uint8_t check(const AxiAddress &a, const char *kind, uint64_t cycle) {
        std::string why;
        if (a.burst != kIncr) why += "; axburst " + std::to_string(a.burst) + ", not INCR";
        if (a.size != size_code_)
            why += "; axsize " + std::to_string(a.size) + ", not the full width " +
                   std::to_string(size_code_);
        const uint64_t first = beat_addr(a, 0), span = uint64_t(a.len + 1) * bytes_;
        if (a.addr / kPage != (first + span - 1) / kPage) why += "; crosses a 4 KiB boundary";
        const bool beyond = first >= memory.size() || span > memory.size() - first;
        if (beyond) why += "; beyond the memory (DECERR)";
        if (why.empty()) return kOkay;
        fault(cycle, describe(kind, a) + ": " + why.substr(2));
        return beyond ? kDecErr : kSlvErr;
    }

    // A W beat for the oldest write burst still taking data.
    void take_beat(uint64_t cycle) {
        WriteBurst &b = writing_.front();
        const AxiAddress &a = b.request;
        if (b.beats == 0) {
            staged_.resize(uint64_t(a.len + 1) * bytes_);
            strobed_.assign(staged_.size(), 0);
        }
        const uint32_t lowest = b.beats == 0 ? a.addr & (bytes_ - 1) : 0;  // first valid lane
        bool below = false;
        for (int lane = 0; lane < bytes_; ++lane) {
            if (!(in.w.strb[lane / 8] >> (lane % 8) & 1)) continue;
            below |= uint32_t(lane) < lowest;
            staged_[uint64_t(b.beats) * bytes_ + lane] = in.w.data[lane];
            strobed_[uint64_t(b.beats) * bytes_ + lane] = 1;
        }
        std::string why;
        if (below) why += "; wstrb set below the start address";
        if (in.w.last != (b.beats == a.len))
            why += in.w.last ? "; wlast on beat " + std::to_string(b.beats + 1)
                             : std::string("; no wlast on the last beat");
        if (!why.empty()) {
            fault(cycle, describe("write", a) + ": " + why.substr(2));
            if (b.resp == kOkay) b.resp = kSlvErr;
        }
        if (b.beats++ < a.len) return;
        if (b.resp == kOkay) apply(a, cycle);
        responses_.push_back({a.id, b.resp, cycle + 1 + latency});
        writing_.pop_front();
        ++write_bursts;
    }

    // Write the staged burst's strobed bytes that are writable; record the others.
    void apply(const AxiAddress &a, uint64_t cycle) {
        const uint64_t first = beat_addr(a, 0);
        uint64_t stray_lo = 0, stray_hi = 0;
        bool stray = false;
        for (std::size_t i = 0; i < staged_.size(); ++i) {
            if (!strobed_[i]) continue;
            if (writable[first + i]) {
                memory[first + i] = staged_[i];
                ++write_bytes;
            } else {
                if (!stray) stray_lo = first + i;
                stray_hi = first + i;
                stray = true;
            }
        }
        if (stray && violation_count++ < kMaxRecords)
            violations.insert(violations.end(), {stray_lo, stray_hi - stray_lo + 1, cycle});
    }

    const int bytes_;
    uint32_t size_code_ = 0;  // log2(bytes_): axsize of a full-width beat
    std::deque<WriteBurst> writing_;   // AW taken, W beats still to come
    std::deque<Response> responses_;   // data complete, B not yet taken
    std::deque<ReadBurst> reads_;      // AR taken, R beats still to go
    std::vector<uint8_t> staged_, strobed_;  // the data of writing_.front(), per byte
    Held<AxiAddress> held_aw_, held_ar_;
    Held<AxiBeat> held_w_;
};

// ---------------------------------------------------------------------------------------------
// AXI4-Lite register master (ARM IHI 0022, part B): a manager on each of the module's AXI4-Lite
// subordinate ports, one access at a time. A write offers AW and W together (every strobe set)
// and holds bready high until its B transfer; a read offers AR and holds rready high until its R
// transfer. An access that timed out stays on the bus until its response arrives.
struct RegisterMaster {
    bool idle() const { return !aw_on && !w_on && !b_wait && !ar_on && !r_wait; }
    void write(uint64_t address, uint64_t value) {
        addr = address;
        wdata = value;
        aw_on = w_on = b_wait = true;
    }
    void read(uint64_t address) {
        addr = address;
        ar_on = r_wait = true;
    }
    // This cycle's handshakes, before the clock edge.
    void sample(bool awready, bool wready, bool bvalid, uint8_t bresp, bool arready, bool rvalid,
                uint64_t data, uint8_t rresp) {
        aw_on = aw_on && !awready;
        w_on = w_on && !wready;
        ar_on = ar_on && !arready;
        if (b_wait && bvalid) {
            resp = bresp;
            b_wait = false;
        }
        if (r_wait && rvalid) {
            resp = rresp;
            rdata = data;
            r_wait = false;
        }
    }

    uint64_t addr = 0, wdata = 0, rdata = 0;
    uint8_t resp = kOkay;  // of the last access answered
    bool aw_on = false, w_on = false, b_wait = false, ar_on = false, r_wait = false;
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

// The line coding of the PHY and of the taps (HARNESS_LINE_GMII or HARNESS_LINE_XGMII, set by
// the glue with a PHY or taps); HARNESS_PHY when a PHY is attached to the MAC's pins.
#if defined(HARNESS_PHY_GMII) || defined(HARNESS_PHY_XGMII)
#define HARNESS_PHY 1
#endif
#if defined(HARNESS_LINE_GMII) || defined(HARNESS_LINE_XGMII)
#define HARNESS_LINE 1

// One cycle on the PHY's pins: GMII data = rxd, ctrl = rx_dv; XGMII data = rxd, ctrl = rxc.
struct LineWord {
    uint64_t data;
    uint8_t ctrl;
};

#if defined(HARNESS_LINE_GMII)
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

// The PHY: frames into the MAC's RX pins, frames from its TX pins (a tap: from TX pins only).
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
#if defined(HARNESS_LINE_GMII)
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
    Sim(uint64_t seed, const char *trace_path, uint64_t period_ps, uint64_t memory_bytes)
        : context_(make_context(trace_path != nullptr)), top_(context_.get()),
          period_ps_(period_ps) {
        make_streams(inputs, outputs);
        make_memories(memories, memory_bytes);
        make_registers(registers);
#ifdef HARNESS_LINE
        make_taps(taps);
#endif
        for (std::size_t k = 0; k < inputs.size(); ++k) inputs[k].idle.random.reseed(seed + k);
        for (std::size_t k = 0; k < outputs.size(); ++k)
            outputs[k].ready.random.reseed(seed + 1000 + k);
        for (std::size_t k = 0; k < memories.size(); ++k)
            memories[k].stall.random.reseed(seed + 2000 + k);
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

    // Run until `done()` holds, taking the cycles from `budget`; false when it runs out first.
    template <typename F> bool run_until(F done, uint64_t &budget) {
        while (!done()) {
            if (budget == 0) return false;
            --budget;
            step();
        }
        return true;
    }

    VTOP &top() { return top_; }
    void settle() { top_.eval(); }
    uint64_t cycle = 0;
    std::vector<Input> inputs;
    std::vector<Output> outputs;
    std::vector<HostMemory> memories;
    std::vector<RegisterMaster> registers;
#ifdef HARNESS_PHY
    Phy phy;
#endif
#ifdef HARNESS_LINE
    std::vector<Phy> taps;  // TX pins watched elsewhere in the module (a link's wires)
#endif

  private:
    bool step() {
        drive_streams(top_, inputs, outputs);
        drive_memories(top_, memories, cycle);
        drive_registers(top_, registers);
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
        sample_memories(top_, memories, cycle);
        sample_registers(top_, registers);
#if defined(HARNESS_PHY_GMII)
        arrived |= phy.sample_tx(top_.gmii_txd, top_.gmii_tx_en, top_.gmii_tx_er, cycle);
#elif defined(HARNESS_PHY_XGMII)
        arrived |= phy.sample_tx(top_.xgmii_txd, top_.xgmii_txc, false, cycle);
#endif
#ifdef HARNESS_LINE
        arrived |= sample_taps(top_, taps, cycle);
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

  public:
    bool tracing = true;  // the waveform records the cycles run while this holds

  private:
    void dump(uint64_t offset) {
#if defined(HARNESS_TRACE_FST) || defined(HARNESS_TRACE_VCD)
        if (trace_ && tracing) trace_->dump(ticks_ * period_ps_ + offset);
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

HARNESS_API void *hs_new(uint64_t seed, const char *trace_path, uint64_t period_ps,
                         uint64_t memory_bytes) {
    return new Sim(seed, trace_path, period_ps, memory_bytes);
}

HARNESS_API void hs_free(void *h) { delete &sim(h); }

HARNESS_API uint64_t hs_run(void *h, uint64_t cycles, int until_output) {
    return sim(h).run(cycles, until_output != 0);
}

HARNESS_API uint64_t hs_cycle(void *h) { return sim(h).cycle; }

HARNESS_API void hs_trace(void *h, int on) { sim(h).tracing = on != 0; }

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

#ifdef HARNESS_LINE
// The frames tap `k` decoded since the last call, as hs_take_frames gives the PHY's.
HARNESS_API uint64_t hs_tap_frames_size(void *h, int k) { return sim(h).taps[k].records.size(); }

HARNESS_API void hs_take_tap_frames(void *h, int k, uint8_t *buffer) {
    std::vector<uint8_t> &records = sim(h).taps[k].records;
    std::memcpy(buffer, records.data(), records.size());
    records.clear();
}
#endif

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

// Host memory `g` (in the order of harness_glue.h). Addresses and lengths are checked by Python.
HARNESS_API void hs_mem_write(void *h, int g, uint64_t addr, const uint8_t *data, uint64_t n) {
    std::memcpy(&sim(h).memories[g].memory[addr], data, n);
}

HARNESS_API void hs_mem_read(void *h, int g, uint64_t addr, uint8_t *data, uint64_t n) {
    std::memcpy(data, &sim(h).memories[g].memory[addr], n);
}

HARNESS_API void hs_mem_allow(void *h, int g, uint64_t addr, uint64_t n, int writable) {
    std::memset(&sim(h).memories[g].writable[addr], writable != 0, n);
}

// The stall probability as a threshold out of 2^32, and the seed of its random numbers.
HARNESS_API void hs_mem_configure(void *h, int g, uint64_t latency, uint64_t stall,
                                  uint64_t seed) {
    HostMemory &m = sim(h).memories[g];
    m.latency = latency;
    m.stall.threshold = stall;
    m.stall.random.reseed(seed);
}

// {read bursts, write bursts, read bytes, write bytes, violations, faults}.
HARNESS_API void hs_mem_stats(void *h, int g, uint64_t *out) {
    const HostMemory &m = sim(h).memories[g];
    const uint64_t stats[] = {m.read_bursts, m.write_bursts,    m.read_bytes,
                              m.write_bytes, m.violation_count, m.fault_count};
    std::memcpy(out, stats, sizeof stats);
}

// Up to `max` of the violations kept, three words each; returns how many.
HARNESS_API uint64_t hs_mem_violations(void *h, int g, uint64_t *out, uint64_t max) {
    const std::vector<uint64_t> &v = sim(h).memories[g].violations;
    const uint64_t count = std::min<uint64_t>(v.size() / 3, max);
    std::memcpy(out, v.data(), count * 3 * 8);
    return count;
}

HARNESS_API uint64_t hs_mem_faults_size(void *h, int g) {
    return sim(h).memories[g].faults.size();
}

HARNESS_API void hs_mem_faults(void *h, int g, char *out) {
    const std::string &faults = sim(h).memories[g].faults;
    std::memcpy(out, faults.data(), faults.size());
}

// One register access on AXI4-Lite port `g`, running the clock until its response (after any
// earlier access that timed out) or for `timeout` cycles: the response (0 to 3), -1 on timeout.
HARNESS_API int hs_reg_write(void *h, int g, uint64_t addr, uint64_t value, uint64_t timeout) {
    Sim &s = sim(h);
    RegisterMaster &r = s.registers[g];
    const auto idle = [&r] { return r.idle(); };
    if (!s.run_until(idle, timeout)) return -1;
    r.write(addr, value);
    return s.run_until(idle, timeout) ? r.resp : -1;
}

HARNESS_API int hs_reg_read(void *h, int g, uint64_t addr, uint64_t timeout, uint64_t *value) {
    Sim &s = sim(h);
    RegisterMaster &r = s.registers[g];
    const auto idle = [&r] { return r.idle(); };
    if (!s.run_until(idle, timeout)) return -1;
    r.read(addr);
    if (!s.run_until(idle, timeout)) return -1;
    *value = r.rdata;
    return r.resp;
}
