// Throughput rows: tasks posted to a pool, and to serial executors (strands), by 1, 2
// and 4 producer threads.
#include "harness.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

namespace bench {
namespace {

// `producers` threads post `total` tasks in all (producer p posts tasks p*share ..
// (p+1)*share-1 in order), each task the user_task; returns once all have run.
template <class Post>
double run_producers(results& r, int producers, Post post) {
  check(r.size() % producers == 0, "the tasks must divide evenly among the producers");
  const long share = r.size() / producers;
  auto start = clock::now();
  std::vector<std::thread> ps;
  for (int p = 0; p < producers; ++p)
    ps.emplace_back([&, p] {
      for (long i = p * share; i < (p + 1) * share; ++i) post(i, user_task{&r, i});
    });
  for (auto& t : ps) t.join();
  r.wait_all();
  return seconds_since(start);
}

metrics post_metrics(long total, double s, double base) {
  return {{"Mtasks/s", static_cast<double>(total) / s / 1e6},
          {"peak RSS MiB", peak_rss_mib()},
          {"heap after MiB", heap_in_use_mib() - base}};
}

metrics post_metronome(const options& o, long total, int producers) {
  results r(total);
  double base = heap_in_use_mib();
  double s = 0;
  {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    s = run_producers(r, producers, [&](long, user_task t) { asio::post(pool, t); });
  }
  return post_metrics(total, s, base);
}

template <class Context>
metrics post_asio(const options& o, long total, int producers) {
  results r(total);
  double base = heap_in_use_mib();
  double s = 0;
  {
    Context ctx(o.threads);
    auto ex = ctx.get_executor();
    s = run_producers(r, producers, [&](long, user_task t) { asio::post(ex, t); });
    ctx.join();
  }
  return post_metrics(total, s, base);
}

// The floor: the same callbacks, `threads` threads each running its share directly (no
// executor, no queue, no producer). No executor with that many workers runs them
// faster, so floor / Asio's best bounds the ratio any library could show on this row.
metrics callbacks_alone(long total, int threads) {
  results r(total);
  double base = heap_in_use_mib();
  const double s = run_producers(r, threads, [](long, user_task t) { t(); });
  return post_metrics(total, s, base);
}

// Serial: producer p's j-th task goes to serial executor j % nserial, so the tasks one
// producer gives one executor must run in that order; checked from the timestamps the
// tasks wrote (a task that ran before an earlier one has a smaller timestamp).
void check_order(const results& r, int producers, int nserial) {
  const long share = r.size() / producers;
  for (int p = 0; p < producers; ++p)
    for (long i = p * share + nserial; i < (p + 1) * share; ++i)
      check(r.slot(i - nserial) <= r.slot(i), "serial: a task ran before one submitted earlier to its executor");
}

template <class Serial>
double run_serial(results& r, int producers, std::vector<Serial>& serials) {
  const long share = r.size() / producers;
  const long n = static_cast<long>(serials.size());
  return run_producers(r, producers,
                       [&](long i, user_task t) { asio::post(serials[(i - (i / share) * share) % n], t); });
}

metrics serial_metronome(const options& o, long total, int producers, int nserial) {
  results r(total);
  double base = heap_in_use_mib();
  double s = 0;
  {
    metronome::scheduled_thread_pool pool(static_cast<std::size_t>(o.threads));
    std::vector<metronome::serial_executor<metronome::scheduled_thread_pool::executor_type>> serials;
    for (int i = 0; i < nserial; ++i) serials.push_back(metronome::make_serial_executor(pool));
    s = run_serial(r, producers, serials);
  }
  check_order(r, producers, nserial);
  return post_metrics(total, s, base);
}

template <class Context>
metrics serial_asio(const options& o, long total, int producers, int nserial) {
  results r(total);
  double base = heap_in_use_mib();
  double s = 0;
  {
    Context ctx(o.threads);
    std::vector<asio::strand<decltype(ctx.get_executor())>> strands;
    for (int i = 0; i < nserial; ++i) strands.push_back(asio::make_strand(ctx.get_executor()));
    s = run_serial(r, producers, strands);
    ctx.join();
  }
  check_order(r, producers, nserial);
  return post_metrics(total, s, base);
}

} // namespace

void add_throughput_cases(std::vector<bench_case>& out, const options& o) {
  const long total = o.quick ? 200000 : 2000000;
  const std::vector<int> producer_counts = o.quick ? std::vector<int>{1} : std::vector<int>{1, 2, 4};
  for (int p : producer_counts)
    out.push_back({"post/" + std::to_string(p) + "p",
                   {{"metronome pool", false, [=] { return post_metronome(o, total, p); }},
                    {"floor: the callbacks alone on " + std::to_string(o.threads) + " threads", false,
                     [=] { return callbacks_alone(total, o.threads); }},
                    {asio_io_threads::name, true, [=] { return post_asio<asio_io_threads>(o, total, p); }},
                    {asio_pool::name, true, [=] { return post_asio<asio_pool>(o, total, p); }}}});
  for (int nserial : {1, 64})
    for (int p : producer_counts)
      out.push_back({"serial-x" + std::to_string(nserial) + "/" + std::to_string(p) + "p",
                     {{"metronome serial", false, [=] { return serial_metronome(o, total, p, nserial); }},
                      // one executor's tasks run one at a time: its floor is one thread
                      {"floor: the callbacks alone on " + std::to_string(nserial == 1 ? 1 : o.threads) + " thread(s)",
                       false, [=] { return callbacks_alone(total, nserial == 1 ? 1 : o.threads); }},
                      {std::string("strand on ") + asio_io_threads::name, true,
                       [=] { return serial_asio<asio_io_threads>(o, total, p, nserial); }},
                      {std::string("strand on ") + asio_pool::name, true,
                       [=] { return serial_asio<asio_pool>(o, total, p, nserial); }}}});
}

} // namespace bench
