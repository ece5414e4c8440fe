#pragma once
// Names that files give a model's parameters when they are not the model's own nn.Sequential
// names: a renaming (NameMap), the one for nanoGPT's GPT state dict (nanogpt_names) and the one
// for Hugging Face's LlamaForCausalLM (hf_llama_names).

#include <algorithm>
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
  const std::vector<ParameterInfo> infos = Model::parameters();
  std::size_t last = 0;
  for (const ParameterInfo& info : infos)
    last = std::max(last, detail::split_layer_index(info.name).first);
  NameMap names;
  for (const ParameterInfo& info : infos) {
    const auto [layer, rest] = detail::split_layer_index(info.name);
    const auto refuse = [&name = info.name](const char* why) {
      throw Error("gpipe: nanogpt_names: parameter \"" + name + "\" " + why +
                  "; nanoGPT's GPT is an Embedding, TransformerBlocks, a LayerNorm and a Linear "
                  "head");
    };
    std::string file;
    if (layer == 0) {
      if (rest != "wte.weight" && rest != "wpe.weight") refuse("is not an Embedding's");
      file = "transformer." + std::string(rest);
    } else if (layer == last) {
      if (rest != (info.shape.size() == 2 ? "weight" : "bias")) refuse("is not a Linear head's");
      file = "lm_head." + std::string(rest);
    } else if (layer + 1 == last) {
      if (info.shape.size() != 1) refuse("is not the final LayerNorm's");
      file = "transformer.ln_f." + std::string(rest);
    } else {
      if (!rest.starts_with("ln_") && !rest.starts_with("attn.") && !rest.starts_with("mlp."))
        refuse("is not a TransformerBlock's");
      file = "transformer.h." + std::to_string(layer - 1) + "." + std::string(rest);
    }
    names.rename(info.name, std::move(file));
  }
  if (last < 2)
    throw Error("gpipe: nanogpt_names: the model has no LayerNorm and head after its Embedding");
  return names.skip(".attn.bias");
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
  const std::vector<ParameterInfo> infos = Model::parameters();
  std::size_t last = 0;
  for (const ParameterInfo& info : infos)
    last = std::max(last, detail::split_layer_index(info.name).first);
  NameMap names;
  for (const ParameterInfo& info : infos) {
    const auto [layer, rest] = detail::split_layer_index(info.name);
    const auto refuse = [&name = info.name](const char* why) {
      throw Error("gpipe: hf_llama_names: parameter \"" + name + "\" " + why +
                  "; LlamaForCausalLM is a TokenEmbedding, LlamaBlocks, an RMSNorm and a "
                  "Linear<D, V, false> head");
    };
    std::string file;
    if (layer == 0) {
      if (rest != "weight" || info.shape.size() != 2) refuse("is not a TokenEmbedding's");
      file = "model.embed_tokens.weight";
    } else if (layer == last) {
      if (rest != "weight" || info.shape.size() != 2) refuse("is not a bias-free Linear head's");
      file = "lm_head.weight";
    } else if (layer + 1 == last) {
      if (rest != "weight" || info.shape.size() != 1) refuse("is not the final RMSNorm's");
      file = "model.norm.weight";
    } else {
      if (!rest.starts_with("input_layernorm.") && !rest.starts_with("self_attn.") &&
          !rest.starts_with("post_attention_layernorm.") && !rest.starts_with("mlp."))
        refuse("is not a LlamaBlock's");
      file = "model.layers." + std::to_string(layer - 1) + "." + std::string(rest);
    }
    names.rename(info.name, std::move(file));
  }
  if (last < 2)
    throw Error(
        "gpipe: hf_llama_names: the model has no RMSNorm and head after its TokenEmbedding");
  return names.skip("rotary_emb.inv_freq");
}

}  // namespace gpipe
