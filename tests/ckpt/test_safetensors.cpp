// safetensors writer/reader: round trips of every dtype (0-d, empty, non-contiguous
// inputs), the byte layout checked against the spec by parsing the file here, a file
// from the independent Python writer (tests/fixtures/safetensors_py.safetensors), and
// every way a file can be corrupt -> CheckpointError naming the file, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/wait.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include <fmt/ranges.h>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"

using namespace brigade;
using namespace brigade::ckpt;
namespace fs = std::filesystem;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("brigade_test_ckpt_{}_{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void spit(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}
std::string bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}
uint64_t read_u64(const std::string& s) {
  uint64_t n = 0;
  std::memcpy(&n, s.data(), 8);
  return n;
}
std::string u64(uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}
// A file with the given JSON header (padded) and data buffer; `len` overrides N.
std::string craft(std::string header, const std::string& data, std::optional<uint64_t> len = {}) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return u64(len.value_or(header.size())) + header + data;
}

NamedTensors sample_tensors() {
  Tensor f32 =
      Tensor::from_vector({1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-40f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f, 12.0f}, {3, 4});
  Tensor bf = Tensor::from_vector({1.0f, -2.5f, 3.140625f, 100.0f, -0.125f}, {5}, DType::BF16);
  Tensor h = Tensor::from_vector({0.5f, -1.0f, 65504.0f, 6.103515625e-05f, 2.0f, 3.0f}, {2, 3}, DType::F16);
  Tensor i32 = Tensor::from_vector_i64({-2147483648LL, -1, 0, 1, 2147483647LL, 5, 6}, {7}, DType::I32);
  Tensor i64 = Tensor::from_vector_i64({-(1LL << 62), -1, 1LL << 40, 9}, {2, 2});
  Tensor s0 = Tensor::full({}, 3.5);
  Tensor s0i = Tensor::from_vector_i64({42}, {});
  Tensor e0 = Tensor::empty({0});
  Tensor e1 = Tensor::empty({3, 0, 2}, DType::BF16);
  Tensor base = Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  Tensor tr = base.transpose(0, 1);    // (4, 3) non-contiguous
  Tensor sl = base.slice(1, 0, 4, 2);  // (3, 2) every second column
  return {{"f32", f32},        {"bf16", bf},       {"f16", h},          {"i32", i32},
          {"i64", i64},        {"scalar_f32", s0}, {"scalar_i64", s0i}, {"empty", e0},
          {"empty_3x0x2", e1}, {"transposed", tr}, {"sliced", sl}};
}

// Runs `fn`, expects CheckpointError whose message names the file and contains `needle`.
template <typename F>
void expect_ckpt_error(F&& fn, const std::string& file, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no CheckpointError for " << needle;
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
  }
}

}  // namespace

