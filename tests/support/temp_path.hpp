#pragma once
// TempPath: a unique path under the system temp directory for a test's files, removed (with
// whatever is there) when the TempPath goes.

#include <atomic>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <system_error>

namespace gpipe::test {

class TempPath {
 public:
  // <temp>/<stem>_<random>_<counter><extension>
  explicit TempPath(std::string_view stem = "gpipe_test",
                    std::string_view extension = ".safetensors") {
    static std::atomic<unsigned> counter{0};
    std::random_device entropy;
    path_ = std::filesystem::temp_directory_path() /
            (std::string(stem) + "_" + std::to_string(entropy()) + "_" + std::to_string(counter++) +
             std::string(extension));
  }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  ~TempPath() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace gpipe::test
