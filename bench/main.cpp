// metronome benchmarks: every case runs metronome and plain Asio both ways (an
// io_context run by N threads, and asio::thread_pool(N)) in this one program run. Each
// repetition of each side runs in its own forked child (peak RSS is per side and case);
// the order of the sides rotates with each repetition. Prints min / median / max of
// each metric per side, the better Asio side by median, and metronome / that side.
//
//   metronome_bench                         every case, 5 repetitions
//   metronome_bench post serial-x1          cases whose names start so
//   metronome_bench --reps=9 --threads=2 --json=results.jsonl
//   metronome_bench --quick                 smallest sizes, one repetition (the smoke test)
//   metronome_bench --list                  case names
//   metronome_bench --no-asio timers        metronome's sides only (scripts/tricks.sh)
#include "harness.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <malloc.h>
#include <optional>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace bench {

double heap_in_use_mib() {
  struct mallinfo2 mi = ::mallinfo2();
  return static_cast<double>(mi.uordblks + mi.hblkhd + metronome::detail::node_cache_mapped_bytes() +
                             metronome::detail::large_arrays_mapped_bytes()) /
         (1024.0 * 1024.0);
}

double peak_rss_mib() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

void add_percentiles(metrics& m, std::vector<double>& v, const std::string& unit) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
  };
  m["p50 " + unit] = at(0.50);
  m["p99 " + unit] = at(0.99);
  m["max " + unit] = v.back();
}

void add_lateness(metrics& m, const results& r, const std::vector<std::int64_t>& due_ns) {
  std::vector<double> late(static_cast<std::size_t>(r.size()));
  for (long i = 0; i < r.size(); ++i)
    late[static_cast<std::size_t>(i)] = static_cast<double>(r.slot(i) - due_ns[static_cast<std::size_t>(i)]) / 1e6;
  add_percentiles(m, late, "late ms");
}

void fail(const std::string& what) {
  std::fprintf(stderr, "check failed: %s\n", what.c_str());
  std::fflush(stderr);
  ::_exit(3);
}

std::string count_label(long n) {
  if (n >= 1000000 && n % 1000000 == 0) return std::to_string(n / 1000000) + "M";
  if (n >= 1000 && n % 1000 == 0) return std::to_string(n / 1000) + "k";
  return std::to_string(n);
}

namespace {

// Runs f in a forked child, which sends its metrics back through a pipe; nullopt when
// the child failed (a check, a crash).
std::optional<metrics> isolated(const std::function<metrics()>& f) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    metrics m = f();
    std::string out;
    char buf[64];
    for (auto& [k, v] : m) {
      std::snprintf(buf, sizeof buf, "%.9g", v);
      out += k + "\t" + buf + "\n";
    }
    for (std::size_t done = 0; done < out.size();) {
      ssize_t n = ::write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) ::_exit(4);
      done += static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string in;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) in.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  metrics m;
  for (std::size_t pos = 0; pos < in.size();) {
    auto nl = in.find('\n', pos);
    auto line = in.substr(pos, nl - pos);
    auto tab = line.find('\t');
    m[line.substr(0, tab)] = std::stod(line.substr(tab + 1));
    pos = nl + 1;
  }
  return m;
}

bool higher_is_better(const std::string& metric) {
  return metric.find("/s") != std::string::npos || metric.find("runs") != std::string::npos;
}

struct summary {
  double min = NAN, median = NAN, max = NAN;
  std::vector<double> values;
};

