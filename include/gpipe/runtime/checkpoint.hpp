#pragma once
// Trainer::save_checkpoint and load_checkpoint: a checkpoint is a directory in the sharded
// safetensors layout, one shard per pipeline device (model-0000d-of-0000K.safetensors, each
// written by the process that runs the device, replica 0 only) and model.safetensors.index.json,
// whose weight_map names each tensor's shard and whose metadata holds "gpipe" (step count,
// optimizer kind, state names and hyperparameters, as strings) and "user" (the caller's map).
// Parameters are saved under the names `save` uses (a tied pair once), the optimizer's state
// under PyTorch's (`<name>.exp_avg`, `<name>.exp_avg_sq`, `<name>.momentum_buffer`).
//
// Crash safety: the name given is a symbolic link to the newest complete version, a sibling
// directory `<name>.a` or `<name>.b` (the one the link does not point to is written next). The
// link is replaced by rename(2), atomic, after every shard and the index are on disk (fsync of
// the files and the directories); so a process killed at any moment leaves `<name>` pointing at
// the previous checkpoint or the new one, never a partial one.
//
// Loading reads the index, then from the shards the tensors this process's stages hold, checks
// every name and shape, and only then writes parameters and optimizer state: any failure is a
// gpipe::Error naming the file and tensor, with the trainer as it was. The layout does not depend
// on K, M, the schedule, the ranks or the replicas: a checkpoint loads into any of them.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/io/json.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/runtime/optimizer_state.hpp"
#include "gpipe/runtime/parameter_store.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe::detail {

inline constexpr const char* checkpoint_index = "model.safetensors.index.json";
// metadata.gpipe.format of the checkpoints this version writes, and the only one it reads.
inline constexpr const char* checkpoint_format = "gpipe checkpoint 1";

// Flushes a file or a directory to disk (fsync); gpipe::Error when that fails.
inline void sync_to_disk(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  require(fd >= 0, "cannot open " + path.string() + " to flush it" + errno_suffix(errno));
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  require(result == 0, "cannot flush " + path.string() + " to disk" + errno_suffix(error));
}

// The shard of pipeline device d of K.
inline std::string checkpoint_shard(std::size_t d, std::size_t devices) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", d + 1, devices);
  return name;
}

// The version of checkpoint `dir` to write next: `<dir>.a` unless the link points there.
inline std::filesystem::path next_checkpoint_version(const std::filesystem::path& dir) {
  std::error_code error;
  const std::filesystem::path current = std::filesystem::read_symlink(dir, error);
  const std::string stem = dir.filename().string();
  const bool a_is_current = !error && current.filename() == stem + ".a";
  return dir.parent_path() / (stem + (a_is_current ? ".b" : ".a"));
}

// Points the link `dir` at `version` (a sibling) atomically, and flushes the parent directory.
inline void publish_checkpoint(const std::filesystem::path& dir,
                               const std::filesystem::path& version) {
  const std::filesystem::path parent = dir.parent_path().empty() ? "." : dir.parent_path();
  const std::filesystem::path link = parent / (dir.filename().string() + ".link");
  std::error_code ignored;
  std::filesystem::remove(link, ignored);
  std::filesystem::create_symlink(version.filename(), link);
  if (std::rename(link.c_str(), dir.c_str()) != 0) {
    const int error = errno;
    std::filesystem::remove(link, ignored);
    throw Error("gpipe: cannot make " + dir.string() + " point at " + version.string() +
                errno_suffix(error) +
                (std::filesystem::is_directory(std::filesystem::symlink_status(dir))
                     ? " (it is a directory: a checkpoint is a link to its newest version)"
                     : ""));
  }
  sync_to_disk(parent);
}

// "key": "value" pairs as a JSON object.
inline std::string json_object(const std::vector<std::pair<std::string, std::string>>& members,
                               const char* indent) {
  std::string out = "{";
  for (std::size_t i = 0; i < members.size(); ++i)
    out += (i ? ",\n" : "\n") + std::string(indent) + "  " + json_quote(members[i].first) + ": " +
           json_quote(members[i].second);
  return out + (members.empty() ? "}" : "\n" + std::string(indent) + "}");
}

// The strings of a JSON object of strings (gpipe::Error naming the file otherwise).
inline std::map<std::string, std::string> json_strings(const JsonValue* value,
                                                       const std::filesystem::path& file,
                                                       const std::string& what) {
  std::map<std::string, std::string> out;
  if (value == nullptr) return out;
  require(value->is<JsonObject>(), file.string() + ": " + what + " is not an object");
  for (const JsonMember& member : value->as<JsonObject>()) {
    require(member.value.is<std::string>(),
            file.string() + ": " + what + "." + member.key + " is not a string");
    out[member.key] = member.value.as<std::string>();
  }
  return out;
}

