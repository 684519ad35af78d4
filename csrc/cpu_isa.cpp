// Runtime choice of the kernel variant (see cpu_isa.h): CPU feature detection, NEO_CPU_ISA.
#include "cpu_isa.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define NEO_X86 1
#endif

namespace neo {

Tuning default_tuning() {
  Tuning t;
  if (amd_family_1ah()) {   // AMD Zen 5 (backward.h, radix_sort.h)
    t.bwd_far = 0;          // the backward's L2 prefetch of fp32 rows cost 2-8% there
    t.bwd_lookahead = 24;   // without it, the L1 prefetch further ahead: 3-4% faster with fp32 rows
    t.sort_prefetch = 0;    // the radix sort's write prefetches made it 1.7x slower there
  } else if (intel_cpu()) {
    // Intel (measured on Emerald Rapids, GenuineIntel 6/207/2, 2026-12-06; docs/benchmarks.md):
    // the L1 prefetch 8 rows ahead, not 16. The backward alone, the two distances alternating in
    // one process: 8 tables of 1M rows, 20 ids a bag, row-wise Adagrad, 7-9% faster (AVX2 and
    // AVX-512, one thread), 6% at two threads, 3% with fp16 rows; bench_train's multi-hot tables
    // (100k rows, Adagrad) 4-6%; 4 x 100k rows 4-6% (row-wise Adagrad, SGD); 2 x 10k rows within
    // 0.5%. Each row brings 5-8 lines (weights and state): 16 rows ahead are 80-128 lines, more
    // than the core keeps in flight (about 16), so the prefetches of later rows waited on earlier ones.
    t.bwd_lookahead = 8;
  } else if (amd_zen3()) {
    // AMD Zen 3 (measured on an EPYC, AuthenticAMD 25/1/1, 2026-12-07; docs/benchmarks.md): no
    // prefetch of fp32 rows (four lines) into L2 far ahead, in the forward or the backward, and the
    // forward's L1 prefetch 16 ids ahead, not 32. The forward (8 tables of 1M rows, D 64, bags of
    // 1-39), the two in one rotation: from 1% slower to 9% faster at one thread, 4-12% faster at
    // two, in seven runs; with fp16 rows (two lines) no L2 prefetch was 10% slower, so 16-bit
    // tables keep theirs. The forward + backward on 4 tables of 100k rows (row-wise Adagrad): 8-10%
    // faster without bwd_far, at one and two threads; the L1 prefetch 8 rows ahead instead of 16
    // no better.
    t.fwd_prefetch32 = 16;
    t.fwd_far32 = 0;
    t.bwd_far = 0;
  }
  return t;
}

Tuning& tuning() {
  static Tuning t = default_tuning();
  return t;
}

namespace {

struct Features {
  bool amd_family_19h = false;   // AMD Zen 3 / Zen 4 (see cpu_isa.h: the interaction's tuning)
  bool amd_family_1ah = false;   // AMD Zen 5 (the same)
  bool intel = false;            // GenuineIntel (the backward's prefetch distance: default_tuning)
  bool avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool os_ymm = false, os_zmm = false;   // the OS saves the YMM / ZMM state (XCR0)
};

#if defined(NEO_X86)
uint64_t xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

Features detect() {
  Features f;
#if defined(NEO_X86)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const bool amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;   // "AuthenticAMD"
  f.intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;          // "GenuineIntel"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const unsigned base_family = (a >> 8) & 0xF;
  const unsigned family = base_family == 0xF ? base_family + ((a >> 20) & 0xFF) : base_family;
  f.amd_family_19h = amd && family == 0x19;
  f.amd_family_1ah = amd && family == 0x1A;
  const bool osxsave = (c >> 27) & 1;
  f.avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  if (osxsave) {
    const uint64_t x = xcr0();
    f.os_ymm = (x & 0x6) == 0x6;               // SSE and AVX state
    f.os_zmm = f.os_ymm && (x & 0xE0) == 0xE0;  // opmask, ZMM_Hi256, Hi16_ZMM state
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
  }
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

struct Variant {
  const char* name;
  const KernelTable* (*table)();
  std::vector<const char*> (*missing)(const Features&);   // CPU features it needs and lacks
};

std::vector<const char*> missing_avx2(const Features& f) {
  std::vector<const char*> m;
  if (!f.avx || !f.os_ymm) m.push_back("avx (with OS support)");
  if (!f.avx2) m.push_back("avx2");
  if (!f.fma) m.push_back("fma");
  if (!f.f16c) m.push_back("f16c");
  return m;
}

std::vector<const char*> missing_avx512(const Features& f) {
  std::vector<const char*> m = missing_avx2(f);
  if (!f.avx512f) m.push_back("avx512f");
  if (!f.avx512bw) m.push_back("avx512bw");
  if (!f.avx512vl) m.push_back("avx512vl");
  if (!f.avx512dq) m.push_back("avx512dq");
  if (f.avx512f && !f.os_zmm) m.push_back("OS support for the AVX-512 state");
  return m;
}

// Built variants, lowest first (setup.py defines NEO_HAVE_AVX2 / NEO_HAVE_AVX512 where it builds them).
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"baseline", [] { return &baseline::kernel_table(); }, [](const Features&) { return std::vector<const char*>{}; }},
#if defined(NEO_HAVE_AVX2)
      {"avx2", [] { return &avx2::kernel_table(); }, missing_avx2},
#endif
#if defined(NEO_HAVE_AVX512)
      {"avx512", [] { return &avx512::kernel_table(); }, missing_avx512},
#endif
  };
  return v;
}