summary summarize(std::vector<double> v) {
  summary s;
  s.values = v;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  return s;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string build_description() {
  std::string d;
#ifdef __OPTIMIZE__
  d += "optimised";
#else
  d += "NOT optimised";
#endif
#ifdef NDEBUG
  d += ", NDEBUG";
#else
  d += ", assertions on";
#endif
#ifdef METRONOME_TEST_HOOKS
  d += ", test hooks ON (not a consumer's build)";
#else
  d += ", test hooks off";
#endif
  return d;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string json_summary(const summary& s) {
  auto num = [](double v) {
    if (std::isnan(v)) return std::string("null");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return std::string(buf);
  };
  std::string out =
      "{\"min\":" + num(s.min) + ",\"median\":" + num(s.median) + ",\"max\":" + num(s.max) + ",\"values\":[";
  for (std::size_t i = 0; i < s.values.size(); ++i) {
    if (i) out += ',';
    out += num(s.values[i]);
  }
  return out + "]}";
}

std::string cell(const summary& s) {
  char buf[96];
  if (std::isnan(s.median))
    std::snprintf(buf, sizeof buf, "%s", "failed");
  else if (s.values.size() == 1)
    std::snprintf(buf, sizeof buf, "%.4g", s.median);
  else
    std::snprintf(buf, sizeof buf, "%.4g (%.4g-%.4g)", s.median, s.min, s.max);
  return buf;
}

// Prints one case: for each metronome side and metric, every side's min / median / max,
// the better Asio side by median, and the ratio metronome / that side.
void report(const bench_case& c, const std::vector<std::vector<metrics>>& runs, std::FILE* json) {
  // The comparison columns: plain Asio's two sides, unless the case names others (the
  // std::execution rows compare with stdexec too): then a header row of its own.
  std::string columns;
  for (const side& s : c.sides)
    if (s.asio) columns += std::string(" | ") + (s.name == asio_io_threads::name || s.name == asio_pool::name ? "Asio: " : "") + s.name;
  if (columns != " | Asio: io_context | Asio: thread_pool")
    std::printf("| case | metronome side | metric | metronome%s | best | ratio |\n", columns.c_str());
  std::vector<std::string> keys;
  for (auto& per_side : runs)
    for (auto& m : per_side)
      for (auto& [k, v] : m)
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  auto collect = [&](std::size_t s, const std::string& key) {
    std::vector<double> v;
    for (auto& m : runs[s])
      if (auto it = m.find(key); it != m.end()) v.push_back(it->second);
    return summarize(v);
  };
  for (std::size_t ours = 0; ours < c.sides.size(); ++ours) {
    if (c.sides[ours].asio) continue;
    for (auto& key : keys) {
      const bool up = higher_is_better(key);
      summary mine = collect(ours, key);
      std::string cells, best_name = "-";
      double best = NAN;
      std::string asio_json;
      for (std::size_t s = 0; s < c.sides.size(); ++s) {
        if (!c.sides[s].asio) continue;
        summary theirs = collect(s, key);
        cells += " | " + (runs[s].empty() ? std::string("not run") : cell(theirs)); // --no-asio
        asio_json += ",\"" + json_escape(c.sides[s].name) + "\":" + json_summary(theirs);
        if (!std::isnan(theirs.median) && (std::isnan(best) || (up ? theirs.median > best : theirs.median < best))) {
          best = theirs.median;
          best_name = c.sides[s].name;
        }
      }
      double ratio = (!std::isnan(best) && best != 0 && !std::isnan(mine.median)) ? mine.median / best : NAN;
      char r[32];
      if (std::isnan(ratio))
        std::snprintf(r, sizeof r, "-");
      else
        std::snprintf(r, sizeof r, "%.2fx", ratio);
      std::printf("| %s | %s | %s %s | %s%s | %s | %s |\n", c.name.c_str(), c.sides[ours].name.c_str(), key.c_str(),
                  up ? "(higher better)" : "(lower better)", cell(mine).c_str(), cells.c_str(), best_name.c_str(), r);
      if (json) {
        std::fprintf(json,
                     "{\"case\":\"%s\",\"side\":\"%s\",\"metric\":\"%s\",\"higher_is_better\":%s,\"metronome\":%s%s,"
                     "\"best_asio\":\"%s\",\"ratio\":%s}\n",
                     json_escape(c.name).c_str(), json_escape(c.sides[ours].name).c_str(), json_escape(key).c_str(),
                     up ? "true" : "false", json_summary(mine).c_str(), asio_json.c_str(),
                     json_escape(best_name).c_str(), std::isnan(ratio) ? "null" : std::to_string(ratio).c_str());
        std::fflush(json);
      }
    }
  }
  std::fflush(stdout);
}

// The machine's price of handing one cache line from one core to the other and back:
// two threads take turns incrementing one atomic counter (each waits to see the other's
// increment). Half a round trip is what a task pays at least for every line its producer
// writes and a worker on the other core reads (the node, the queue's link).
double cache_line_handoff_ns() {
  constexpr long rounds = 200000;
  alignas(64) std::atomic<long> turn{0};
  auto start = clock::now();
  std::thread other([&] {
    for (long i = 1; i < 2 * rounds; i += 2) {
      while (turn.load(std::memory_order_acquire) != i) {
      }
      turn.store(i + 1, std::memory_order_release);
    }
  });
  for (long i = 0; i < 2 * rounds; i += 2) {
    while (turn.load(std::memory_order_acquire) != i) {
    }
    turn.store(i + 1, std::memory_order_release);
  }
  other.join();
  return seconds_since(start) * 1e9 / (2.0 * rounds);
}

int usage(const char* self) {
  std::fprintf(stderr, "usage: %s [--quick] [--reps=N] [--threads=N] [--json=FILE] [--list] [--no-asio] [case-prefix...]\n", self);
  return 2;
}

} // namespace
} // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  options o;
  int reps = -1;
  bool list = false;
  bool no_asio = false; // scripts/tricks.sh compares two metronome builds, not Asio
  std::string json_path;
  std::vector<std::string> wanted;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--quick")
      o.quick = true;
    else if (arg.rfind("--reps=", 0) == 0)
      reps = std::max(1, std::stoi(arg.substr(7)));
    else if (arg.rfind("--threads=", 0) == 0)
      o.threads = std::max(1, std::stoi(arg.substr(10)));
    else if (arg.rfind("--json=", 0) == 0)
      json_path = arg.substr(7);
    else if (arg == "--list")
      list = true;
    else if (arg == "--no-asio")
      no_asio = true;
    else if (arg.rfind("--", 0) == 0)
      return usage(argv[0]);
    else
      wanted.push_back(arg);
  }
  o.reps = reps > 0 ? reps : (o.quick ? 1 : 5);

  std::vector<bench_case> all;
  add_throughput_cases(all, o);
  add_timer_cases(all, o);
  add_coroutine_cases(all, o);
