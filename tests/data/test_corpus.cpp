// Corpus reading: files, folders (sorted, binary skipped), CRLF, empty and missing inputs, KJV.
#include <gtest/gtest.h>

#include "brigade/core/error.h"
#include "brigade/data/text/corpus.h"
#include "test_util.h"

namespace brigade::data {
namespace {
using testing::TempDir;
using testing::write_text;

TEST(Corpus, TextFileCrlfAndFinalNewline) {
  TempDir d;
  write_text(d.file("a.txt"), "first line\r\nsecond line");
  Corpus c = read_corpus(d.file("a.txt"));
  EXPECT_EQ(c.text, "first line\nsecond line\n");
  EXPECT_EQ(c.lines, 2);
  ASSERT_EQ(c.files.size(), 1u);
}

TEST(Corpus, FolderSortedRecursiveSkipsBinaryAndHidden) {
  TempDir d;
  write_text(d.file("b.txt"), "bee\n");
  write_text(d.file("a/z.txt"), "zed\n");
  write_text(d.file("a/c.md"), "see");
  write_text(d.file(".hidden/x.txt"), "hidden\n");
  write_text(d.file("img.bin"), std::string("\x89PNG\0\0\x01", 7));
  write_text(d.file("latin1.txt"), "caf\xe9\n");
  std::vector<std::string> warnings;
  Corpus c = read_corpus(d.path().string(), [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_EQ(c.text, "see\nzed\nbee\n");
  EXPECT_EQ(c.files.size(), 3u);
  EXPECT_EQ(c.skipped.size(), 2u);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("img.bin"), std::string::npos);
}

// A link to a file of the folder is that file again (Debian's fortunes: cookie.u8 -> cookie): read
// once. A link to a file outside the folder is the only way its text gets in: read.
TEST(Corpus, FolderReadsALinkedFileOnce) {
  TempDir d, outside;
  write_text(d.file("cookie"), "one\n");
  std::filesystem::create_symlink("cookie", d.file("cookie.u8"));
  write_text(outside.file("far.txt"), "far\n");
  std::filesystem::create_symlink(outside.file("far.txt"), d.file("far"));
  Corpus c = read_corpus(d.path().string());
  EXPECT_EQ(c.text, "one\nfar\n");
  EXPECT_EQ(c.files.size(), 2u);
}

TEST(Corpus, EmptyAndMissingAreDataErrors) {
  TempDir d;
  write_text(d.file("empty.txt"), " \n\n");
  try {
    read_corpus(d.file("empty.txt"));
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("empty.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
  std::filesystem::create_directories(d.path() / "nothing");
  write_text(d.file("nothing/blob"), std::string("\0\0", 2));
  EXPECT_THROW(read_corpus(d.file("nothing")), DataError);
  try {
    read_corpus(d.file("missing.txt"));
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_corpus(""), DataError);
  write_text(d.file("bin.txt"), std::string("a\0b", 3));
  EXPECT_THROW(read_corpus(d.file("bin.txt")), DataError);
}

TEST(Corpus, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("plain"));
  EXPECT_TRUE(is_valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("caf\xe9"));
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));      // overlong
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));  // surrogate
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));      // truncated
}

TEST(Corpus, KjvStripsVerseReferences) {
  if (!std::filesystem::exists("/usr/bin/bible")) GTEST_SKIP() << "bible-kjv is not installed";
  Corpus c = read_corpus("kjv");
  EXPECT_EQ(c.text.substr(0, c.text.find('\n')), "In the beginning God created the heaven and the earth.");
  EXPECT_EQ(c.lines, 31102);
  EXPECT_GT(c.text.size(), 4000000u);
  EXPECT_EQ(c.text.find("Ge1:"), std::string::npos);
  EXPECT_NE(c.text.find("\nThe grace of our Lord Jesus Christ be with you all. Amen.\n"), std::string::npos);
}

}  // namespace
}  // namespace brigade::data
