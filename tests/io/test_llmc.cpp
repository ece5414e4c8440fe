// llm.c's files, written by an independent Python writer (tests/io/write_llmc_files.py, run by
// CTest before this test, into its working directory): token shards read back exactly; a GPT-2
// checkpoint loads into gpipe's GPT layout (every tensor where the writer says it belongs, the
// head tied to wte, leading rows for a smaller vocabulary or T) and saves back byte for byte;
// malformed files and models that do not fit are each a gpipe::Error saying what differs.

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
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

// ---- GPT-2 checkpoints -----------------------------------------------------------------------

#include "gpipe/gpipe.hpp"
#include "gpipe/runtime/llmc.hpp"

namespace {

// The Python writer's checkpoint: maxT 8, V 10, L 2, NH 2, C 4, Vp 12.
using Block = gpipe::TransformerBlock<4, 2>;
template <std::size_t V, std::size_t T, class Head, class... Blocks>
using Gpt = gpipe::Pipeline<gpipe::Stage<gpipe::Embedding<V, T, 4>, Blocks...>,
                            gpipe::Stage<gpipe::LayerNorm<4>, Head>>;
using Padded = Gpt<12, 8, gpipe::Linear<4, 12, false>, Block, Block>;  // V = Vp, T = maxT
using Trimmed = Gpt<10, 6, gpipe::Linear<4, 10>, Block, Block>;        // V, T < maxT, head bias
template <class Model>
using TrainerOf = gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend>;

std::map<std::string, std::vector<float>> expected_checkpoint() {
  std::ifstream in("gpt2_expected.txt");
  REQUIRE_MESSAGE(in, "gpt2_expected.txt missing: run through CTest, which writes the files first");
  std::map<std::string, std::vector<float>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    for (double v; fields >> v;) out[name].push_back(static_cast<float>(v));
  }
  return out;
}

}  // namespace

TEST_SUITE("io llm.c") {
  TEST_CASE("an llm.c GPT-2 checkpoint loads into gpipe's GPT layout, head tied to wte") {
    const auto expected = expected_checkpoint();
    REQUIRE(expected.size() == 2 + 2 * 12 + 2);
    gpipe::host::Backend backend(2);
    TrainerOf<Padded> trainer(backend, {.ties = {{.parameter = "4.weight", .to = "0.wte.weight"}}});
    gpipe::load_llmc_gpt2(trainer, "gpt2.bin");
    for (const auto& [name, values] : expected) {
      CAPTURE(name);
      CHECK(trainer.parameter(name) == values);
    }
    CHECK(trainer.parameter("4.weight") == expected.at("0.wte.weight"));

    // Written back, it is the same file, byte for byte (V = 10 of the 12 padded rows).
    gpipe::save_llmc_gpt2(trainer, "mine_gpt2.bin", 10);
    CHECK(bytes_of("mine_gpt2.bin") == bytes_of("gpt2.bin"));
  }

  TEST_CASE("a model with the true vocabulary and shorter samples takes the leading rows") {
    const auto expected = expected_checkpoint();
    gpipe::host::Backend backend(2);
    TrainerOf<Trimmed> trainer(backend, {});
    gpipe::load_llmc_gpt2(trainer, "gpt2.bin");
    const auto& wte = expected.at("0.wte.weight");
    const auto& wpe = expected.at("0.wpe.weight");
    CHECK(trainer.parameter("0.wte.weight") == std::vector<float>(wte.begin(), wte.begin() + 40));
    CHECK(trainer.parameter("0.wpe.weight") == std::vector<float>(wpe.begin(), wpe.begin() + 24));
    CHECK(trainer.parameter("4.weight") == trainer.parameter("0.wte.weight"));
    CHECK(trainer.parameter("4.bias") == std::vector<float>(10, 0.0f));
    CHECK(trainer.parameter("2.mlp.c_fc.weight") == expected.at("2.mlp.c_fc.weight"));
    // Its head is not tied: after a step it differs from wte and cannot be written as llm.c's.
    std::vector<float> head = trainer.parameter("4.weight");
    head[0] += 1;
    trainer.set_parameter("4.weight", head);
    CHECK(contains(error_of([&] { gpipe::save_llmc_gpt2(trainer, "untied.bin"); }),
                   "ties the LM head to wte: \"4.weight\" must equal \"0.wte.weight\""));
  }

  TEST_CASE("a checkpoint that does not fit the model or the format is a gpipe::Error") {
    gpipe::host::Backend backend(2);
    TrainerOf<Gpt<12, 8, gpipe::Linear<4, 12>, Block>> one_block(backend, {});
    CHECK(contains(error_of([&] { gpipe::load_llmc_gpt2(one_block, "gpt2.bin"); }),
                   "the checkpoint has 2 layers, the model 1 Transformer blocks"));
    TrainerOf<Gpt<12, 8, gpipe::Linear<4, 12>, gpipe::TransformerBlock<4, 1>,
                  gpipe::TransformerBlock<4, 1>>>
        one_head(backend, {});
    CHECK(contains(error_of([&] { gpipe::load_llmc_gpt2(one_head, "gpt2.bin"); }),
                   "the checkpoint has 2 heads, the model's blocks 1"));
    TrainerOf<Gpt<11, 8, gpipe::Linear<4, 11>, Block, Block>> odd_vocab(backend, {});
    CHECK(contains(error_of([&] { gpipe::load_llmc_gpt2(odd_vocab, "gpt2.bin"); }),
                   "the model's vocabulary is 11, the checkpoint's 10 (padded 12)"));
    TrainerOf<Gpt<12, 9, gpipe::Linear<4, 12>, Block, Block>> long_samples(backend, {});
    CHECK(contains(error_of([&] { gpipe::load_llmc_gpt2(long_samples, "gpt2.bin"); }),
                   "the model's samples are 9 tokens, longer than the checkpoint's maxT = 8"));
    TrainerOf<Padded> padded(backend, {});
    CHECK(contains(error_of([&] { gpipe::load_llmc_gpt2(padded, "gpt2_bad_magic.bin"); }),
                   "magic number 20240520, expected 20240326"));
    CHECK(contains(error_of([&] { gpipe::load_llmc_gpt2(padded, "gpt2_bf16.bin"); }),
                   "version 5, expected 3"));
    CHECK(contains(error_of([&] { gpipe::load_llmc_gpt2(padded, "gpt2_short.bin"); }),
                   "does not match the 2300 bytes that follow it (it describes 2304)"));
    // A header's sizes are checked against the file before any tensor (or its name) is made:
    // 2^30 blocks of C = 4 (12 C^2 + 13 C = 244 floats each) beside the 88 floats of the rest.
    CHECK(contains(error_of([] { gpipe::io::load_llmc_gpt2("gpt2_many_layers.bin"); }),
                   "(maxT 8, Vp 12, L 1073741824, C 4) does not match the 2304 bytes that follow "
                   "it (it describes " +
                       std::to_string(4 * (88 + 244 * (std::size_t{1} << 30))) + ")"));
    CHECK(contains(error_of([] { gpipe::io::load_llmc_gpt2("gpt2_wide.bin"); }),
                   "(maxT 8, Vp 2147483647, L 2, C 2147483647) does not match the 2304 bytes "
                   "that follow it (it describes more than 2^62)"));
  }
}