TEST_F(SafetensorsTest, RoundTripsEveryDtypeShapeAndLayout) {
  const NamedTensors in = sample_tensors();
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"empty", ""}, {"utf8", "μ ✓"}};
  const std::string p = path("a.safetensors");
  save_safetensors(p, in, meta);
  SafetensorsReader r(p);
  EXPECT_EQ(r.metadata(), meta);
  EXPECT_EQ(r.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(r.contains(name)) << name;
    const TensorInfo& ti = r.info(name);
    EXPECT_EQ(ti.dtype, t.dtype()) << name;
    EXPECT_EQ(ti.dtype_name, safetensors_dtype(t.dtype()));
    EXPECT_EQ(ti.shape, t.shape()) << name;
    Tensor got = r.get(name);
    EXPECT_TRUE(got.is_contiguous()) << name;  // empty tensors count as contiguous too
    EXPECT_EQ(got.shape(), t.shape());
    EXPECT_EQ(got.dtype(), t.dtype());
    EXPECT_EQ(bytes_of(got), bytes_of(t)) << name;
    EXPECT_EQ(r.raw_bytes(name), bytes_of(t)) << name;
  }
  EXPECT_EQ(r.get("transposed").to_vector(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(r.get("sliced").to_vector(), (std::vector<float>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(r.get("scalar_i64").to_vector_i64(), std::vector<int64_t>{42});
  EXPECT_FALSE(r.contains("nope"));
  expect_ckpt_error([&] { r.get("nope"); }, p, "'nope'");
}

TEST_F(SafetensorsTest, ByteLayoutFollowsTheSpec) {
  const NamedTensors in = sample_tensors();
  const std::string p = path("layout.safetensors");
  save_safetensors(p, in, {{"k", "v"}});
  const std::string file = slurp(p);
  EXPECT_EQ(file, serialize_safetensors(in, {{"k", "v"}}));

  ASSERT_GE(file.size(), 8u);
  const uint64_t n = read_u64(file);
  ASSERT_LE(8 + n, file.size());
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  std::string header = file.substr(8, n);
  const size_t close = header.find_last_of('}');
  for (size_t i = close + 1; i < header.size(); ++i) EXPECT_EQ(header[i], ' ') << "padding must be spaces";
  EXPECT_EQ(header.front(), '{');
  const auto js = nlohmann::ordered_json::parse(header);  // keeps the file's key order
  ASSERT_TRUE(js.is_object());
  EXPECT_EQ(js.at("__metadata__").dump(), R"({"k":"v"})");
  EXPECT_EQ(js.begin().key(), "__metadata__") << "metadata first";

  // Every tensor: spec dtype, shape, offsets tiling the buffer with its exact bytes.
  const std::string data = file.substr(8 + n);
  std::map<uint64_t, std::pair<uint64_t, std::string>> spans;
  size_t prev_esize = 8;
  std::vector<std::string> header_order;
  for (auto it = js.begin(); it != js.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    header_order.push_back(it.key());
    const auto& e = it.value();
    ASSERT_EQ(e.size(), 3u) << it.key();
    const Tensor* t = nullptr;
    for (const auto& [name, tt] : in)
      if (name == it.key()) t = &tt;
    ASSERT_NE(t, nullptr) << it.key();
    EXPECT_EQ(e.at("dtype").get<std::string>(), std::string(safetensors_dtype(t->dtype())));
    EXPECT_EQ(e.at("shape").get<Shape>(), t->shape());
    const uint64_t b = e.at("data_offsets")[0], end = e.at("data_offsets")[1];
    EXPECT_EQ(end - b, t->nbytes());
    EXPECT_EQ(data.substr(b, end - b), bytes_of(*t)) << it.key();
    EXPECT_EQ(b % t->element_size(), 0u) << it.key() << " is naturally aligned";
    EXPECT_LE(t->element_size(), prev_esize) << "laid out largest element first";
    prev_esize = t->element_size();
    spans[b] = {end, it.key()};
  }
  uint64_t pos = 0;
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, pos) << e.second;
    pos = e.first;
  }
  EXPECT_EQ(pos, data.size());
  SafetensorsReader r(p);
  EXPECT_EQ(r.names(), header_order) << "names() in data order";
  EXPECT_EQ(r.data_start(), 8 + n);
}

TEST_F(SafetensorsTest, SaveIsDeterministicAtomicAndOverwrites) {
  const NamedTensors in = sample_tensors();
  const std::string p = path("det.safetensors");
  save_safetensors(p, in);
  const std::string first = slurp(p);
  save_safetensors(p, {{"x", Tensor::ones({2})}});  // overwrite with different content
  EXPECT_EQ(SafetensorsReader(p).names(), std::vector<std::string>{"x"});
  save_safetensors(p, in);
  EXPECT_EQ(slurp(p), first);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string(), "det.safetensors") << "temporary file left behind";
  // no metadata -> no __metadata__ key
  EXPECT_EQ(slurp(p).find("__metadata__"), std::string::npos);
}

