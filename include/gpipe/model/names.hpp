#pragma once
// Names that files give a model's parameters when they are not the model's own nn.Sequential
// names: a renaming (NameMap), the one for nanoGPT's GPT state dict (nanogpt_names) and the one
// for Hugging Face's LlamaForCausalLM (hf_llama_names).

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/model/pipeline.hpp"

namespace gpipe {

/// A renaming between a model's parameter names (`ParameterInfo::name`) and a file's, for
/// `Trainer::load(path, names)` and `Trainer::save(path, names)`: each parameter is read from and
/// written to `file_name(name)`; a name without an entry keeps its own. Two parameters renamed to
/// one file name, or a rename of a name the model lacks, is a `gpipe::Error` when loading or
/// saving. `skip(suffix)`: file tensors that are not parameters (buffers, such as nanoGPT's causal
/// masks "transformer.h.0.attn.bias") and whose names end with `suffix`; `load` ignores them,
/// while any other tensor the model lacks is still an Error.
class NameMap {
 public:
  /// The parameter `model_name` is `file_name` in files.
  NameMap& rename(std::string model_name, std::string file_name) {
    to_file_.insert_or_assign(std::move(model_name), std::move(file_name));
    return *this;
  }
  /// File tensors whose names end with `suffix` are not parameters: `load` ignores them.
  NameMap& skip(std::string suffix) {
    skipped_.push_back(std::move(suffix));
    return *this;
  }

  /// The name the file uses for the model's parameter `model_name`.
  std::string file_name(std::string_view model_name) const {
    const auto it = to_file_.find(model_name);
    return it == to_file_.end() ? std::string(model_name) : it->second;
  }
  /// Whether `load` ignores the file's tensor `file_name` (one the model has no parameter for).
  bool skipped(std::string_view file_name) const {
    return std::any_of(skipped_.begin(), skipped_.end(),
                       [&](const std::string& suffix) { return file_name.ends_with(suffix); });
  }
  /// Every rename, model name -> file name.
  const std::map<std::string, std::string, std::less<>>& renames() const { return to_file_; }

