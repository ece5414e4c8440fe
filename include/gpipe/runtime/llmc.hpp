#pragma once
// llm.c GPT-2 checkpoints in and out of a Trainer (the file format: gpipe/io/llmc.hpp).
//
// The model must have gpipe's GPT layout: layer 0 Embedding<V, T, C>, layers 1..L
// TransformerBlock<C, NH>, layer L + 1 LayerNorm<C>, layer L + 2 the LM head Linear<C, V>
// (with or without bias), on any split into stages. llm.c ties its head to wte, so:
//   load_llmc_gpt2   the model's V is the file's Vp or its true V (the first V rows of wte are
//                    read), T <= maxT (the first T rows of wpe); the head gets wte and a zero
//                    bias. Tie the head to "0.wte.weight" (Trainer::Options::ties) to train
//                    it as llm.c does.
//   save_llmc_gpt2   writes maxT = T, Vp = the model's V, and V = vocab_size (<= Vp, default
//                    Vp); the head must equal wte and its bias, if any, be zero.
// Anything else (another layout, a width, head count or layer count that differs) is a
// gpipe::Error that names what differs.

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/io/llmc.hpp"
#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/pipeline.hpp"

namespace gpipe {
namespace detail {

// heads_v<Model>: H of the model's Transformer blocks (0 when it has none).
template <class B>
constexpr std::size_t heads_of_v = [] {
  if constexpr (requires { B::heads; }) return std::size_t{B::heads};
  return std::size_t{0};
}();
template <class C>
constexpr std::size_t chain_heads_v = 0;
template <class... Bs>
constexpr std::size_t chain_heads_v<Chain<Bs...>> = std::max({std::size_t{0}, heads_of_v<Bs>...});
template <class Model>
constexpr std::size_t heads_v = [] {
  std::size_t h = 0;
  [&]<std::size_t... S>(std::index_sequence<S...>) {
    ((h = std::max(h, chain_heads_v<typename Model::template stage_t<S>>)), ...);
  }
  (std::make_index_sequence<Model::num_stages>{});
  return h;
}();

// The shape of the model's parameter `name`, or nullptr.
inline const ParameterInfo* find_parameter(const std::vector<ParameterInfo>& infos,
                                           std::string_view name) {
  for (const ParameterInfo& info : infos)
    if (info.name == name) return &info;
  return nullptr;
}

// L: the number of Transformer blocks at layers 1, 2, ... in gpipe's GPT layout.
inline std::size_t gpt_layers(const std::vector<ParameterInfo>& infos) {
  std::size_t l = 0;
  while (find_parameter(infos, std::to_string(l + 1) + ".ln_1.weight") != nullptr) ++l;
  return l;
}

inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The rows of checkpoint tensor `t` that the model's parameter `info` takes: all of them, but the
// model's V of wte (the file's Vp or its true V) and T <= maxT of wpe.
inline std::size_t llmc_rows_read(const io::LlmcTensor& t, const ParameterInfo& info,
                                  const io::LlmcGpt2Config& c, const std::string& where) {
  if (t.name == "0.wte.weight") {
    require(info.shape[0] == c.padded_vocab_size || info.shape[0] == c.vocab_size,
            where + "the model's vocabulary is " + std::to_string(info.shape[0]) +
                ", the checkpoint's " + std::to_string(c.vocab_size) + " (padded " +
                std::to_string(c.padded_vocab_size) + ")");
    return info.shape[0];
  }
  if (t.name == "0.wpe.weight") {
    require(info.shape[0] <= c.max_seq_len,
            where + "the model's samples are " + std::to_string(info.shape[0]) +
                " tokens, longer than the checkpoint's maxT = " + std::to_string(c.max_seq_len));
    return info.shape[0];
  }
  return t.shape.size() == 2 ? t.shape[0] : 1;
}

// Sets what the checkpoint's tensors did not (`covered`): the head, from wte (tied in llm.c; null
// when the file had none) and a zero bias. Throws Error for any other parameter.
template <class Trainer>
void set_llmc_head(Trainer& trainer, const std::vector<const ParameterInfo*>& covered,
                   const std::vector<float>* wte, std::size_t layers, std::size_t channels,
                   const std::string& where) {
  const std::vector<ParameterInfo>& infos = trainer.parameter_info();
  const std::string head = std::to_string(layers + 2);
  for (const ParameterInfo& info : infos) {
    if (std::find(covered.begin(), covered.end(), &info) != covered.end()) continue;
    if (info.name == head + ".weight" && wte != nullptr &&
        info.shape == std::vector<std::size_t>{infos[0].shape[0], channels}) {
      trainer.set_parameter(info.name, std::span<const float>(*wte).first(info.size));
    } else if (info.name == head + ".bias") {
      trainer.set_parameter(info.name, std::vector<float>(info.size, 0.0f));
    } else {
      throw Error("gpipe: " + where + "the model's parameter \"" + info.name +
                  "\" has no counterpart in an llm.c GPT-2 (layout: Embedding, " +
                  std::to_string(layers) + " TransformerBlocks, LayerNorm, head Linear<" +
                  std::to_string(channels) + ", V>)");
    }
  }
}

}  // namespace detail

/// Sets the parameters of `trainer`, whose model has gpipe's GPT layout (layer 0
/// `Embedding<V, T, C>`, layers 1..L `TransformerBlock<C, NH>`, layer L + 1 `LayerNorm<C>`, layer
/// L + 2 the LM head `Linear<C, V>` with or without bias, on any split into stages), from the
/// llm.c GPT-2 checkpoint `path`. The model's V is the file's Vp or its true V (the first V rows of
/// wte are read) and T <= maxT (the first T rows of wpe); the head gets wte and a zero bias. Tie
/// the head to `0.wte.weight` (`Trainer::Options::ties`) to train it as llm.c does. Throws
/// `gpipe::Error` naming what differs for another layout, width, head count or layer count.
template <class Trainer>
void load_llmc_gpt2(Trainer& trainer, const std::filesystem::path& path) {
  using Model = typename Trainer::model_type;
  const io::LlmcGpt2Checkpoint ckpt = io::load_llmc_gpt2(path);
  const io::LlmcGpt2Config& c = ckpt.config;
  const std::vector<ParameterInfo>& infos = trainer.parameter_info();
  const std::string where = path.string() + ": ";
  const std::size_t L = detail::gpt_layers(infos);
  detail::require(L == c.num_layers, where + "the checkpoint has " + std::to_string(c.num_layers) +
                                         " layers, the model " + std::to_string(L) +
                                         " Transformer blocks");
  detail::require(detail::heads_v<Model> == c.num_heads,
                  where + "the checkpoint has " + std::to_string(c.num_heads) +
                      " heads, the model's blocks " + std::to_string(detail::heads_v<Model>));
  std::vector<const ParameterInfo*> covered;
  const std::vector<float>* wte = nullptr;
  for (const io::LlmcTensor& t : ckpt.tensors) {
    const ParameterInfo* info = detail::find_parameter(infos, t.name);
    detail::require(info != nullptr, where + "the model has no parameter \"" + t.name +
                                         "\" (it needs gpipe's GPT layout: Embedding, " +
                                         std::to_string(L) +
                                         " TransformerBlocks, LayerNorm, head)");
    const std::size_t cols = t.shape.back();
    const std::size_t rows = detail::llmc_rows_read(t, *info, c, where);
    if (t.name == "0.wte.weight") wte = &t.data;
    const std::vector<std::size_t> shape =
        t.shape.size() == 2 ? std::vector<std::size_t>{rows, cols} : t.shape;
    detail::require(info->shape == shape, where + "\"" + t.name + "\" is " +
                                              detail::shape_text(t.shape) + " in the checkpoint, " +
                                              detail::shape_text(info->shape) + " in the model");
    trainer.set_parameter(t.name, std::span<const float>(t.data).first(rows * cols));
    covered.push_back(info);
  }
  detail::set_llmc_head(trainer, covered, wte, L, c.channels, where);
}

/// Writes the parameters of `trainer` (gpipe's GPT layout, as for `load_llmc_gpt2`) as the llm.c
/// GPT-2 checkpoint `path`, with maxT = T, Vp = the model's V and V = `vocab_size` (<= Vp; 0:
/// Vp). Throws `gpipe::Error` when the layout differs, the head is not equal to wte, or its bias
/// (if any) is not zero.
template <class Trainer>
void save_llmc_gpt2(const Trainer& trainer, const std::filesystem::path& path,
                    std::size_t vocab_size = 0) {
  using Model = typename Trainer::model_type;
  const std::vector<ParameterInfo>& infos = trainer.parameter_info();
  const std::size_t L = detail::gpt_layers(infos);
  const ParameterInfo* wte = detail::find_parameter(infos, "0.wte.weight");
  const ParameterInfo* wpe = detail::find_parameter(infos, "0.wpe.weight");
  detail::require(wte != nullptr && wpe != nullptr && L > 0,
                  "save_llmc_gpt2 needs gpipe's GPT layout (Embedding, TransformerBlocks, "
                  "LayerNorm, head)");
  io::LlmcGpt2Checkpoint ckpt;
  io::LlmcGpt2Config& c = ckpt.config;
  c.max_seq_len = wpe->shape[0];
  c.padded_vocab_size = wte->shape[0];
  c.vocab_size = vocab_size == 0 ? c.padded_vocab_size : vocab_size;
  detail::require(c.vocab_size <= c.padded_vocab_size,
                  "vocab_size " + std::to_string(c.vocab_size) + " exceeds the model's " +
                      std::to_string(c.padded_vocab_size));
  c.num_layers = L;
  c.num_heads = detail::heads_v<Model>;
  c.channels = wte->shape[1];
  const std::vector<float> embedding = trainer.parameter("0.wte.weight");
  const std::string head = std::to_string(L + 2);
  detail::require(detail::find_parameter(infos, head + ".weight") != nullptr &&
                      trainer.parameter(head + ".weight") == embedding,
                  "an llm.c checkpoint ties the LM head to wte: \"" + head +
                      ".weight\" must equal \"0.wte.weight\" (tie them in the Trainer's options)");
  if (detail::find_parameter(infos, head + ".bias") != nullptr) {
    const std::vector<float> bias = trainer.parameter(head + ".bias");
    detail::require(
        std::all_of(bias.begin(), bias.end(), [](float b) { return b == 0.0f; }),
        "an llm.c checkpoint has no LM head bias, but \"" + head + ".bias\" is not zero");
  }
  for (const auto& [name, shape] : io::llmc_gpt2_layout(c)) {
    const ParameterInfo* info = detail::find_parameter(infos, name);
    detail::require(
        info != nullptr && info->shape == shape,
        "the model's \"" + name + "\" does not have the llm.c shape " + detail::shape_text(shape));
    ckpt.tensors.push_back({name, shape, trainer.parameter(name)});
  }
  io::save_llmc_gpt2(path, ckpt);
}

}  // namespace gpipe
