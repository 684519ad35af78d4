// One ISA variant of every hot kernel, and the table through which the entry points call
// them (cpu_isa.h). Included once per variant by csrc/isa/kernels_<isa>.cpp.
#pragma once

#include "../cpu_isa.h"
#include "backward.h"
#include "bias_relu.h"
#include "bucketize.h"
#include "forward.h"
#include "id_check.h"
#include "interaction.h"
#include "probe.h"
#include "weight_grad.h"

#define NEO_STR_(x) #x
#define NEO_STR(x) NEO_STR_(x)

namespace neo {
namespace NEO_ISA {

const KernelTable& kernel_table() {
  static const KernelTable table{
      NEO_STR(NEO_ISA),
      &forward<float>, &forward<c10::Half>, &forward<c10::BFloat16>,
      &backward<float>, &backward<c10::Half>, &backward<c10::BFloat16>,
      &interaction_forward, &interaction_backward,
      &bias_relu, &relu_bias_backward,
      &bucketize<int32_t>, &bucketize<int64_t>,
      &id_check<int32_t>, &id_check<int64_t>,
      &gather_probe, &interaction_traffic_forward, &interaction_traffic_backward,
      &round_rows<c10::Half>, &round_rows<c10::BFloat16>,
      &weight_grad<float>, &weight_grad<c10::Half>, &weight_grad<c10::BFloat16>,
  };
  return table;
}

}  // namespace NEO_ISA
}  // namespace neo
