#pragma once
// The one public C++ header of the engine: distributed tensors, meshes, collectives and launch
// (dtensor/api.h) and sharded checkpoints (checkpoint/checkpoint.h). Other projects include
// this (Bazel: deps = ["@dtensor//:dtensor"]; installed: pkg-config dtensor). The two headers
// stay separate inside the repository because checkpoint/ sits above dtensor/ (NOTE [checkpoint
// API header]); this umbrella sits above both.
//
//   #include "dtensor_engine.h"
//   auto ctx = dtensor::api::init_from_env();
//   dtensor::DeviceMesh mesh = dtensor::api::init_device_mesh({ctx->world_size()});
//   at::Tensor w = dtensor::api::distribute_tensor(weight, mesh, {dtensor::Shard(0)});
//   std::map<std::string, dtensor::checkpoint::Value> state = {{"w", w}};
//   dtensor::checkpoint::save(state, "/ckpt/step1");

#include "checkpoint/checkpoint.h"
#include "dtensor/api.h"
