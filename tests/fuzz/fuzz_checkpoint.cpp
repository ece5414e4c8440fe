// libFuzzer target: Trainer::load_checkpoint with the fuzzer's bytes as the checkpoint's
// model.safetensors.index.json, beside the valid shards of a checkpoint saved once (a small
// model on 2 host devices, one AdamW step). Any index must load or throw gpipe::Error; a crash,
// a sanitizer report, another exception or running out of memory is a bug. Built and run by
// scripts/fuzz, which seeds the corpus with the index the trainer wrote (GPIPE_FUZZ_SEED_DIR).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_file.hpp"
#include "gpipe/gpipe.hpp"
#include "support/models.hpp"

namespace {

using namespace gpipe;

struct SavedCheckpoint {
  host::Backend backend{2};
  Trainer<test::Model2, SoftmaxCrossEntropy, host::Backend> trainer{backend, {.seed = 1}};
  std::filesystem::path dir = fuzz::scratch_file("checkpoint");

  SavedCheckpoint() {
    const std::vector<float> x = test::random_inputs(4, test::Model2::in_features, 1);
    const std::vector<std::int32_t> y = test::random_classes(4, test::L6::out_features, 2);
    trainer.zero_grad();
    trainer.forward_backward(x, y);
    trainer.step(optim::AdamW({.lr = 1e-2}));
    trainer.save_checkpoint(dir, {{"data_position", "4"}});
    if (const char* seeds = std::getenv("GPIPE_FUZZ_SEED_DIR"))
      std::filesystem::copy_file(dir / "model.safetensors.index.json",
                                 std::filesystem::path(seeds) / "saved_index.json",
                                 std::filesystem::copy_options::overwrite_existing);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static SavedCheckpoint saved;
  fuzz::write_file(saved.dir / "model.safetensors.index.json", data, size);
  try {
    saved.trainer.load_checkpoint(saved.dir);
  } catch (const Error&) {
  }
  return 0;
}
