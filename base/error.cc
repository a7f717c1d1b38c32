#include "base/error.h"

namespace dtensor {

Error::Error(std::string message) : c10::Error(std::move(message), /*backtrace=*/"") {}

}  // namespace dtensor