 private:
  std::map<std::string, std::string, std::less<>> to_file_;
  std::vector<std::string> skipped_;
};

namespace detail {

// "12.attn.c_proj.weight" -> (12, "attn.c_proj.weight")
inline std::pair<std::size_t, std::string_view> split_layer_index(std::string_view name) {
  const std::size_t dot = name.find('.');
  std::size_t index = 0;
  for (char c : name.substr(0, dot)) index = index * 10 + static_cast<std::size_t>(c - '0');
  return {index, name.substr(dot + 1)};
}

// Where a parameter of a decoder-only model sits: layer 0 the embedding, 1..n the blocks, n + 1
// the final norm, n + 2 the head.
enum class DecoderPart { embedding, block, norm, head };

// The walk that nanogpt_names and hf_llama_names share: every parameter of Model renamed to
// `file_name(part, block, rest, rank)` (block: the block's index from 0; rest: the name after
// the layer index; rank: the tensor's dimensions), or, where that is empty (the parameter does not
// fit its part), a gpipe::Error naming `function`, the parameter, what its part should be
// (`parts`, in DecoderPart's order) and what the model should be (`shape`).
template <class Model, class FileName>
NameMap decoder_names(std::string_view function, const std::array<std::string_view, 4>& parts,
                      std::string_view shape, FileName file_name) {
  const std::vector<ParameterInfo> infos = Model::parameters();
  std::size_t last = 0;
  for (const ParameterInfo& info : infos) last = std::max(last, split_layer_index(info.name).first);
  const std::string context = "gpipe: " + std::string(function) + ": ";
  if (last < 2)
    throw Error(context + "the model has no final norm and head after its embedding; " +
                std::string(shape));
  NameMap names;
  for (const ParameterInfo& info : infos) {
    const auto [layer, rest] = split_layer_index(info.name);
    const DecoderPart part = layer == 0          ? DecoderPart::embedding
                             : layer == last     ? DecoderPart::head
                             : layer + 1 == last ? DecoderPart::norm
                                                 : DecoderPart::block;
    std::string file = file_name(part, layer == 0 ? 0 : layer - 1, rest, info.shape.size());
    if (file.empty())
      throw Error(context + "parameter \"" + info.name + "\" is not " +
                  std::string(parts[static_cast<std::size_t>(part)]) + "'s; " + std::string(shape));
    names.rename(info.name, std::move(file));
  }
  return names;
}

}  // namespace detail

/// The names of nanoGPT's `GPT` state dict (and so of GPT-2's weights as nanoGPT loads them) for
/// a `Model` of nanoGPT's shape: an `Embedding` first, then `TransformerBlock`s, a final
/// `LayerNorm` and a `Linear` head, over any split into stages:
///   0.wte.weight, 0.wpe.weight     -> transformer.wte.weight, transformer.wpe.weight
///   i.X (block i = 1..n)           -> transformer.h.(i-1).X (ln_1, attn.c_attn, attn.c_proj,
///                                     ln_2, mlp.c_fc, mlp.c_proj: the names are nanoGPT's)
///   n+1.weight, n+1.bias           -> transformer.ln_f.weight, transformer.ln_f.bias
///   n+2.weight (n+2.bias)          -> lm_head.weight (lm_head.bias; nanoGPT's head has none)
/// and skips the blocks' causal-mask buffers (`.attn.bias`, which nanoGPT keeps where it has no
/// flash attention). GPT-2's tie is `{.parameter = "(n+2).weight", .to = "0.wte.weight"}`: a file
/// may hold both names (a state dict does) or one of them. A model of another shape is a
/// `gpipe::Error` that names the first parameter that does not fit.
template <class Model>
NameMap nanogpt_names() {
  using detail::DecoderPart;
  const auto file = [](DecoderPart part, std::size_t block, std::string_view rest,
                       std::size_t rank) -> std::string {
    const std::string r(rest);
    switch (part) {
      case DecoderPart::embedding:
        return rest == "wte.weight" || rest == "wpe.weight" ? "transformer." + r : "";
      case DecoderPart::block:
        return rest.starts_with("ln_") || rest.starts_with("attn.") || rest.starts_with("mlp.")
                   ? "transformer.h." + std::to_string(block) + "." + r
                   : "";
      case DecoderPart::norm:
        return rank == 1 ? "transformer.ln_f." + r : "";
      case DecoderPart::head:
        return rest == (rank == 2 ? "weight" : "bias") ? "lm_head." + r : "";
    }
    return "";
  };
  return detail::decoder_names<Model>(
             "nanogpt_names",
             {"an Embedding", "a TransformerBlock", "the final LayerNorm", "a Linear head"},
             "nanoGPT's GPT is an Embedding, TransformerBlocks, a LayerNorm and a Linear head",
             file)
      .skip(".attn.bias");
}

/// The names of Hugging Face's `LlamaForCausalLM` state dict for a `Model` of its shape: a
/// `TokenEmbedding` first, then `LlamaBlock`s, a final `RMSNorm` and a `Linear<D, V, false>` head,
/// over any split into stages:
///   0.weight                       -> model.embed_tokens.weight
///   i.X (block i = 1..n)           -> model.layers.(i-1).X (input_layernorm, self_attn.q_proj,
///                                     k_proj, v_proj, o_proj, post_attention_layernorm,
///                                     mlp.gate_proj, up_proj, down_proj: the names are HF's)
///   n+1.weight                     -> model.norm.weight
///   n+2.weight                     -> lm_head.weight
/// and skips the rotary embeddings' buffers (`rotary_emb.inv_freq`, which older checkpoints keep
/// per layer). A model of another shape is a `gpipe::Error` that names the first parameter that
/// does not fit.
template <class Model>
NameMap hf_llama_names() {
  using detail::DecoderPart;
  const auto file = [](DecoderPart part, std::size_t block, std::string_view rest,
                       std::size_t rank) -> std::string {
    const bool matrix = rest == "weight" && rank == 2, vector = rest == "weight" && rank == 1;
    switch (part) {
      case DecoderPart::embedding:
        return matrix ? "model.embed_tokens.weight" : "";
      case DecoderPart::block:
        return rest.starts_with("input_layernorm.") || rest.starts_with("self_attn.") ||
                       rest.starts_with("post_attention_layernorm.") || rest.starts_with("mlp.")
                   ? "model.layers." + std::to_string(block) + "." + std::string(rest)
                   : "";
      case DecoderPart::norm:
        return vector ? "model.norm.weight" : "";
      case DecoderPart::head:
        return matrix ? "lm_head.weight" : "";
    }
    return "";
  };
  return detail::decoder_names<Model>(
             "hf_llama_names",
             {"a TokenEmbedding", "a LlamaBlock", "the final RMSNorm", "a bias-free Linear head"},
             "LlamaForCausalLM is a TokenEmbedding, LlamaBlocks, an "
             "RMSNorm and a Linear<D, V, false> head",
             file)
      .skip("rotary_emb.inv_freq");
}

}  // namespace gpipe
