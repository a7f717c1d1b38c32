#pragma once
// NOTE [CPU memory meter]
// Live and peak bytes of CPU tensor memory in this process, for benchmarks and tests that check a
// memory bound (FSDP's peak per rank): torch counts CUDA memory
// (torch.cuda.max_memory_allocated) but not CPU memory, and a resident-set size also holds the
// malloc arenas and Python's heap. install_cpu_memory_meter() wraps c10's CPU allocator once
// (c10::SetCPUAllocator, highest priority): every allocation made after it is counted until its
// storage is freed, whichever thread frees it. Memory that does not come from that allocator
// (symmetric memory and shared-memory segments, memory from before install) is not counted. The
// wrapper gives each block a context of its own, so it is opt-in (benchmarks), not installed by
// the engine.

#include <cstdint>

namespace dtensor {

// Wraps the CPU allocator (idempotent; never uninstalled: blocks outlive any scope).
void install_cpu_memory_meter();
bool cpu_memory_meter_installed();
// Bytes of CPU allocator blocks now live, and the most live since install or the last reset.
int64_t cpu_live_bytes();
int64_t cpu_peak_bytes();
// The peak restarts from the live bytes.
void reset_cpu_peak_bytes();

}  // namespace dtensor
