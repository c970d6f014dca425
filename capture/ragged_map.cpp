#include "capture/ragged_map.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "formats/torch_tensor.h"

namespace attnreplay::capture {
namespace {

// Slots of a list of pages as indices into the cache: clamped into it, so that a slot the call does
// not read (a padded table's, a buffer's tail) gathers some page rather than none.
at::Tensor page_slots(const at::Tensor& listed, std::int64_t cache_pages) {
  return listed.flatten().to(at::kLong).clamp(0, std::max<std::int64_t>(cache_pages - 1, 0));
}

// K and V as the pages `listed` names, every slot of it, gathered on the job's stream for capture
// alone.
void gather_pages(RaggedCopies& copies, const at::Tensor& k, const at::Tensor& v, const at::Tensor& listed) {
  const at::Tensor slots = page_slots(listed, k.size(0));
  copies.k = k.index({slots});
  copies.v = v.index({slots});
  copies.kv_gathered = true;
}

// A host copy as a CPU tensor (no copy of its bytes).
at::Tensor cpu(const HostTensor& tensor) { return torch_view_of_host_tensor(tensor); }

// A tensor made here as the record holds it: the device its values came from (what it would say had
// it been made there, as capture once made it).
HostTensor on_device(const at::Tensor& values, const std::string& device) {
  HostTensor host = host_tensor_from_torch(values.contiguous());
  host.device = device;
  return host;
}

}  // namespace

std::optional<RaggedCopies> plan_ragged_copies(const RaggedArguments& a) {
  if (!a.cu_seqlens_q && !a.used && !a.table && !a.page_starts) return std::nullopt;
  const at::Tensor &q = *a.q, &k = *a.k, &v = *a.v;
  RaggedCopies copies;
  RaggedLayout& layout = copies.layout;
  layout.index_device = q.device().str();
  if (a.cu_seqlens_q ? q.dim() != 3 : q.dim() != 4) return std::nullopt;
  if (a.page_starts) {
    if (!a.page_indices || !a.last_page_lengths || k.dim() != 4) return std::nullopt;
    layout.keys = RaggedLayout::Keys::page_list;
    gather_pages(copies, k, v, *a.page_indices);
    copies.page_starts = *a.page_starts;
    copies.table = *a.page_indices;  // the page ids, beside the pages they gathered
    copies.last_page_lengths = *a.last_page_lengths;
  } else if (a.table) {
    if (k.dim() != 4 || (!a.used && !a.cu_seqlens_k)) return std::nullopt;
    layout.keys = RaggedLayout::Keys::paged;
    gather_pages(copies, k, v, *a.table);
    copies.table = *a.table;
    if (a.used) copies.used = *a.used;
    else copies.cu_seqlens_k = *a.cu_seqlens_k;
  } else if (a.cu_seqlens_k) {
    if (k.dim() != 3) return std::nullopt;
    copies.k = k, copies.v = v, copies.cu_seqlens_k = *a.cu_seqlens_k;
    if (a.used) copies.used = *a.used;
  } else {
    if (!a.used || k.dim() != 4) return std::nullopt;
    layout.keys = RaggedLayout::Keys::dense_cache;
    copies.k = k, copies.v = v, copies.used = *a.used;
  }
  if (layout.keys == RaggedLayout::Keys::paged || layout.keys == RaggedLayout::Keys::page_list) {
    layout.page_size = k.size(1);
    layout.cache_pages = k.size(0);
  }
  if (a.cu_seqlens_q) {
    copies.q = q;
    copies.cu_seqlens_q = *a.cu_seqlens_q;
  } else {
    copies.q = q.flatten(0, 1);
    layout.dense_query = true;
    layout.batch = q.size(0);
    layout.query_len = q.size(1);
  }
  return copies;
}

namespace {

// A paged cache cut down to the pages its sequences read: their page ids in `table` (batch, slots),
// each sequence reading its first ceil(lengths[b] / page_size) slots; K's and V's copies hold the
// page of the table's slot (b, s) at gathered_slot[b, s]. The pages in id order, the table
// renumbered into them (-1 past the slots read).
void cut_pages(RaggedFields& fields, const at::Tensor& table, const at::Tensor& lengths, const at::Tensor& gathered_slot,
               const HostTensor& k, const HostTensor& v, const RaggedLayout& layout) {
  const std::int64_t batch = table.size(0), page_size = layout.page_size;
  const at::Tensor pages_needed = (lengths + (page_size - 1)).div(page_size, "floor");
  const std::int64_t width = std::max<std::int64_t>(1, batch > 0 ? pages_needed.max().item<std::int64_t>() : 0);
  if (width > table.size(1)) {
    throw std::runtime_error(fmt::format("a sequence reads {} pages, past its block table's {} slots", width,
                                         table.size(1)));
  }
  const at::Tensor read = at::arange(width, at::kLong).unsqueeze(0) < pages_needed.unsqueeze(1);
  const at::Tensor listed = table.slice(1, 0, width).to(at::kLong).masked_select(read);
  if (listed.numel() > 0 && (listed.min().item<std::int64_t>() < 0 || listed.max().item<std::int64_t>() >= layout.cache_pages)) {
    throw std::runtime_error(fmt::format("a block table lists a page outside its cache of {} pages", layout.cache_pages));
  }
  const auto [pages, renumbered] = at::_unique(listed, /*sorted=*/true, /*return_inverse=*/true);
  at::Tensor new_table = at::full({batch, width}, -1, at::kLong);
  new_table.masked_scatter_(read, renumbered);
  // Each page from a slot that lists it: any, as each such slot gathered that same page.
  at::Tensor slot_of_page = at::empty({pages.size(0)}, at::kLong);
  slot_of_page.index_put_({renumbered}, gathered_slot.slice(1, 0, width).masked_select(read));
  const auto pick = [&](const HostTensor& cache) {
    at::Tensor picked = cpu(cache).index_select(0, slot_of_page);
    HostTensor host = host_tensor_from_torch(picked);
    host.device = cache.device;
    return host;
  };
  fields.k = pick(k);
  fields.v = pick(v);
  fields.block_table = on_device(new_table.to(at::kInt), layout.index_device);
  fields.seqused_k = on_device(lengths.to(at::kInt), layout.index_device);
}

}  // namespace

RaggedFields ragged_fields(const RaggedLayout& layout, RaggedHostCopies host) {
  RaggedFields fields;
  fields.q = std::move(host.q);
  if (layout.dense_query) {
    fields.cu_seqlens_q = on_device(at::arange(0, (layout.batch + 1) * layout.query_len, layout.query_len,
                                               at::kLong).to(at::kInt), layout.index_device);
  } else {
    fields.cu_seqlens_q = std::move(*host.cu_seqlens_q);
  }
  switch (layout.keys) {
    case RaggedLayout::Keys::packed:
      fields.k = std::move(host.k), fields.v = std::move(host.v);
      fields.cu_seqlens_k = std::move(host.cu_seqlens_k);
      fields.seqused_k = std::move(host.used);
      break;
    case RaggedLayout::Keys::dense_cache: {
      const at::Tensor lengths = cpu(*host.used).to(at::kLong);
      const at::Tensor kept = at::arange(host.k.shape.at(1), at::kLong).unsqueeze(0) < lengths.unsqueeze(1);
      const auto pack = [&](const HostTensor& cache) {
        HostTensor packed = host_tensor_from_torch(cpu(cache).index({kept}));
        packed.device = cache.device;
        return packed;
      };
      fields.k = pack(host.k);
      fields.v = pack(host.v);
      fields.cu_seqlens_k =
          on_device(at::cat({at::zeros({1}, at::kLong), lengths.cumsum(0)}).to(at::kInt), layout.index_device);
      break;
    }
    case RaggedLayout::Keys::paged: {
      const at::Tensor table = cpu(*host.table).to(at::kLong);
      const at::Tensor lengths =
          host.used ? cpu(*host.used).to(at::kLong) : [&] {
            const at::Tensor offsets = cpu(*host.cu_seqlens_k).to(at::kLong);
            return (offsets.slice(0, 1) - offsets.slice(0, 0, -1)).contiguous();
          }();
      // The pages were gathered slot by slot, in the table's order.
      const at::Tensor slots = at::arange(table.numel(), at::kLong).view(table.sizes());
      cut_pages(fields, table, lengths, slots, host.k, host.v, layout);
      break;
    }
    case RaggedLayout::Keys::page_list: {
      // FlashInfer's form as a block table, and each sequence's key count from its pages' count and
      // its last page's keys.
      const at::Tensor starts = cpu(*host.page_starts).to(at::kLong);
      const at::Tensor counts = starts.slice(0, 1) - starts.slice(0, 0, -1);
      const std::int64_t batch = counts.size(0);
      const std::int64_t width = std::max<std::int64_t>(1, batch > 0 ? counts.max().item<std::int64_t>() : 0);
      const at::Tensor column = at::arange(width, at::kLong).unsqueeze(0);
      const at::Tensor listed = column < counts.unsqueeze(1);
      const at::Tensor positions = (starts.slice(0, 0, -1).unsqueeze(1) + column).masked_select(listed);
      const at::Tensor ids = cpu(*host.table).to(at::kLong);
      at::Tensor table = at::zeros({batch, width}, at::kLong);
      table.masked_scatter_(listed, ids.index_select(0, positions));
      at::Tensor slots = at::zeros({batch, width}, at::kLong);
      slots.masked_scatter_(listed, positions);
      const at::Tensor last = cpu(*host.last_page_lengths).to(at::kLong);
      const at::Tensor lengths =
          at::where(counts > 0, (counts - 1) * layout.page_size + last, at::zeros_like(counts));
      cut_pages(fields, table, lengths, slots, host.k, host.v, layout);
      break;
    }
  }
  return fields;
}

}  // namespace attnreplay::capture
