#pragma once
// FlashInfer-Trace, the layout of FlashInfer-Bench's dataset (docs/format.md): a folder of
// definitions/<op_type>/<name>.json (an operation: axes, inputs, outputs, reference code),
// workloads/<op_type>/<name>.jsonl (each line one workload: the variable axes' values and each
// input as a tensor in a .safetensors file, random, or a scalar) and the workloads' tensors under
// blob/workloads/<op_type>/<name>/.
//
// Out: a captured call becomes a workload of the definition FlashInfer names for it:
// gqa_ragged_prefill_causal_h{Hq}_kv{Hkv}_d{D} (dense and packed-varlen prefill),
// gqa_paged_prefill_causal_..._ps1 (paged prefill), gqa_paged_decode_h{Hq}_kv{Hkv}_d{D}_ps1 (one
// query per sequence), mla_paged_{decode,prefill_causal}_h{Hq}_ckv{Dv}_kpe{Dpe}_ps1 (MLA with its
// matrices absorbed). A padded batch (a mask that hides each sequence's pads, as transformers
// makes for a left-padded generate()) becomes its sequences without the pads. A call that maps
// onto no definition is refused with the reason (NotRepresentable).
// In: a FlashInfer-Trace folder reads as calls (thd, causal bottom-right as FlashInfer aligns it).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "formats/capture_source.h"

namespace attnreplay {

// A folder holding definitions/ and workloads/.
bool looks_like_flashinfer_trace(const std::string& path);
std::unique_ptr<CaptureSource> open_flashinfer_trace(const std::string& path);

// Writes into `folder` (created, or added to: a workload already there, by its uuid, is kept).
// append() throws NotRepresentable, naming the reason, for a call no definition holds.
std::unique_ptr<CaptureWriter> open_flashinfer_trace_writer(const std::string& folder, const std::string& producer);

// The constant axes of an attention definition, as FlashInfer's fi_trace dumps them
// (FLASHINFER_TRACE_DUMP=1: one definition JSON per operation and shape, with no workload).
struct FlashInferDefinitionShape {
  std::string name, op_type;
  enum class Kind { ragged_prefill, paged_prefill, paged_decode } kind = Kind::ragged_prefill;
  bool causal = false;
  std::int64_t heads_q = 0, heads_kv = 0, head_dim_qk = 0, head_dim_vo = 0, page_size = 0;
  DType dtype = DType::bfloat16;
};
// Reads one definition file; nullopt when the file is JSON but not an attention definition
// attnreplay knows (gqa_ragged, gqa_paged); InputError naming the file when it is damaged.
std::optional<FlashInferDefinitionShape> read_flashinfer_definition(const std::string& path);

// The metadata keys a call read from FlashInfer-Trace carries: its definition's name and its
// workload (the JSON object, as the file holds it).
inline constexpr const char* kFlashInferDefinitionKey = "flashinfer.definition";
inline constexpr const char* kFlashInferWorkloadKey = "flashinfer.workload";

}  // namespace attnreplay
