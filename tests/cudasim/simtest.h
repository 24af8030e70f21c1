/* tidal — what a cudasim test program (tests/cudasim/test_*.cpp) needs besides cudasim.h:
 * cmocka (a C library: its header has no extern "C" of its own) and managed buffers the host
 * reads and writes directly. */
#ifndef TIDAL_SIMTEST_H
#define TIDAL_SIMTEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

/* n elements of cudaMallocManaged memory (filled with 0xFF bytes, as the sim fills it) */
template <class T> static inline T *sim_managed(size_t n)
{
    T *p = nullptr;
    assert_int_equal(cudaMallocManaged(&p, n * sizeof(T)), cudaSuccess);
    return p;
}

#endif