template <class Backend>
class Checkpoint {
 public:
  Checkpoint(Backend& backend, ParameterStore<Backend>& store, OptimizerState<Backend>& optimizer)
      : backend_(backend), transport_(backend), store_(store), optimizer_(optimizer) {}

  // Trainer::save_checkpoint's contract. Each phase ends with every process agreeing that none
  // failed (or all throw), so that a failure on one process never leaves the others waiting.
  void save(const std::filesystem::path& dir, const std::map<std::string, std::string>& user) {
    const std::filesystem::path version = next_checkpoint_version(dir);
    together("prepare " + version.string(), [&] {
      if (!transport_.writes_files()) return;
      std::filesystem::remove_all(version);
      std::filesystem::create_directories(version);
    });
    if (optimizer_.sharded())  // ZeRO-1: replica 0 writes the whole state
      together("gather the optimizer state", [&] { gather_state(); });
    together("write its shard", [&] {
      if (transport_.replica() == 0) write_shards(version);
    });
    whole_state_.clear();
    together("publish " + dir.string(), [&] {
      if (!transport_.writes_files()) return;
      write_index(version / checkpoint_index, user);
      sync_to_disk(version);
      publish_checkpoint(dir, version);
    });
  }

  // Trainer::load_checkpoint's contract: every process reads and checks what it needs, and only
  // when all succeeded does any change its trainer.
  std::map<std::string, std::string> load(const std::filesystem::path& dir) {
    std::map<std::string, std::vector<float>> values;
    OptimizerRecord record;
    std::map<std::string, std::string> user;
    together("read " + dir.string(), [&] { user = read(dir, values, record); });
    apply(values, std::move(record));
    return user;
  }

 private:
  // Runs `work` on every process, then agrees: if it threw anywhere, every process throws (its
  // own error, or one saying another process could not `what`).
  template <class Work>
  void together(const std::string& what, Work work) {
    transport::together(transport_, what, work);
  }

  // Reads the index and this process's tensors of checkpoint `dir` into `values` and `record`,
  // checking every name and shape; returns the user's map.
  std::map<std::string, std::string> read(const std::filesystem::path& dir,
                                          std::map<std::string, std::vector<float>>& values,
                                          OptimizerRecord& record) const {
    const std::filesystem::path index_path = dir / checkpoint_index;
    std::ifstream in(index_path, std::ios::binary);
    require(static_cast<bool>(in), "cannot read the checkpoint index " + index_path.string());
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const JsonValue index = parse_json(text, index_path.string());
    const JsonValue* weight_map = index.find("weight_map");
    const JsonValue* metadata = index.find("metadata");
    require(metadata != nullptr, index_path.string() + " has no metadata");
    const auto shards = json_strings(weight_map, index_path, "weight_map");
    // A checkpoint is its directory: a shard is a file name in it, never a path that leads out.
    for (const auto& [tensor, shard] : shards) {
      const std::filesystem::path name(shard);
      require(!shard.empty() && name == name.filename() && shard != "." && shard != "..",
              index_path.string() + ": weight_map." + tensor + " is " + json_quote(shard) +
                  ", not the name of a file in the checkpoint's directory");
    }
    const auto gpipe = json_strings(metadata->find("gpipe"), index_path, "metadata.gpipe");
    record = record_in(gpipe, index_path);

    // Every tensor this process needs, read and checked before anything changes.
    std::map<std::string, std::map<std::string, io::Tensor, std::less<>>> files;
    for (const std::string& name : needed(record)) {
      const auto shard = shards.find(name);
      require(shard != shards.end(),
              index_path.string() + " names no shard for tensor \"" + name + "\"");
      auto file = files.find(shard->second);
      if (file == files.end())
        file = files.emplace(shard->second, io::load_safetensors(dir / shard->second)).first;
      const auto tensor = file->second.find(name);
      require(tensor != file->second.end(),
              (dir / shard->second).string() + " has no tensor \"" + name + "\"");
      const std::vector<std::size_t>& shape = shape_of(name, record);
      require(tensor->second.shape == shape,
              (dir / shard->second).string() + ": tensor \"" + name + "\" has shape " +
                  shape_string(tensor->second.shape) + ", the model's is " + shape_string(shape));
      values[name] = tensor->second.data;
    }
    return json_strings(metadata->find("user"), index_path, "metadata.user");
  }

