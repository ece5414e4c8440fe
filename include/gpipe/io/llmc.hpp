#pragma once
// llm.c's token shards (the files its data preparation scripts write, e.g. fineweb_train_*.bin):
//   int32[256] header, little-endian: [0] = 20240520 (magic), [1] = 1 (version), [2] = n tokens,
//   the rest 0; then n uint16 token ids, little-endian.
// load_llmc_tokens checks magic, version and that the file holds exactly the header and n ids;
// anything else is a gpipe::Error naming the file and what was expected.

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "gpipe/error.hpp"

namespace gpipe::io {

inline constexpr std::int32_t llmc_tokens_magic = 20240520;
inline constexpr std::int32_t llmc_tokens_version = 1;
inline constexpr std::size_t llmc_header_ints = 256;

}  // namespace gpipe::io

// Helpers live in gpipe::detail: a gpipe::io::detail would hide it from the other io headers.
namespace gpipe::detail {

inline std::uint32_t read_le32(const unsigned char* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
         std::uint32_t{p[3]} << 24;
}

inline void put_le32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<unsigned char>(v >> shift));
}

}  // namespace gpipe::detail

namespace gpipe::io {

// The token ids of an llm.c shard.
inline std::vector<std::int32_t> load_llmc_tokens(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("gpipe: cannot open " + path.string());
  const std::vector<unsigned char> bytes{std::istreambuf_iterator<char>(in),
                                         std::istreambuf_iterator<char>()};
  const std::string where = "gpipe: " + path.string() + ": ";
  constexpr std::size_t header_bytes = llmc_header_ints * 4;
  if (bytes.size() < header_bytes)
    throw Error(where + "has " + std::to_string(bytes.size()) +
                " bytes, fewer than an llm.c token shard's 1024-byte header");
  const auto magic = static_cast<std::int32_t>(gpipe::detail::read_le32(bytes.data()));
  const auto version = static_cast<std::int32_t>(gpipe::detail::read_le32(bytes.data() + 4));
  const auto count = static_cast<std::int32_t>(gpipe::detail::read_le32(bytes.data() + 8));
  if (magic != llmc_tokens_magic)
    throw Error(where + "magic number " + std::to_string(magic) + ", expected " +
                std::to_string(llmc_tokens_magic) + " (an llm.c token shard)");
  if (version != llmc_tokens_version)
    throw Error(where + "version " + std::to_string(version) + ", expected " +
                std::to_string(llmc_tokens_version) + " (uint16 tokens)");
  if (count < 0) throw Error(where + "the header says " + std::to_string(count) + " tokens");
  const std::size_t n = static_cast<std::size_t>(count);
  if (bytes.size() - header_bytes != 2 * n)
    throw Error(where + "the header says " + std::to_string(n) + " tokens (" +
                std::to_string(2 * n) + " bytes) but " +
                std::to_string(bytes.size() - header_bytes) + " bytes follow the header");
  std::vector<std::int32_t> tokens(n);
  const unsigned char* p = bytes.data() + header_bytes;
  for (std::size_t i = 0; i < n; ++i)
    tokens[i] = static_cast<std::int32_t>(std::uint32_t{p[2 * i]} | std::uint32_t{p[2 * i + 1]} << 8);
  return tokens;
}

// Writes tokens (each in [0, 65536)) as an llm.c shard.
inline void save_llmc_tokens(const std::filesystem::path& path,
                             std::span<const std::int32_t> tokens) {
  if (tokens.size() > 0x7fffffff)
    throw Error("gpipe: an llm.c shard holds at most 2^31 - 1 tokens, got " +
                std::to_string(tokens.size()));
  std::vector<unsigned char> bytes;
  bytes.reserve(llmc_header_ints * 4 + 2 * tokens.size());
  std::array<std::uint32_t, llmc_header_ints> header{};
  header[0] = static_cast<std::uint32_t>(llmc_tokens_magic);
  header[1] = static_cast<std::uint32_t>(llmc_tokens_version);
  header[2] = static_cast<std::uint32_t>(tokens.size());
  for (std::uint32_t v : header) gpipe::detail::put_le32(bytes, v);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 0xffff)
      throw Error("gpipe: token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                  ", which an llm.c shard (uint16) cannot hold");
    bytes.push_back(static_cast<unsigned char>(tokens[i] & 0xff));
    bytes.push_back(static_cast<unsigned char>(tokens[i] >> 8));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("gpipe: cannot write " + path.string());
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error("gpipe: writing " + path.string() + " failed");
}

}  // namespace gpipe::io
