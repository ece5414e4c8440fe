#pragma once
// llm.c's file formats: token shards and GPT-2 checkpoints.
//
// Token shards (the files its data preparation scripts write, e.g. fineweb_train_*.bin):
//   int32[256] header, little-endian: [0] = 20240520 (magic), [1] = 1 (version), [2] = n tokens,
//   the rest 0; then n uint16 token ids, little-endian.
// load_llmc_tokens checks magic, version and that the file holds exactly the header and n ids;
// anything else is a gpipe::Error naming the file and what was expected.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"

// Checkpoint tensors are copied to and from memory as they are.
static_assert(std::endian::native == std::endian::little,
              "gpipe's llm.c I/O assumes a little-endian host");

namespace gpipe::io {

/// Header entry 0 of an llm.c token shard.
inline constexpr std::int32_t llmc_tokens_magic = 20240520;
/// Header entry 1 of a token shard: its ids are uint16.
inline constexpr std::int32_t llmc_tokens_version = 1;
/// int32 entries in the header of both llm.c formats (1024 bytes); the unused ones are 0.
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

// The bytes of the llm.c file `path` (an llm.c <what>), whose int32[256] header starts with
// `magic` and `version` (the format `version_means`); throws a gpipe::Error naming the file for a
// short header, another magic number or another version.
inline std::vector<unsigned char> read_llmc_file(const std::filesystem::path& path,
                                                 std::int32_t magic, std::int32_t version,
                                                 const std::string& what,
                                                 const std::string& version_means) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("gpipe: cannot open " + path.string());
  std::vector<unsigned char> bytes{std::istreambuf_iterator<char>(in),
                                   std::istreambuf_iterator<char>()};
  const std::string where = "gpipe: " + path.string() + ": ";
  if (bytes.size() < 1024)
    throw Error(where + "has " + std::to_string(bytes.size()) + " bytes, fewer than an llm.c " +
                what + "'s 1024-byte header");
  const auto got_magic = static_cast<std::int32_t>(read_le32(bytes.data()));
  const auto got_version = static_cast<std::int32_t>(read_le32(bytes.data() + 4));
  if (got_magic != magic)
    throw Error(where + "magic number " + std::to_string(got_magic) + ", expected " +
                std::to_string(magic) + " (an llm.c " + what + ")");
  if (got_version != version)
    throw Error(where + "version " + std::to_string(got_version) + ", expected " +
                std::to_string(version) + " (" + version_means + ")");
  return bytes;
}

inline void write_llmc_file(const std::filesystem::path& path,
                            const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("gpipe: cannot write " + path.string());
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error("gpipe: writing " + path.string() + " failed");
}

}  // namespace gpipe::detail

namespace gpipe::io {

/// The token ids of an llm.c token shard (e.g. fineweb_train_*.bin): an int32[256] header,
/// little-endian, of magic 20240520, version 1 and the count n, then n little-endian uint16 ids.
/// Throws `gpipe::Error` naming the file for another magic or version, or a size other than
/// exactly the header and n ids.
inline std::vector<std::int32_t> load_llmc_tokens(const std::filesystem::path& path) {
  const std::vector<unsigned char> bytes = gpipe::detail::read_llmc_file(
      path, llmc_tokens_magic, llmc_tokens_version, "token shard", "uint16 tokens");
  const std::string where = "gpipe: " + path.string() + ": ";
  constexpr std::size_t header_bytes = llmc_header_ints * 4;
  const auto count = static_cast<std::int32_t>(gpipe::detail::read_le32(bytes.data() + 8));
  if (count < 0) throw Error(where + "the header says " + std::to_string(count) + " tokens");
  const std::size_t n = static_cast<std::size_t>(count);
  if (bytes.size() - header_bytes != 2 * n)
    throw Error(where + "the header says " + std::to_string(n) + " tokens (" +
                std::to_string(2 * n) + " bytes) but " +
                std::to_string(bytes.size() - header_bytes) + " bytes follow the header");
  std::vector<std::int32_t> tokens(n);
  const unsigned char* p = bytes.data() + header_bytes;
  for (std::size_t i = 0; i < n; ++i)
    tokens[i] =
        static_cast<std::int32_t>(std::uint32_t{p[2 * i]} | std::uint32_t{p[2 * i + 1]} << 8);
  return tokens;
}

/// Writes tokens (each in [0, 65536)) as an llm.c shard that `load_llmc_tokens` reads. Throws
/// `gpipe::Error` for a token out of range, more than 2^31 - 1 tokens or a failed write.
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
  gpipe::detail::write_llmc_file(path, bytes);
}

}  // namespace gpipe::io