const Variant* best_variant() {
  const Variant* best = &variants().front();
  for (const Variant& v : variants())
    if (v.missing(features()).empty()) best = &v;
  return best;
}

std::string join(const std::vector<std::string>& xs) {
  std::string s;
  for (const auto& x : xs) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The variant called `name` ("" or "auto": the best), or a runtime_error saying why not.
const Variant& resolve(std::string name, const char* what) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (name.empty() || name == "auto" || name == "native") return *best_variant();
  std::vector<std::string> built;
  for (const Variant& v : variants()) built.push_back(v.name);
  const std::string runnable = join(cpu_isa_supported());
  for (const Variant& v : variants()) {
    if (name != v.name) continue;
    const auto miss = v.missing(features());
    if (miss.empty()) return v;
    std::string lacks;
    for (const char* m : miss) lacks += std::string(lacks.empty() ? "" : ", ") + m;
    throw std::runtime_error(std::string("neo._C: ") + what + "=" + name + " asks for the " + name +
                             " kernels, but this CPU lacks " + lacks + "; it can run: " + runnable +
                             " (unset it to use the best one)");
  }
  const bool known = name == "baseline" || name == "avx2" || name == "avx512";
  throw std::runtime_error(std::string("neo._C: ") + what + "=" + name +
                           (known ? " is not built into this library (x86-64 builds only)" : " is not a CPU ISA variant") +
                           "; built: " + join(built) + "; this CPU can run: " + runnable);
}

std::atomic<const KernelTable*> g_active{nullptr};

}  // namespace

void init_cpu_isa() {
  (void)interaction_tiles();   // reads NEO_INTERACTION_TILES (a bad value fails the import too)
  const char* env = std::getenv("NEO_CPU_ISA");
  g_active.store(resolve(env ? env : "", "NEO_CPU_ISA").table());
}

const KernelTable& kernels() {
  const KernelTable* k = g_active.load(std::memory_order_acquire);
  if (k == nullptr) {   // used before the module's init (C++ callers): choose now
    init_cpu_isa();
    k = g_active.load();
  }
  return *k;
}

void set_cpu_isa(const std::string& name) { g_active.store(resolve(name, "cpu isa").table()); }

std::string cpu_isa() { return kernels().isa; }

bool amd_family_19h() { return features().amd_family_19h; }
bool amd_family_1ah() { return features().amd_family_1ah; }
bool amd_zen3() { return features().amd_family_19h && !features().avx512f; }
bool intel_cpu() { return features().intel; }
bool interaction_l1_next() { return features().amd_family_1ah; }

