#pragma once
// examples/train_gpt's reporting: the machine's GEMM peak (measured), the run's log (one CSV row
// per step, cut back to the checkpoint on --resume) and the loss curve as an SVG picture.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpipe/gpipe.hpp"

namespace train_gpt {

/// One thread's fp32 GEMM rate in FLOP/s through the host backend's GEMM (the library it
/// chose), on 512 x 512 x 512 products for about a quarter of a second.
inline double measure_gemm_flops() {
  constexpr std::size_t n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  gpipe::host::gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());  // warm
  const auto start = std::chrono::steady_clock::now();
  std::size_t runs = 0;
  double seconds = 0;
  while (seconds < 0.25) {
    gpipe::host::gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
    ++runs;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return 2.0 * n * n * n * static_cast<double>(runs) / seconds;
}

/// One step of the log.
struct LogRow {
  std::size_t step = 0;
  double loss = 0, lr = 0, norm = 0, ms = 0;
  double validation = NAN;  ///< NaN where the step did not validate
};

/// The rows of a log file with step < `before` (a run resumed at step `before` drops what the
/// killed run logged after its checkpoint; a half-written last line is dropped too).
inline std::vector<LogRow> read_log(const std::filesystem::path& path, std::size_t before) {
  std::vector<LogRow> rows;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    if (in.eof()) break;  // the last line without its newline: cut while it was written
    LogRow row;
    std::string validation;
    std::istringstream fields(line);
    char comma = 0;
    if (!(fields >> row.step >> comma >> row.loss >> comma >> row.lr >> comma >> row.norm >>
          comma >> row.ms >> comma >> validation) ||
        row.step >= before)
      continue;
    if (validation == "nan") {
      row.validation = NAN;
    } else {  // a number, whole, or the line is dropped
      char* end = nullptr;
      row.validation = std::strtod(validation.c_str(), &end);
      if (validation.empty() || *end != '\0' || std::isnan(row.validation)) continue;
    }
    rows.push_back(row);
  }
  return rows;
}

inline std::string log_line(const LogRow& r) {
  char line[160];
  std::snprintf(line, sizeof line, "%zu,%.6f,%.6e,%.6f,%.3f,%s\n", r.step, r.loss, r.lr, r.norm,
                r.ms, std::isnan(r.validation) ? "nan" : std::to_string(r.validation).c_str());
  return line;
}

/// Writes the whole log (header and rows) to `path`.
inline void write_log(const std::filesystem::path& path, const std::vector<LogRow>& rows) {
  std::ofstream out(path, std::ios::trunc);
  out << "step,loss,lr,norm,ms,validation_loss\n";
  for (const LogRow& row : rows) out << log_line(row);
}

/// The loss curve: training loss per step (a line) and validation loss (dots), over steps.
inline void write_loss_curve(const std::filesystem::path& path, const std::vector<LogRow>& rows,
                             const std::string& title) {
  if (rows.empty()) return;
  constexpr double W = 720, H = 420, left = 60, right = 20, top = 40, bottom = 50;
  double lo = INFINITY, hi = -INFINITY;
  for (const LogRow& r : rows)
    for (const double v : {r.loss, r.validation})
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi > lo)) hi = lo + 1;
  const double last = static_cast<double>(std::max<std::size_t>(rows.back().step, 1));
  const auto x = [&](std::size_t step) { return left + (W - left - right) * step / last; };
  const auto y = [&](double v) { return top + (H - top - bottom) * (hi - v) / (hi - lo); };
  std::ofstream out(path, std::ios::trunc);
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' "
         "fill='white'/>\n<text x='"
      << left << "' y='24' font-size='15'>" << title << "</text>\n";
  for (int i = 0; i <= 4; ++i) {  // horizontal grid with loss labels
    const double v = lo + (hi - lo) * i / 4;
    out << "<line x1='" << left << "' x2='" << W - right << "' y1='" << y(v) << "' y2='" << y(v)
        << "' stroke='#ddd'/><text x='" << left - 6 << "' y='" << y(v) + 4 << "' text-anchor='end'>"
        << std::round(v * 100) / 100 << "</text>\n";
  }
  out << "<text x='" << (W + left) / 2 << "' y='" << H - 12
      << "' text-anchor='middle'>step (last: " << rows.back().step << ")</text>\n";
  out << "<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='";
  for (const LogRow& r : rows) out << x(r.step) << ',' << y(r.loss) << ' ';
  out << "'/>\n";
  for (const LogRow& r : rows)
    if (std::isfinite(r.validation))
      out << "<circle cx='" << x(r.step) << "' cy='" << y(r.validation)
          << "' r='3.5' fill='#d62728'/>\n";
  out << "<line x1='" << W - 200 << "' x2='" << W - 180 << "' y1='" << top << "' y2='" << top
      << "' stroke='#1f77b4' stroke-width='2'/><text x='" << W - 175 << "' y='" << top + 4
      << "'>training loss</text>\n<circle cx='" << W - 190 << "' cy='" << top + 18
      << "' r='3.5' fill='#d62728'/><text x='" << W - 175 << "' y='" << top + 22
      << "'>validation loss</text>\n</svg>\n";
}

}  // namespace train_gpt
