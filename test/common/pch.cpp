// The precompiled header's own translation unit (test/CMakeLists.txt, METRONOME_TEST_PCH).
