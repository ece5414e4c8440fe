// example_train_gpt's packed documents (train_gpt/data.hpp), against the text they come from:
// each token's document and the targets ignored across borders; and its log (train_gpt/report.hpp)
// read back after a kill.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "train_gpt/data.hpp"
#include "train_gpt/report.hpp"

namespace {

std::vector<std::int32_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

}  // namespace

TEST_CASE("a separator ends its document and the next token starts the next one") {
  const std::vector<std::int32_t> separator = train_gpt::separator_bytes("%\\n");
  CHECK(separator == bytes("%\n"));
  CHECK(train_gpt::separator_bytes("a\\tb\\\\") == bytes("a\tb\\"));
  CHECK(train_gpt::document_index(bytes("ab%\ncd%\n%\ne"), separator) ==
        std::vector<std::int32_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3});
  CHECK(train_gpt::document_index(bytes("a%b"), separator) == std::vector<std::int32_t>{0, 0, 0});
}

TEST_CASE("a packed batch carries each token's document and ignores the targets across borders") {
  // documents of their number and 1 to 9 letters, each ended by "|" (so that a sample's window
  // occurs once in the text)
  std::string text;
  for (int d = 0; d < 400; ++d)
    text += std::to_string(d) + std::string(1 + d * 7 % 9, static_cast<char>('a' + d % 26)) + "|";
  train_gpt::Corpus corpus;
  corpus.train = bytes(text);
  train_gpt::mark_documents(corpus, bytes("|"));
  constexpr std::size_t samples = 6, T = 32;
  train_gpt::Batch batch;
  train_gpt::training_batch(corpus, 7, 3, 0, samples, T, batch);
  REQUIRE(batch.x.size() == samples * T);
  REQUIRE(batch.documents.size() == samples * T);
  std::size_t borders = 0;
  for (std::size_t b = 0; b < samples; ++b) {
    // where the sample starts in the text, and its documents counted from the text itself
    const std::string window(batch.x.begin() + static_cast<std::ptrdiff_t>(b * T),
                             batch.x.begin() + static_cast<std::ptrdiff_t>((b + 1) * T));
    const std::size_t start = text.find(window);
    REQUIRE(start != std::string::npos);
    REQUIRE(text.find(window, start + 1) == std::string::npos);
    const auto document_of = [&](std::size_t i) {
      return static_cast<std::int32_t>(std::count(text.begin(), text.begin() + i, '|'));
    };
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t r = b * T + t;
      CHECK(batch.documents[r] == document_of(start + t));
      if (text[start + t] == '|') {  // a document's last token: its next token is not predicted
        ++borders;
        CHECK(batch.y[r] == gpipe::ignore_index);
      } else {
        CHECK(batch.y[r] == static_cast<unsigned char>(text[start + t + 1]));
      }
    }
  }
  CHECK(borders > samples);  // the check saw borders
  // the same (seed, step, index) draws the same batch
  train_gpt::Batch again;
  train_gpt::training_batch(corpus, 7, 3, 0, samples, T, again);
  CHECK(again.x == batch.x);
  CHECK(again.y == batch.y);
  CHECK(again.documents == batch.documents);
}

TEST_CASE("without a separator a batch has no documents and no ignored targets") {
  train_gpt::Corpus corpus;
  corpus.train = bytes(std::string(200, 'x') + "|" + std::string(200, 'y'));
  train_gpt::Batch batch;
  train_gpt::training_batch(corpus, 1, 0, 0, 4, 16, batch);
  CHECK(batch.documents.empty());
  CHECK(std::count(batch.y.begin(), batch.y.end(), gpipe::ignore_index) == 0);
}

TEST_CASE("a log read back keeps its whole lines before the step and drops a cut last line") {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "gpipe_train_gpt_test_log.csv";
  const std::string head =
      "step,loss,lr,norm,ms,validation_loss\n"
      "0,5.5,1e-3,0.9,10.0,nan\n"
      "1,5.0,1e-3,0.8,10.0,5.25\n"
      "2,4.5,1e-3,0.7,10.0,nan\n";
  // a process killed while writing its next line: cut inside "nan", inside a number, before the
  // last field; or not cut
  for (const std::string last : {"3,4.0,1e-3,0.6,10.0,n", "3,4.0,1e-3,0.6,10.0,4.7",
                                 "3,4.0,1e-3,0.6,10.0,", "3,4.0,1e-3,0.6,10.0,4.75\n"}) {
    CAPTURE(last);
    std::ofstream(path, std::ios::trunc) << head << last;
    const std::vector<train_gpt::LogRow> rows = train_gpt::read_log(path, 10);
    const bool whole = last.back() == '\n';
    REQUIRE(rows.size() == (whole ? 4u : 3u));
    CHECK(rows[1].step == 1);
    CHECK(rows[1].validation == 5.25);
    CHECK(std::isnan(rows[2].validation));
    if (whole) CHECK(rows[3].validation == 4.75);
    CHECK(train_gpt::read_log(path, 2).size() == 2);  // resumed at step 2
  }
  std::filesystem::remove(path);
}
