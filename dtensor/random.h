#pragma once
// NOTE [DTensor random]
// A random op on a distributed tensor gives exactly the values the same seed gives on one device
// for the global tensor, whatever the mesh and placements (PyTorch users report mismatches:
// issues 168058, 146190). ATen's CPU generator is a sequential stream (mt19937), so the values
// of an element depend on every element before it: there is no offset to jump to. Every rank
// therefore draws the whole global tensor from its generator, in the same order one device
// would, and keeps its own box. Each rank's generator advances exactly as one device's does, so
// later random ops stay in step too. The price is the global tensor's size in time and transient
// memory per rank, paid only by random ops (dropout masks, initialisation); a counter-based
// generator (Philox on CUDA) could draw just the box, and is the way to remove it.
// Ranks that are threads of one process (the threads backend) cannot share the process's
// default generator, so the generator is per thread: manual_seed() below seeds the calling
// rank's; without one, the process default generator is used (one process per rank, seeded
// with torch::manual_seed as usual).

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>

namespace dtensor {

// Seeds the calling thread's (rank's) generator used by random ops on distributed tensors.
void manual_seed(uint64_t seed);
// That generator: the thread's after manual_seed, else the process default CPU generator.
at::Generator rank_generator();
// Runs `draw` (plain-tensor ATen calls only) so that an op with no generator argument
// (rand_like, randn_like, randint_like) draws from rank_generator(): when that is not the process
// default, the default generator takes its state for the call (under a process-wide lock, as
// ranks that are threads share the default) and hands the advanced state back.
void draw_with_rank_generator(const std::function<void()>& draw);

}  // namespace dtensor
