// The umbrella header: every public header of metronome.
#ifndef METRONOME_METRONOME_HPP
#define METRONOME_METRONOME_HPP

#include <metronome/async_delay.hpp>
#include <metronome/async_timeout.hpp>
#include <metronome/backoff.hpp>
#include <metronome/cancel_after.hpp>
#include <metronome/errors.hpp>
#include <metronome/interval.hpp>
#include <metronome/latency_histogram.hpp>
#include <metronome/manual_clock.hpp>
#include <metronome/net.hpp>
#include <metronome/options.hpp>
#include <metronome/retry.hpp>
#include <metronome/scheduled_future.hpp>
#include <metronome/scheduled_thread_pool.hpp>
#include <metronome/serial_executor.hpp>
#include <metronome/version.hpp>
#include <metronome/wheel_timer.hpp>

#endif
