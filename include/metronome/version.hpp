// metronome's version, as numbers for the preprocessor (CMake checks that it matches
// the project's VERSION).
#ifndef METRONOME_VERSION_HPP
#define METRONOME_VERSION_HPP

#define METRONOME_VERSION_MAJOR 0
#define METRONOME_VERSION_MINOR 1
#define METRONOME_VERSION_PATCH 0
/// MAJOR * 10000 + MINOR * 100 + PATCH, for comparisons.
#define METRONOME_VERSION (METRONOME_VERSION_MAJOR * 10000 + METRONOME_VERSION_MINOR * 100 + METRONOME_VERSION_PATCH)

#endif
