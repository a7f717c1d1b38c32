// A "third-party" backend: it lives in its own library, outside collectives/, and registers
// itself by name from a static initializer, without touching the core. It serves groups of one
// rank only (every collective is then a copy), which is all a registration test needs.

#include <ATen/ATen.h>

#include <stdexcept>

#include "collectives/communicator.h"

namespace dtensor::testing {
namespace {

using collectives::CollectiveCall;
using collectives::CollectiveKind;

class LoopbackCommunicator : public collectives::Communicator {
 public:
  explicit LoopbackCommunicator(const collectives::CommunicatorOptions& o)
      : Communicator(o.group, 0, o.timeout) {
    if (o.group.ranks.size() != 1) {
      throw dtensor::Error("test_loopback serves single-rank groups only");
    }
  }

  void run(CollectiveCall& call) override {
    ++calls;
    if (call.kind != CollectiveKind::kBarrier) call.output.copy_(call.input);
  }

  static inline int calls = 0;
};

collectives::BackendRegistration g_loopback("test_loopback",
                                            [](const collectives::CommunicatorOptions& o) {
                                              return std::make_unique<LoopbackCommunicator>(o);
                                            });

}  // namespace

int loopback_calls() { return LoopbackCommunicator::calls; }

}  // namespace dtensor::testing
