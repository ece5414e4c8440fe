#pragma once
// examples/train_gpt's data: text files read as bytes (vocabulary 256) or llm.c token shards
// (GPT-2's ids), split into a training and a held-out part, and batches drawn from them as a
// pure function of (seed, step, index), so that a run resumed from a checkpoint draws the
// batches the uninterrupted run would have drawn.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/io/llmc.hpp"

namespace train_gpt {

/// Token ids to train on and to validate on.
struct Corpus {
  bool bytes = true;  ///< text read as bytes (ids < 256); else llm.c token shards (GPT-2 ids)
  std::vector<std::int32_t> train, validation;
  std::size_t files = 0;
};

/// Whether `path` starts with llm.c's token-shard magic (int32 20240520).
inline bool is_llmc_shard(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char head[4] = {};
  in.read(reinterpret_cast<char*>(head), 4);
  const std::uint32_t magic = head[0] | head[1] << 8 | head[2] << 16 | std::uint32_t{head[3]} << 24;
  return in && magic == static_cast<std::uint32_t>(gpipe::io::llmc_tokens_magic);
}

inline std::vector<std::int32_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw gpipe::Error("train_gpt: cannot read " + path.string());
  std::vector<std::int32_t> out;
  for (auto it = std::istreambuf_iterator<char>(in); it != std::istreambuf_iterator<char>(); ++it)
    out.push_back(static_cast<unsigned char>(*it));
  return out;
}

/// Debian's fortune cookies (apt-get install fortunes): every file without an extension.
inline std::vector<std::filesystem::path> fortune_files() {
  const std::filesystem::path dir = "/usr/share/games/fortunes";
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(dir))
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.is_regular_file() && !entry.path().has_extension()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

/// Text files (bytes) or llm.c token shards, not both. Shards whose names contain "val" are the
/// validation set (llm.c's naming: fineweb_val_000000.bin); without one, and for text, the last
/// 10 % of the tokens is held out. `min_tokens` is what one batch window needs of each part.
inline Corpus load_corpus(const std::vector<std::filesystem::path>& files, std::size_t min_tokens) {
  Corpus corpus;
  corpus.files = files.size();
  if (files.empty())
    throw gpipe::Error(
        "train_gpt: no data: install Debian's fortunes (apt-get install fortunes) or give "
        "--data <text file or llm.c shard> (repeatable)");
  const bool shards = is_llmc_shard(files.front());
  corpus.bytes = !shards;
  for (const auto& path : files) {
    if (is_llmc_shard(path) != shards)
      throw gpipe::Error("train_gpt: " + path.string() + " is " +
                         (shards ? "not an llm.c token shard" : "an llm.c token shard") +
                         ", unlike " + files.front().string() + ": give text or shards, not both");
    std::vector<std::int32_t> tokens =
        shards ? gpipe::io::load_llmc_tokens(path) : read_bytes(path);
    auto& part = shards && path.filename().string().find("val") != std::string::npos
                     ? corpus.validation
                     : corpus.train;
    part.insert(part.end(), tokens.begin(), tokens.end());
  }
  if (corpus.validation.empty()) {
    const std::size_t split = corpus.train.size() / 10 * 9;
    corpus.validation.assign(corpus.train.begin() + static_cast<std::ptrdiff_t>(split),
                             corpus.train.end());
    corpus.train.resize(split);
  }
  if (corpus.train.size() <= min_tokens || corpus.validation.size() <= min_tokens)
    throw gpipe::Error("train_gpt: the data has " + std::to_string(corpus.train.size()) +
                       " training and " + std::to_string(corpus.validation.size()) +
                       " held-out tokens; each part needs more than " + std::to_string(min_tokens));
  return corpus;
}

/// `samples` windows of T + 1 tokens of `tokens`, at positions drawn from `rng`: inputs and
/// next-token targets, (samples, T) row-major.
inline void draw_batch(const std::vector<std::int32_t>& tokens, std::size_t samples, std::size_t T,
                       gpipe::Rng& rng, std::vector<std::int32_t>& x,
                       std::vector<std::int32_t>& y) {
  x.resize(samples * T);
  y.resize(samples * T);
  for (std::size_t b = 0; b < samples; ++b) {
    const std::size_t start = rng.next_u64() % (tokens.size() - T);
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start), T, x.begin() + b * T);
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start + 1), T, y.begin() + b * T);
  }
}

/// The training batch `index` (0 .. accumulation - 1) of step `step`: the same for the same
/// (seed, step, index), whatever ran before.
inline void training_batch(const Corpus& corpus, std::uint64_t seed, std::size_t step,
                           std::size_t index, std::size_t samples, std::size_t T,
                           std::vector<std::int32_t>& x, std::vector<std::int32_t>& y) {
  gpipe::Rng rng(seed * 0x9E3779B97F4A7C15ull + step * 1024 + index);
  draw_batch(corpus.train, samples, T, rng, x, y);
}

}  // namespace train_gpt
