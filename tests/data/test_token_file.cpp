// Token files: u16/u32 round trips, atomic writes, and every kind of broken file
// (missing, empty, truncated, bad magic/version/dtype, tokens >= vocab) -> DataError naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "brigade/core/error.h"
#include "brigade/data/text/token_file.h"
#include "test_util.h"

namespace brigade::data {
namespace {
using testing::TempDir;

void expect_data_error(const std::string& path, const std::string& needle) {
  try {
    TokenDataset ds(path);
    FAIL() << "expected DataError for " << path;
  } catch (const DataError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("brigade prepare"), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  }
}

TEST(TokenFile, RoundTripU16) {
  TempDir d;
  std::vector<int32_t> toks(1000);
  std::iota(toks.begin(), toks.end(), 0);
  toks.back() = 4095;
  write_token_file(d.file("t.bin"), toks, 4096);
  EXPECT_EQ(std::filesystem::file_size(d.file("t.bin")), kTokenHeaderBytes + 2 * toks.size());
  std::string bytes = testing::read_bytes(d.file("t.bin"));
  EXPECT_EQ(bytes.substr(0, 8), "BRGTOKEN");
  TokenDataset ds(d.file("t.bin"));
  EXPECT_EQ(ds.size(), 1000);
  EXPECT_EQ(ds.vocab_size(), 4096);
  EXPECT_EQ(ds.token_bytes(), 2u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(ds[i], toks[size_t(i)]);
  std::vector<int64_t> out(10);
  ds.read(990, 10, out.data());
  EXPECT_EQ(out[9], 4095);
  EXPECT_THROW(ds.read(995, 10, out.data()), ValueError);
  // Moving keeps the mapping alive.
  TokenDataset moved = std::move(ds);
  EXPECT_EQ(moved[5], 5);
  EXPECT_FALSE(ds.is_open());
}

TEST(TokenFile, RoundTripU32AndEmpty) {
  TempDir d;
  std::vector<int32_t> toks = {0, 65535, 65536, 69999};
  write_token_file(d.file("t.bin"), toks, 70000);
  TokenDataset ds(d.file("t.bin"));
  EXPECT_EQ(ds.token_bytes(), 4u);
  for (size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(ds[int64_t(i)], toks[i]);
  EXPECT_EQ(token_bytes_for_vocab(65536), 2u);
  EXPECT_EQ(token_bytes_for_vocab(65537), 4u);

  write_token_file(d.file("e.bin"), {}, 100);
  TokenDataset e(d.file("e.bin"));
  EXPECT_EQ(e.size(), 0);
}

TEST(TokenFile, WriterRejectsOutOfVocabTokensAndLeavesNothing) {
  TempDir d;
  std::vector<int32_t> toks = {1, 2, 100};
  EXPECT_THROW(write_token_file(d.file("t.bin"), toks, 100), ValueError);
  EXPECT_TRUE(std::filesystem::is_empty(d.path()));  // no partial file, no temp file
  toks[2] = -1;
  EXPECT_THROW(write_token_file(d.file("t.bin"), toks, 100), ValueError);
}

TEST(TokenFile, BrokenFilesAreDataErrorsNamingTheFile) {
  TempDir d;
  std::vector<int32_t> toks(100, 7);
  write_token_file(d.file("good.bin"), toks, 4096);
  const std::string good = testing::read_bytes(d.file("good.bin"));

  expect_data_error(d.file("missing.bin"), "cannot be opened");

  testing::write_text(d.file("empty.bin"), "");
  expect_data_error(d.file("empty.bin"), "truncated");

  testing::write_text(d.file("trunc.bin"), good.substr(0, good.size() - 3));
  expect_data_error(d.file("trunc.bin"), "truncated");

  testing::write_text(d.file("long.bin"), good + "xx");
  expect_data_error(d.file("long.bin"), "header promises");

  std::string bad = good;
  bad[0] = 'X';
  testing::write_text(d.file("magic.bin"), bad);
  expect_data_error(d.file("magic.bin"), "magic");

  bad = good;
  bad[8] = 2;
  testing::write_text(d.file("version.bin"), bad);
  expect_data_error(d.file("version.bin"), "version 2");

  bad = good;
  bad[12] = 3;
  testing::write_text(d.file("dtype.bin"), bad);
  expect_data_error(d.file("dtype.bin"), "dtype");

  bad = good;
  bad[kTokenHeaderBytes + 2 * 50] = char(0xff);  // token 50 becomes 0x0fff|... >= 4096
  bad[kTokenHeaderBytes + 2 * 50 + 1] = char(0xff);
  testing::write_text(d.file("range.bin"), bad);
  expect_data_error(d.file("range.bin"), "index 50");
  EXPECT_NO_THROW(TokenDataset(d.file("range.bin"), /*verify_tokens=*/false));

  bad = good;
  uint64_t huge = ~uint64_t(0) / 2;
  std::memcpy(bad.data() + 20, &huge, 8);
  testing::write_text(d.file("count.bin"), bad);
  expect_data_error(d.file("count.bin"), "header promises");
}

}  // namespace
}  // namespace brigade::data