// llm.c's GPT-2 checkpoints: see LlmcGpt2Checkpoint.
namespace gpipe::io {

/// Header entry 0 of an llm.c GPT-2 checkpoint.
inline constexpr std::int32_t llmc_gpt2_magic = 20240326;
/// Header entry 1 of a GPT-2 checkpoint: fp32 tensors with a padded vocabulary.
inline constexpr std::int32_t llmc_gpt2_version = 3;

/// A GPT-2 checkpoint's sizes: header entries 2 to 7, in this order.
struct LlmcGpt2Config {
  std::size_t max_seq_len = 0;        ///< maxT
  std::size_t vocab_size = 0;         ///< V
  std::size_t num_layers = 0;         ///< L
  std::size_t num_heads = 0;          ///< NH
  std::size_t channels = 0;           ///< C
  std::size_t padded_vocab_size = 0;  ///< Vp >= V
};

/// One tensor of a GPT-2 checkpoint, under its name in gpipe's GPT layout.
struct LlmcTensor {
  std::string name;                ///< e.g. "1.attn.c_attn.weight" (see `llmc_gpt2_layout`)
  std::vector<std::size_t> shape;  ///< e.g. (3C, C) for a Linear: (out_features, in_features)
  std::vector<float> data;         ///< the product of `shape` floats, row-major
};

/// An llm.c GPT-2 checkpoint (gpt2_124M.bin and what train_gpt2 writes), fp32 version 3:
///
///     int32[256] header: [0] = 20240326 (magic), [1] = 3 (version), [2] = maxT, [3] = V,
///     [4] = L, [5] = NH, [6] = C, [7] = Vp (V padded, e.g. 50257 -> 50304); the rest 0.
///     Then 16 fp32 tensors, each grouped across the L layers where it is per layer:
///       wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C),
///       attprojw (L, C, C), attprojb (L, C), ln2w (L, C), ln2b (L, C), fcw (L, 4C, C),
///       fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C), lnfb (C).
///
/// The LM head is wte itself (tied). Here the tensors carry the names of gpipe's GPT layout
/// (layer 0 Embedding, layers 1..L TransformerBlock, layer L + 1 LayerNorm): `0.wte.weight`,
/// `0.wpe.weight`, `<l + 1>.ln_1.weight`, `<l + 1>.attn.c_attn.weight`, ..., `<L + 1>.weight`,
/// `<L + 1>.bias`; wte keeps its Vp rows.
struct LlmcGpt2Checkpoint {
  LlmcGpt2Config config;  ///< the header's sizes
  /// In file order, a per-layer tensor once per layer: `1.ln_1.weight`, ..., `L.ln_1.weight`,
  /// `1.ln_1.bias`, ...
  std::vector<LlmcTensor> tensors;
};

/// The tensors a checkpoint of `c` holds, (name, shape) in file order.
inline std::vector<std::pair<std::string, std::vector<std::size_t>>> llmc_gpt2_layout(
    const LlmcGpt2Config& c) {
  const std::size_t C = c.channels, L = c.num_layers;
  std::vector<std::pair<std::string, std::vector<std::size_t>>> out;
  out.push_back({"0.wte.weight", {c.padded_vocab_size, C}});
  out.push_back({"0.wpe.weight", {c.max_seq_len, C}});
  const std::vector<std::pair<std::string, std::vector<std::size_t>>> per_layer{
      {"ln_1.weight", {C}},
      {"ln_1.bias", {C}},
      {"attn.c_attn.weight", {3 * C, C}},
      {"attn.c_attn.bias", {3 * C}},
      {"attn.c_proj.weight", {C, C}},
      {"attn.c_proj.bias", {C}},
      {"ln_2.weight", {C}},
      {"ln_2.bias", {C}},
      {"mlp.c_fc.weight", {4 * C, C}},
      {"mlp.c_fc.bias", {4 * C}},
      {"mlp.c_proj.weight", {C, 4 * C}},
      {"mlp.c_proj.bias", {C}}};
  for (const auto& [leaf, shape] : per_layer)
    for (std::size_t l = 0; l < L; ++l) out.push_back({std::to_string(l + 1) + "." + leaf, shape});
  out.push_back({std::to_string(L + 1) + ".weight", {C}});
  out.push_back({std::to_string(L + 1) + ".bias", {C}});
  return out;
}

/// Reads an llm.c GPT-2 checkpoint, its tensors in file order. Throws `gpipe::Error` naming the
/// file when it cannot be read, its magic or version differ, a size in the header is not
/// positive, Vp < V, NH does not divide C, or the bytes after the header are not exactly the
/// tensors the header describes.
inline LlmcGpt2Checkpoint load_llmc_gpt2(const std::filesystem::path& path) {
  const std::vector<unsigned char> bytes =
      gpipe::detail::read_llmc_file(path, llmc_gpt2_magic, llmc_gpt2_version, "GPT-2 checkpoint",
                                    "fp32 with a padded vocabulary");
  const std::string where = "gpipe: " + path.string() + ": ";
  constexpr std::size_t header_bytes = llmc_header_ints * 4;
  auto header = [&](std::size_t i) {
    return static_cast<std::int32_t>(gpipe::detail::read_le32(bytes.data() + 4 * i));
  };
  for (std::size_t i = 2; i < 8; ++i)
    if (header(i) <= 0)
      throw Error(where + "header entry " + std::to_string(i) + " is " + std::to_string(header(i)) +
                  ", expected a positive size");
  LlmcGpt2Checkpoint out;
  LlmcGpt2Config& c = out.config;
  c.max_seq_len = static_cast<std::size_t>(header(2));
  c.vocab_size = static_cast<std::size_t>(header(3));
  c.num_layers = static_cast<std::size_t>(header(4));
  c.num_heads = static_cast<std::size_t>(header(5));
  c.channels = static_cast<std::size_t>(header(6));
  c.padded_vocab_size = static_cast<std::size_t>(header(7));
  if (c.padded_vocab_size < c.vocab_size || c.channels % c.num_heads != 0)
    throw Error(where + "inconsistent header: V = " + std::to_string(c.vocab_size) +
                ", Vp = " + std::to_string(c.padded_vocab_size) +
                ", C = " + std::to_string(c.channels) + ", NH = " + std::to_string(c.num_heads));
  // Sizes come from the file: count with saturation at `cap` floats (no overflow), and from the
  // layouts of no block and of one (a block's floats, times L), so that a header's L is checked
  // against the file's size before L blocks of tensors are made.
  constexpr std::size_t cap = std::size_t{1} << 60;
  const auto mul = [](std::size_t a, std::size_t b) { return b != 0 && a > cap / b ? cap : a * b; };
  const auto add = [](std::size_t a, std::size_t b) { return a > cap - b ? cap : a + b; };
  const auto floats_with = [&](std::size_t layers) {
    LlmcGpt2Config some = c;
    some.num_layers = layers;
    std::size_t sum = 0;
    for (const auto& [name, shape] : llmc_gpt2_layout(some)) {
      std::size_t n = 1;
      for (std::size_t d : shape) n = mul(n, d);
      sum = add(sum, n);
    }
    return sum;
  };
  const std::size_t rest = floats_with(0), with_one = floats_with(1);
  const std::size_t floats = with_one == cap ? cap : add(rest, mul(c.num_layers, with_one - rest));
  if (bytes.size() - header_bytes != 4 * floats)
    throw Error(where + "the header (maxT " + std::to_string(c.max_seq_len) + ", Vp " +
                std::to_string(c.padded_vocab_size) + ", L " + std::to_string(c.num_layers) +
                ", C " + std::to_string(c.channels) + ") does not match the " +
                std::to_string(bytes.size() - header_bytes) +
                " bytes that follow it (it describes " +
                (floats == cap ? std::string("more than 2^62") : std::to_string(4 * floats)) + ")");
  const unsigned char* p = bytes.data() + header_bytes;
  for (const auto& [name, shape] : llmc_gpt2_layout(c)) {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    LlmcTensor t{name, shape, std::vector<float>(n)};
    std::memcpy(t.data.data(), p, 4 * n);  // little-endian fp32 (checked at the top of the file)
    p += 4 * n;
    out.tensors.push_back(std::move(t));
  }
  return out;
}

/// Writes a checkpoint whose tensors are those of llmc_gpt2_layout(config), by name, in any order.
inline void save_llmc_gpt2(const std::filesystem::path& path, const LlmcGpt2Checkpoint& ckpt) {
  const LlmcGpt2Config& c = ckpt.config;
  std::vector<unsigned char> bytes;
  std::array<std::uint32_t, llmc_header_ints> header{};
  header[0] = static_cast<std::uint32_t>(llmc_gpt2_magic);
  header[1] = static_cast<std::uint32_t>(llmc_gpt2_version);
  const std::array<std::size_t, 6> sizes{c.max_seq_len, c.vocab_size, c.num_layers,
                                         c.num_heads,   c.channels,   c.padded_vocab_size};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0 || sizes[i] > 0x7fffffff)
      throw Error("gpipe: llm.c checkpoint header entry " + std::to_string(i + 2) + " is " +
                  std::to_string(sizes[i]) + ", expected a positive 32-bit size");
    header[i + 2] = static_cast<std::uint32_t>(sizes[i]);
  }
  for (std::uint32_t v : header) gpipe::detail::put_le32(bytes, v);
  for (const auto& [name, shape] : llmc_gpt2_layout(c)) {
    const LlmcTensor* t = nullptr;
    for (const LlmcTensor& candidate : ckpt.tensors)
      if (candidate.name == name) t = &candidate;
    if (t == nullptr) throw Error("gpipe: the llm.c checkpoint needs a tensor \"" + name + "\"");
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    if (t->shape != shape || t->data.size() != n)
      throw Error("gpipe: tensor \"" + name + "\" does not have the shape the llm.c layout gives");
    const auto* raw = reinterpret_cast<const unsigned char*>(t->data.data());
    bytes.insert(bytes.end(), raw, raw + 4 * n);
  }
  gpipe::detail::write_llmc_file(path, bytes);
}

}  // namespace gpipe::io