#if defined(METRONOME_BENCH_EXECUTION)
  add_execution_cases(all, o);
#endif
  std::vector<bench_case> cases;
  for (auto& c : all)
    if (wanted.empty() || std::any_of(wanted.begin(), wanted.end(), [&](auto& w) { return c.name.rfind(w, 0) == 0; }))
      cases.push_back(c);
  if (list) {
    for (auto& c : cases) std::printf("%s\n", c.name.c_str());
    return 0;
  }

  std::FILE* json = nullptr;
  if (!json_path.empty() && !(json = std::fopen(json_path.c_str(), "w"))) {
    std::perror(json_path.c_str());
    return 2;
  }
  const auto began = clock::now();
  const std::string load_start = load_average();
  std::printf("metronome benchmark: %d worker threads (every pool; threads running each io_context), %d repetition%s "
              "per side, sides in rotating order, each run in its own process%s\n",
              o.threads, o.reps, o.reps == 1 ? "" : "s", o.quick ? "; QUICK sizes (a smoke test, not figures)" : "");
  std::printf("build: %s; load average at start: %s\n", build_description().c_str(), load_start.c_str());
  { // in a child of its own, as every case: the parent that forks the cases starts no thread
    auto m = isolated([] {
      std::vector<double> v;
      for (int i = 0; i < 5; ++i) v.push_back(cache_line_handoff_ns());
      std::sort(v.begin(), v.end());
      return metrics{{"ns", v[2]}};
    });
    if (m) std::printf("machine: one cache-line hand-off between two threads takes %.0f ns (median of 5)\n", (*m)["ns"]);
  }
  std::printf("cells: median (min-max); best = the better plain-Asio side by median; ratio = metronome / best\n\n");
  std::printf("| case | metronome side | metric | metronome | Asio: io_context | Asio: thread_pool | best | ratio |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  if (json)
    std::fprintf(json, "{\"start\":true,\"threads\":%d,\"reps\":%d,\"quick\":%s,\"build\":\"%s\",\"loadavg\":\"%s\"}\n",
                 o.threads, o.reps, o.quick ? "true" : "false", build_description().c_str(), load_start.c_str());

  int failures = 0;
  for (auto& c : cases) {
    const auto case_began = clock::now();
    std::vector<std::vector<metrics>> runs(c.sides.size());
    for (int r = 0; r < o.reps; ++r)
      for (std::size_t k = 0; k < c.sides.size(); ++k) { // rotated: each side goes first in turn
        std::size_t s = (k + static_cast<std::size_t>(r)) % c.sides.size();
        if (no_asio && c.sides[s].asio) continue;
        if (auto m = isolated(c.sides[s].run))
          runs[s].push_back(std::move(*m));
        else {
          ++failures;
          std::fprintf(stderr, "FAILED: %s, %s (repetition %d)\n", c.name.c_str(), c.sides[s].name.c_str(), r + 1);
        }
      }
    report(c, runs, json);
    std::fprintf(stderr, "%s: %.1f s\n", c.name.c_str(), seconds_since(case_began));
  }

  const std::string load_end = load_average();
  const double took = seconds_since(began);
  std::printf("\nload average at end: %s; took %.1f s; %d failed run%s\n", load_end.c_str(), took, failures,
              failures == 1 ? "" : "s");
  if (json) {
    std::fprintf(json, "{\"end\":true,\"loadavg\":\"%s\",\"seconds\":%.1f,\"failures\":%d}\n", load_end.c_str(), took,
                 failures);
    std::fclose(json);
  }
  return failures == 0 ? 0 : 1;
}