  // The tensors of this process's stages that a checkpoint holds: each parameter under its saved
  // name, and with an optimizer its state planes under `<name>.<state>`.
  std::vector<std::string> needed(const OptimizerRecord& record) const {
    std::set<std::string> out;
    for (const ParameterInfo& info : store_.infos()) {
      if (!store_.local(info.stage)) continue;
      const std::string& name = store_.saved_as(info).name;
      out.insert(name);
      for (const std::string& state : record.state_names) out.insert(name + "." + state);
    }
    return {out.begin(), out.end()};
  }
  const std::vector<std::size_t>& shape_of(const std::string& name,
                                           const OptimizerRecord& record) const {
    for (const ParameterInfo& info : store_.infos()) {
      if (name == info.name) return info.shape;
      for (const std::string& state : record.state_names)
        if (name == info.name + "." + state) return info.shape;
    }
    throw Error("gpipe: the model has no tensor \"" + name + "\"");
  }

  // The optimizer of the index's metadata ("" kind: none).
  static OptimizerRecord record_in(const std::map<std::string, std::string>& gpipe,
                                   const std::filesystem::path& index) {
    OptimizerRecord record;
    const auto get = [&](const std::string& key) {
      const auto found = gpipe.find(key);
      require(found != gpipe.end(), index.string() + " has no metadata.gpipe." + key);
      return found->second;
    };
    const std::string format = get("format");
    require(format == checkpoint_format, index.string() + ": metadata.gpipe.format is " +
                                             json_quote(format) + "; this gpipe reads " +
                                             json_quote(checkpoint_format) + " only");
    record.kind = get("optimizer");
    const std::string step = get("step");
    const auto parsed = std::from_chars(step.data(), step.data() + step.size(), record.steps);
    require(parsed.ec == std::errc{} && parsed.ptr == step.data() + step.size(),
            index.string() + ": metadata.gpipe.step \"" + step + "\" is not a step count");
    for (std::string names = get("state_names"); !names.empty();) {
      const std::size_t comma = names.find(',');
      record.state_names.push_back(names.substr(0, comma));
      names = comma == std::string::npos ? "" : names.substr(comma + 1);
    }
    for (const auto& [key, value] : gpipe)
      if (key.starts_with("optimizer.")) record.hyperparameters.emplace_back(key.substr(10), value);
    return record;
  }

  void write_shards(const std::filesystem::path& version) {
    const OptimizerRecord& record = optimizer_.record();
    std::size_t devices = 0;
    for (std::size_t s = 0; s < store_.num_stages(); ++s)
      devices = std::max(devices, store_.device_of_stage(s) + 1);
    for (std::size_t d = 0; d < devices; ++d) {
      std::vector<std::vector<float>> data;
      std::vector<io::TensorView> views;
      data.reserve(store_.infos().size() * (1 + record.state_names.size()));
      for (const ParameterInfo& info : store_.infos()) {
        if (store_.device_of_stage(info.stage) != d || !store_.local(info.stage) ||
            &store_.saved_as(info) != &info)
          continue;
        data.push_back(store_.local_values(info));
        views.push_back({info.name, info.shape, data.back()});
        for (std::size_t p = 0; p < record.state_names.size(); ++p) {
          data.push_back(state_values(info, p));
          views.push_back({info.name + "." + record.state_names[p], info.shape, data.back()});
        }
      }
      if (!store_.local(first_stage_on(d))) continue;
      const std::filesystem::path shard = version / checkpoint_shard(d, devices);
      io::save_safetensors(shard, views);
      sync_to_disk(shard);
    }
  }
  std::size_t first_stage_on(std::size_t d) const {
    for (std::size_t s = 0; s < store_.num_stages(); ++s)
      if (store_.device_of_stage(s) == d) return s;
    return 0;
  }
  // With a sharded optimizer: each local stage's whole state (every plane, in the unsharded
  // layout) on replica 0, from every replica's share. Collective over the replicas.
  void gather_state() {
    const std::size_t planes = optimizer_.record().state_names.size();
    whole_state_.assign(store_.num_stages(), {});
    for (std::size_t s = 0; s < store_.num_stages(); ++s) {
      if (!store_.local(s) || planes == 0) continue;
      const std::size_t n = store_.params()[s].size();
      const auto [first, last] = optimizer_.share(s);
      const float* state = optimizer_.state(s).data();
      for (std::size_t p = 0; p < planes; ++p) {
        std::vector<float> plane =
            transport_.collect_optimizer_shares({state + p * (last - first), last - first}, n);
        whole_state_[s].insert(whole_state_[s].end(), plane.begin(), plane.end());
      }
    }
  }
  // State plane p of a local tensor.
  std::vector<float> state_values(const ParameterInfo& info, std::size_t p) {
    std::vector<float> out(info.size);
    const std::size_t n = store_.params()[info.stage].size();
    if (optimizer_.sharded()) {
      const std::vector<float>& whole = whole_state_.at(info.stage);
      const auto from = whole.begin() + static_cast<std::ptrdiff_t>(p * n + info.offset);
      std::copy(from, from + static_cast<std::ptrdiff_t>(info.size), out.begin());
      return out;
    }
    const float* src = optimizer_.state(info.stage).data() + p * n + info.offset;
    backend_.submit(
        store_.device_of_stage(info.stage), {"read optimizer state", info.stage},
        [&out, src](typename Backend::Kernels& k) { k.download(out.size(), src, out.data()); });
    backend_.synchronize();
    return out;
  }