TEST_F(SafetensorsTest, SaveErrorsAreClear) {
  EXPECT_THROW(save_safetensors(path("nodir/x.safetensors"), {{"a", Tensor::ones({1})}}), IoError);
  EXPECT_FALSE(fs::exists(path("nodir")));
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {{"a", Tensor::ones({1})}, {"a", Tensor::ones({1})}}),
               ValueError);
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {{"__metadata__", Tensor::ones({1})}}), ValueError);
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {{"", Tensor::ones({1})}}), ValueError);
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {{"u", Tensor()}}), ValueError);
  EXPECT_FALSE(fs::exists(path("d.safetensors")));
}

TEST_F(SafetensorsTest, GetIntoChecksShapeAndConverts) {
  const std::string p = path("g.safetensors");
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  save_safetensors(p, {{"w", w}, {"ids", Tensor::from_vector_i64({1, 2}, {2})}});
  SafetensorsReader r(p);
  Tensor dst = Tensor::zeros({2, 3});
  r.get_into("w", dst);
  EXPECT_EQ(dst.to_vector(), w.to_vector());
  Tensor big = Tensor::zeros({3, 2});
  Tensor view = big.transpose(0, 1);  // (2, 3) non-contiguous destination
  r.get_into("w", view);
  EXPECT_EQ(view.contiguous().to_vector(), w.to_vector());
  Tensor b16 = Tensor::zeros({2, 3}, DType::BF16);
  r.get_into("w", b16);
  EXPECT_EQ(b16.to_vector(), w.to_vector());
  Tensor wrong = Tensor::zeros({3, 2});
  expect_ckpt_error([&] { r.get_into("w", wrong); }, p, "'w' has shape (2, 3)");
  Tensor fl = Tensor::zeros({2});
  expect_ckpt_error([&] { r.get_into("ids", fl); }, p, "'ids'");
}

TEST(SafetensorsFixture, LoadsTheIndependentPythonWriter) {
  const std::string p = std::string(BRIGADE_FIXTURES_DIR) + "/safetensors_py.safetensors";
  SafetensorsReader r(p);
  EXPECT_EQ(r.metadata("magic").value_or(""), "brigade-fixture");
  EXPECT_EQ(r.metadata("version").value_or(""), "1");
  EXPECT_EQ(r.metadata("kind").value_or(""), "safetensors_loader");
  EXPECT_EQ(r.metadata("unicode").value_or(""), "μ-ünïcode ✓");
  // data order from the writer's list, although its header keys are sorted
  EXPECT_EQ(r.names(), (std::vector<std::string>{"f32_2x3", "bf16_4", "f16_2x2x2", "i32_5", "i64_scalar", "f32_scalar",
                                                 "f32_empty_0x3", "i64_1x2x1x3", "name with spaces/and.dots"}));
  auto expect = [&](const std::string& n, DType dt, Shape shape, std::vector<float> v) {
    Tensor t = r.get(n);
    EXPECT_EQ(t.dtype(), dt) << n;
    EXPECT_EQ(t.shape(), shape) << n;
    const auto got = t.to_vector();
    ASSERT_EQ(got.size(), v.size()) << n;
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_EQ(got[i], v[i]) << n << "[" << i << "]";
      EXPECT_EQ(std::signbit(got[i]), std::signbit(v[i])) << n << "[" << i << "]";
    }
  };
  expect("f32_2x3", DType::F32, {2, 3}, {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});
  expect("bf16_4", DType::BF16, {4}, {1.0f, -2.5f, 3.140625f, INFINITY});
  expect("f16_2x2x2", DType::F16, {2, 2, 2},
         {0.5f, -1.0f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, -0.0f, 2.0f, 3.0f});
  expect("f32_scalar", DType::F32, {}, {3.25f});
  expect("f32_empty_0x3", DType::F32, {0, 3}, {});
  expect("name with spaces/and.dots", DType::F32, {1}, {7.0f});
  EXPECT_EQ(r.get("i32_5").to_vector_i64(), (std::vector<int64_t>{-2147483648LL, -1, 0, 1, 2147483647LL}));
  EXPECT_EQ(r.get("i32_5").dtype(), DType::I32);
  Tensor s = r.get("i64_scalar");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.to_vector_i64(), std::vector<int64_t>{1099511627776LL + 7});
  EXPECT_EQ(r.get("i64_1x2x1x3").shape(), (Shape{1, 2, 1, 3}));
  EXPECT_EQ(r.get("i64_1x2x1x3").to_vector_i64(), (std::vector<int64_t>{-3, -2, -1, 0, 1, 2}));
}

