#pragma once
// examples/train_gpt's data: text files read as bytes (vocabulary 256) or llm.c token shards
// (GPT-2's ids), split into a training and a held-out part, and batches drawn from them as a
// pure function of (seed, step, index), so that a run resumed from a checkpoint draws the
// batches the uninterrupted run would have drawn. With a separator the tokens are documents:
// each batch then carries each token's document and ignores the targets across borders.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/gpipe.hpp"
#include "gpipe/io/llmc.hpp"

namespace train_gpt {

/// Token ids to train on and to validate on.
struct Corpus {
  bool bytes = true;  ///< text read as bytes (ids < 256); else llm.c token shards (GPT-2 ids)
  std::vector<std::int32_t> train, validation;
  std::size_t files = 0;
  /// With documents (mark_documents): each token's document, counted from 0 in each part;
  /// empty otherwise.
  std::vector<std::int32_t> train_documents, validation_documents;
  std::vector<std::int32_t> separator;  ///< what ends a document (mark_documents)
};

/// Whether tokens[0, end) ends with `separator` (never for an empty one).
inline bool ends_with(const std::vector<std::int32_t>& tokens, std::size_t end,
                      const std::vector<std::int32_t>& separator) {
  return !separator.empty() && end >= separator.size() &&
         std::equal(separator.begin(), separator.end(),
                    tokens.begin() + static_cast<std::ptrdiff_t>(end - separator.size()));
}

/// Each token's document: a separator ends the document it closes (its tokens belong to it), and
/// the token after it starts the next one.
inline std::vector<std::int32_t> document_index(const std::vector<std::int32_t>& tokens,
                                                const std::vector<std::int32_t>& separator) {
  std::vector<std::int32_t> out(tokens.size());
  std::int32_t document = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0 && ends_with(tokens, i, separator)) ++document;
    out[i] = document;
  }
  return out;
}

/// Makes the corpus documents, split at `separator` (in both parts).
inline void mark_documents(Corpus& corpus, const std::vector<std::int32_t>& separator) {
  corpus.separator = separator;
  corpus.train_documents = document_index(corpus.train, separator);
  corpus.validation_documents = document_index(corpus.validation, separator);
}

/// A separator given as text with C's escapes \n, \t and \\, as bytes.
inline std::vector<std::int32_t> separator_bytes(std::string_view text) {
  std::vector<std::int32_t> out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\\' && i + 1 < text.size()) {
      const char next = text[++i];
      c = next == 'n' ? '\n' : next == 't' ? '\t' : next;
    }
    out.push_back(static_cast<unsigned char>(c));
  }
  return out;
}

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

/// A batch: inputs and next-token targets, (samples, T) row-major, and with documents each
/// input's document (empty without).
struct Batch {
  std::vector<std::int32_t> x, y, documents;
};

/// `samples` windows of T + 1 tokens of `tokens`, at positions drawn from `rng`. With
/// `documents` (each token's, as document_index gives them; empty: none) the batch carries the
/// inputs' documents, and a target in another document than its input (the first token after a
/// separator) is gpipe::ignore_index: a document is not predicted from the one before it.
inline void draw_batch(const std::vector<std::int32_t>& tokens,
                       const std::vector<std::int32_t>& documents, std::size_t samples,
                       std::size_t T, gpipe::Rng& rng, Batch& batch) {
  batch.x.resize(samples * T);
  batch.y.resize(samples * T);
  batch.documents.resize(documents.empty() ? 0 : samples * T);
  for (std::size_t b = 0; b < samples; ++b) {
    const std::size_t start = rng.next_u64() % (tokens.size() - T);
    const auto at = static_cast<std::ptrdiff_t>(start);
    std::copy_n(tokens.begin() + at, T, batch.x.begin() + b * T);
    std::copy_n(tokens.begin() + at + 1, T, batch.y.begin() + b * T);
    if (documents.empty()) continue;
    std::copy_n(documents.begin() + at, T, batch.documents.begin() + b * T);
    for (std::size_t t = 0; t < T; ++t)
      if (documents[start + t + 1] != documents[start + t])
        batch.y[b * T + t] = gpipe::ignore_index;
  }
}

/// The training batch `index` (0 .. accumulation - 1) of step `step`: the same for the same
/// (seed, step, index), whatever ran before.
inline void training_batch(const Corpus& corpus, std::uint64_t seed, std::size_t step,
                           std::size_t index, std::size_t samples, std::size_t T, Batch& batch) {
  gpipe::Rng rng(seed * 0x9E3779B97F4A7C15ull + step * 1024 + index);
  draw_batch(corpus.train, corpus.train_documents, samples, T, rng, batch);
}

}  // namespace train_gpt
