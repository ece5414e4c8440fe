// llm.c's token shards: files written by an independent Python writer (tests/io/write_llmc_files.py,
// run by CTest before this test, into its working directory) read back exactly, malformed ones
// (magic, version, token count, truncated header) are each a gpipe::Error, and gpipe's writer
// makes the same bytes as the Python writer.

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpipe/io/llmc.hpp"
#include "support/errors.hpp"

namespace {

using gpipe::test::contains;
using gpipe::test::error_of;

std::vector<unsigned char> bytes_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::int32_t> expected_tokens() {
  std::ifstream in("good.txt");
  REQUIRE_MESSAGE(in, "good.txt missing: run through CTest, which writes the files first");
  std::vector<std::int32_t> out;
  for (std::int32_t t; in >> t;) out.push_back(t);
  return out;
}

void check_error(const char* file, const std::string& part) {
  const std::string message = error_of([&] { gpipe::io::load_llmc_tokens(file); });
  CAPTURE(message);
  CHECK(contains(message, file));
  CHECK(contains(message, part));
}

}  // namespace

TEST_SUITE("io llm.c") {
  TEST_CASE("a token shard from llm.c's format reads back every uint16 id") {
    const std::vector<std::int32_t> tokens = gpipe::io::load_llmc_tokens("good.bin");
    CHECK(tokens == expected_tokens());
    CHECK(tokens.size() == 1003);
    CHECK(tokens[1001] == 65535);
    CHECK(gpipe::io::load_llmc_tokens("empty.bin").empty());
  }

  TEST_CASE("gpipe writes the same bytes as the independent writer") {
    gpipe::io::save_llmc_tokens("mine.bin", expected_tokens());
    CHECK(bytes_of("mine.bin") == bytes_of("good.bin"));
    CHECK(contains(error_of([] {
                     gpipe::io::save_llmc_tokens("bad.bin", std::vector<std::int32_t>{1, 65536});
                   }),
                   "token 1 is 65536, which an llm.c shard (uint16) cannot hold"));
  }

  TEST_CASE("a malformed token shard is a gpipe::Error that says what is wrong") {
    check_error("bad_magic.bin", "magic number 20240326, expected 20240520");
    check_error("bad_version.bin", "version 2, expected 1");
    check_error("short.bin", "the header says 1004 tokens (2008 bytes) but 2006 bytes follow");
    check_error("long.bin", "the header says 1003 tokens (2006 bytes) but 2007 bytes follow");
    check_error("truncated_header.bin", "has 100 bytes, fewer than an llm.c token shard's");
    check_error("missing.bin", "cannot open");
  }
}