TEST_F(SafetensorsTest, EveryCorruptionIsACheckpointError) {
  const std::string d8(8, '\x01');  // 2 floats
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    std::string name, bytes, needle;
  };
  const std::vector<Case> cases = {
      {"empty", "", "truncated"},
      {"short", "\x10\0\0", "truncated"},
      {"len_beyond", craft("{" + ok_entry + "}", d8, 1000), "beyond the file size"},
      {"len_huge", u64(~0ull) + "{}", "beyond the file size"},
      {"len_tiny", craft("{}", "", 1), "too small"},
      {"not_json", craft("{\"a\": nope}", ""), "not valid JSON"},
      {"not_object", craft("[1,2,3]", ""), "does not start with"},
      {"bad_utf8", craft("{\"\xff\xfe\":{}}", ""), "not valid JSON"},
      {"unknown_dtype", craft(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", d8),
       "unknown dtype \"F33\""},
      {"dtype_not_string", craft(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", d8), "dtype"},
      {"missing_shape", craft(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", d8), "shape"},
      {"negative_shape", craft(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8), "non-negative"},
      {"float_shape", craft(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d8), "non-negative"},
      {"huge_shape", craft(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8),
       "too large"},
      {"offsets_3", craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", d8), "[begin, end]"},
      {"offsets_reversed", craft(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", d8), "end before"},
      {"offsets_negative", craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", d8), "non-negative"},
      {"out_of_range", craft(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8), "run past"},
      {"size_mismatch", craft(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8), "needs 12 bytes"},
      {"overlap",
       craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             d8),
       "overlaps"},
      {"gap", craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8), "gap"},
      {"trailing", craft("{" + ok_entry + "}", d8 + "xxxx"), "trailing bytes"},
      {"truncated_data", craft("{" + ok_entry + "}", d8.substr(0, 5)), "run past"},
      {"duplicate_name", craft("{" + ok_entry + "," + ok_entry + "}", d8), "more than once"},
      {"duplicate_field", craft(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", d8),
       "more than once"},
      {"extra_field", craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", d8),
       "unexpected field 'x'"},
      {"entry_not_object", craft(R"({"a":[1]})", ""), "not an object"},
      {"metadata_not_string", craft(R"({"__metadata__":{"k":1}})", ""), "not a string"},
      {"metadata_not_object", craft(R"({"__metadata__":"x"})", ""), "__metadata__"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = path(c.name + ".safetensors");
    spit(p, c.bytes);
    expect_ckpt_error([&] { SafetensorsReader r(p); }, p, c.needle);
  }
  expect_ckpt_error([&] { SafetensorsReader r(path("missing.safetensors")); }, "missing.safetensors", "cannot open");
  expect_ckpt_error([&] { SafetensorsReader r(dir_.string()); }, dir_.string(), "not a regular file");
}

TEST_F(SafetensorsTest, UnsupportedButValidDtypeFailsOnlyOnGet) {
  const std::string p = path("f64.safetensors");
  spit(p, craft(R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
                R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                std::string(16, '\0')));
  SafetensorsReader r(p);
  EXPECT_EQ(r.info("d").dtype_name, "F64");
  EXPECT_FALSE(r.info("d").dtype.has_value());
  EXPECT_EQ(r.get("a").to_vector(), (std::vector<float>{0, 0}));
  expect_ckpt_error([&] { r.get("d"); }, p, "dtype F64");
}

TEST_F(SafetensorsTest, TruncationAtAnyLengthAndHeaderGarbageNeverCrash) {
  const std::string p = path("t.safetensors");
  save_safetensors(p, sample_tensors(), {{"m", "v"}});
  const std::string good = slurp(p);
  for (size_t len = 0; len < good.size(); ++len) {
    spit(p, good.substr(0, len));
    EXPECT_THROW(SafetensorsReader r(p), CheckpointError) << "truncated to " << len;
  }
  std::mt19937 rng(1);
  const uint64_t n = read_u64(good);
  for (int i = 0; i < 300; ++i) {
    std::string bad = good;
    const size_t at = 8 + rng() % n;
    bad[at] = char(rng() & 0xff);
    spit(p, bad);
    try {
      SafetensorsReader r(p);
      for (const auto& name : r.names()) r.get(name);
    } catch (const CheckpointError&) {
    }  // anything else escapes and fails the test
  }
  // a file truncated after open(): get() reports it instead of returning garbage
  spit(p, good);
  SafetensorsReader r(p);
  ::truncate(p.c_str(), off_t(r.data_start()));
  expect_ckpt_error(
      [&] {
        for (const auto& name : r.names()) r.get(name);
      },
      p, "truncated after it was opened");
}

// ---- cross-checks with the Python side (skipped where /usr/bin/python3 has no torch) ----

namespace {
bool have_torch() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}
std::string run_capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int st = ::pclose(f);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}
std::string hex(const std::string& b) {
  std::string s;
  for (unsigned char c : b) s += fmt::format("{:02x}", c);
  return s;
}
}  // namespace

TEST_F(SafetensorsTest, PythonReaderReadsOurFiles) {
  if (!have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch not available";
  const NamedTensors in = sample_tensors();
  const std::string p = path("py.safetensors");
  save_safetensors(p, in, {{"k", "v"}});
  const std::string script = fmt::format(
      "import sys; sys.path.insert(0, '{}/tests/reference'); import st_io\n"
      "d, m = st_io.load('{}'); assert m == {{'k': 'v'}}, m\n"
      "for k in sorted(d): print(k, st_io.NAMES[d[k].dtype], list(d[k].shape), st_io.tensor_bytes(d[k]).hex())\n",
      BRIGADE_SOURCE_DIR, p);
  spit(path("read.py"), script);
  int rc = -1;
  const std::string out = run_capture("/usr/bin/python3 " + path("read.py"), &rc);
  ASSERT_EQ(rc, 0) << out;
  std::map<std::string, std::string> want;
  for (const auto& [name, t] : in)
    want[name] =
        fmt::format("{} {} [{}] {}", name, safetensors_dtype(t.dtype()), fmt::join(t.shape(), ", "), hex(bytes_of(t)));
  std::string expect;
  for (const auto& [name, line] : want) expect += line + "\n";
  EXPECT_EQ(out, expect);
}

TEST_F(SafetensorsTest, CheckCheckpointScriptAcceptsOurWeights) {
  if (!have_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch not available";
  // Re-save the parity fixture's parameters with the C++ writer, as Brigade would.
  SafetensorsReader fx(std::string(BRIGADE_FIXTURES_DIR) + "/gpt2_tiny.safetensors");
  NamedTensors params, batch;
  for (const auto& n : fx.names())
    if (n.rfind("transformer.", 0) == 0) params.emplace_back(n, fx.get(n));
  for (const char* n : {"ids", "targets", "loss"}) batch.emplace_back(n, fx.get(n));
  save_safetensors(path("model.safetensors"), params, {{"config", fx.metadata("config").value()}});
  save_safetensors(path("batch.safetensors"), batch);
  const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/reference/check_checkpoint.py --model {} --batch {}",
                                      BRIGADE_SOURCE_DIR, path("model.safetensors"), path("batch.safetensors"));
  int rc = -1;
  std::string out = run_capture(cmd + " 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  out = run_capture(cmd + " --expected-loss 1.0 2>&1", &rc);
  EXPECT_EQ(rc, 1) << out;
}