  void write_index(const std::filesystem::path& path,
                   const std::map<std::string, std::string>& user) {
    const OptimizerRecord& record = optimizer_.record();
    std::size_t devices = 0, bytes = 0;
    for (std::size_t s = 0; s < store_.num_stages(); ++s)
      devices = std::max(devices, store_.device_of_stage(s) + 1);
    std::vector<std::pair<std::string, std::string>> weight_map;
    for (const ParameterInfo& info : store_.infos()) {
      if (&store_.saved_as(info) != &info) continue;
      const std::string shard = checkpoint_shard(store_.device_of_stage(info.stage), devices);
      weight_map.emplace_back(info.name, shard);
      for (const std::string& state : record.state_names)
        weight_map.emplace_back(info.name + "." + state, shard);
      bytes += 4 * info.size * (1 + record.state_names.size());
    }
    std::string names;
    for (const std::string& state : record.state_names) names += (names.empty() ? "" : ",") + state;
    std::vector<std::pair<std::string, std::string>> gpipe{{"format", checkpoint_format},
                                                           {"step", std::to_string(record.steps)},
                                                           {"optimizer", record.kind},
                                                           {"state_names", names}};
    for (const auto& [key, value] : record.hyperparameters)
      gpipe.emplace_back("optimizer." + key, value);
    const std::vector<std::pair<std::string, std::string>> user_members(user.begin(), user.end());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "{\n  \"metadata\": {\n    \"total_size\": " << bytes
        << ",\n    \"gpipe\": " << json_object(gpipe, "    ")
        << ",\n    \"user\": " << json_object(user_members, "    ")
        << "\n  },\n  \"weight_map\": " << json_object(weight_map, "  ") << "\n}\n";
    out.close();
    require(static_cast<bool>(out), "cannot write " + path.string());
    sync_to_disk(path);
  }

  // Writes the checked values: every local parameter (a tied one from its saved name) and, with
  // an optimizer, its restored state.
  void apply(const std::map<std::string, std::vector<float>>& values, OptimizerRecord record) {
    for (const ParameterInfo& info : store_.infos())
      if (store_.local(info.stage)) store_.set_local(info, values.at(store_.saved_as(info).name));
    if (record.kind.empty()) return optimizer_.clear();
    const std::vector<std::string> names = record.state_names;
    optimizer_.restore(std::move(record), store_, backend_);
    for (const ParameterInfo& info : store_.infos()) {
      if (!store_.local(info.stage)) continue;
      // this process's share of the stage (all of it unless the optimizer is sharded), and the
      // part of the tensor in it
      const auto [share_first, share_last] = optimizer_.share(info.stage);
      const std::size_t first = std::max(info.offset, share_first);
      const std::size_t last = std::min(info.offset + info.size, share_last);
      if (first >= last) continue;
      const std::size_t n = share_last - share_first;
      for (std::size_t p = 0; p < names.size(); ++p) {
        const std::vector<float>& plane = values.at(store_.saved_as(info).name + "." + names[p]);
        const float* src = plane.data() + (first - info.offset);
        float* dst = optimizer_.state(info.stage).data() + p * n + (first - share_first);
        backend_.submit(store_.device_of_stage(info.stage), {"write optimizer state", info.stage},
                        [src, dst, count = last - first](typename Backend::Kernels& k) {
                          k.upload(count, src, dst);
                        });
      }
    }
    backend_.synchronize();
  }

  Backend& backend_;
  transport::Transport<Backend> transport_;
  ParameterStore<Backend>& store_;
  OptimizerState<Backend>& optimizer_;
  std::vector<std::vector<float>> whole_state_;  // per stage, while saving a sharded state
};

}  // namespace gpipe::detail