namespace {
// The tile settings by code: 0 "auto", then 1 + InteractionTiles (the tilings a forward runs).
constexpr const char* kTileNames[] = {"auto", "narrow", "wide", "grouped", "tall"};
constexpr int kTileCodes = sizeof(kTileNames) / sizeof(kTileNames[0]);
constexpr int code_of(InteractionTiles t) { return 1 + static_cast<int>(t); }
static_assert(code_of(InteractionTiles::kTall) == kTileCodes - 1, "a name for every tiling");

std::atomic<int> g_tiles{-1};   // -1: not read yet, else a code of kTileNames

int tiles_code(std::string name, const char* what) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (name.empty()) return 0;
  std::string valid;
  for (int c = 0; c < kTileCodes; ++c) {
    if (name == kTileNames[c]) return c;
    valid += (c ? ", " : "") + std::string(kTileNames[c]);
  }
  throw std::runtime_error(std::string("neo._C: ") + what + "=" + name + " is not a tile choice; valid: " + valid);
}

int tiles() {
  int t = g_tiles.load(std::memory_order_acquire);
  if (t < 0) {
    const char* env = std::getenv("NEO_INTERACTION_TILES");
    t = tiles_code(env ? env : "", "NEO_INTERACTION_TILES");
    g_tiles.store(t);
  }
  return t;
}
}  // namespace

void set_interaction_tiles(const std::string& name) { g_tiles.store(tiles_code(name, "interaction tiles")); }

std::string interaction_tiles() { return kTileNames[tiles()]; }

InteractionTiles interaction_tiles_at(int64_t D) {
  const std::string isa = kernels().isa;
  const int t = tiles();
  if (isa == "avx2") {   // "auto": tall on AMD Zen 3, Zen 4 (family 19h) and Zen 5 (family 1Ah), where it
                         // was measured faster
    const bool tall_cpu = amd_family_19h() || amd_family_1ah();
    return t == code_of(InteractionTiles::kTall) || (t == 0 && tall_cpu) ? InteractionTiles::kTall
                                                                         : InteractionTiles::kNarrow;
  }
  if (isa != "avx512") return InteractionTiles::kNarrow;
  // "auto": the 5-row tall tiles on Zen 4 (family 19h with AVX-512), where 512-bit operations
  // run at half rate and the 8-float tiles win (cpu_isa.h)
  if (t == code_of(InteractionTiles::kTall) || (t == 0 && amd_family_19h())) return InteractionTiles::kTall;
  const bool full_rate = t == 0 && !amd_family_19h() && !amd_family_1ah();   // "auto": Intel's AVX-512 cores
  if ((t == code_of(InteractionTiles::kWide) || full_rate) && D >= kWideMinDim) return InteractionTiles::kWide;
  if ((t == code_of(InteractionTiles::kGrouped) || full_rate) && D >= kGroupedMinDim) return InteractionTiles::kGrouped;
  return InteractionTiles::kNarrow;
}

std::string interaction_forward_tiles(int64_t D) { return kTileNames[code_of(interaction_tiles_at(D))]; }

bool interaction_wide(int64_t D) { return interaction_tiles_at(D) == InteractionTiles::kWide; }

std::vector<std::string> cpu_isa_variants() {
  std::vector<std::string> out;
  for (const Variant& v : variants()) out.push_back(v.name);
  return out;
}

std::vector<std::string> cpu_isa_supported() {
  std::vector<std::string> out;
  for (const Variant& v : variants())
    if (v.missing(features()).empty()) out.push_back(v.name);
  return out;
}

std::vector<std::pair<std::string, bool>> cpu_features() {
  const Features& f = features();
  return {{"avx", f.avx}, {"avx2", f.avx2}, {"fma", f.fma}, {"f16c", f.f16c}, {"avx512f", f.avx512f},
          {"avx512bw", f.avx512bw}, {"avx512vl", f.avx512vl}, {"avx512dq", f.avx512dq},
          {"os_ymm_state", f.os_ymm}, {"os_zmm_state", f.os_zmm}, {"amd_family_19h", f.amd_family_19h}, {"amd_family_1ah", f.amd_family_1ah}};
}

}  // namespace neo
