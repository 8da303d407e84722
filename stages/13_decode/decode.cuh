/// \file stages/13_decode/decode.cuh
/// \brief Stage 13 on the GPU: the device entry point of a decoding call (append, split-KV
/// attention, combine) on bf16 or fp16 tensors already on the device, and a host entry point in
/// float32 that the executable and the GPU test call.
///
/// The split kernel reads each key and value of a sequence once per K/V head and row tile; one
/// (sequence, K/V head) pair packs up to 16 (new row, query head) rows into its tile
/// (kernel.cuh). The serving loop (`--serve`, serve.hpp and serve.cuh) runs this call step after
/// step over pages from a free list. Stage 13 does not handle yet: a TMA path for pages that hold
/// whole tiles, more than 16 rows per K/V byte read.
///
/// Measured result: none yet. The kernels are checked on the CPU by the warp emulator
/// (tests/test_stage13_emulated.cpp) and compiled for the GPU without spills; their first timings
/// belong to the GPU session (bench/session/stage13.py, the stage's record page).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "decode_problem.hpp"
#include "fa/precision.hpp"
#include "fa/timing.hpp"
#include "launch.hpp"

namespace fa::stage13 {

/// "contiguous" or "paged".
std::string to_string(CacheKind kind);

/// Blocks of the split kernel at head dimension `d` that fit on one SM of the current GPU
/// (cudaOccupancyMaxActiveBlocksPerMultiprocessor), for the split rule.
int split_blocks_per_sm(int64_t d);

/// choose_splits() with the current GPU's SM count and split_blocks_per_sm().
SplitChoice choose_splits_here(const DecodeProblem& problem, int forced = 0);

/// The device entry point: the append (with problem.append), the split kernel, and the combine
/// (with more than one split), queued on `stream`. `c` points at device memory in `T`
/// (`__nv_bfloat16` or `__half`); o_partial and lse_partial must hold partial_o_floats() and
/// partial_lse_floats() floats when `splits` > 1. The problem and the geometry must have passed
/// validate() (the entry point checks the sizes it relies on again, with InputError).
template <class T>
void decode_device(const DecodeProblem& problem, const CacheGeometry& geometry, CacheKind kind, int splits,
                   const CallPointers<T>& c, cudaStream_t stream = nullptr);

/// What one call gives back, in float32.
struct DecodeOutput {
    std::vector<float> o;        ///< (B, seq_q, Hq, d)
    std::vector<float> lse;      ///< (B, Hq, seq_q)
    std::vector<float> k_cache;  ///< contiguous (B, capacity, Hk, d) after the call; NaN past each sequence's keys
    std::vector<float> v_cache;  ///< like k_cache
};

/// The host entry point: the inputs (already rounded to `precision`) copied to the device in
/// bf16 or fp16, the cache held as `kind`, one call with `splits` splits, everything copied back.
DecodeOutput run_decode(const DecodeProblem& problem, const CacheGeometry& geometry, CacheKind kind, Precision precision,
                        const DecodeInputs& in, int splits);

/// CUDA-event medians of the call (append, split kernel, combine) on inputs copied once, L2
/// flushed before each run. The append writes the same rows to the same places each run, so a
/// repeated call is the same call.
TimingStats bench_decode(const DecodeProblem& problem, const CacheGeometry& geometry, CacheKind kind, Precision precision,
                         const DecodeInputs& in, int splits, int warmup, int repeat);

/// bench_decode() on inputs drawn on the device (seeded normal values in the 16-bit type, every
/// row of the cache filled), for problems whose float32 host copies would not fit or take too long
/// to make: a timing only, nothing to check against.
TimingStats bench_decode_generated(const DecodeProblem& problem, const CacheGeometry& geometry, CacheKind kind, Precision precision,
                                   int splits, uint64_t seed, int warmup, int repeat);

/// The GPU and its SM clock, one line each, for the report after --bench.
std::string describe_gpu();

}  // namespace fa::stage13
