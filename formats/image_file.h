#pragma once
// Images a job saved (PNG, JPEG) as uint8 tensors (height, width, channels), for `attnreplay e2e`
// (formats/tensor_file.h), which compares them as it compares arrays: PSNR, and SSIM for images.
// Decoded by libpng and libjpeg where the build has them.
#include <string>

#include "formats/host_tensor.h"

namespace attnreplay {

enum class ImageKind { none, png, jpeg };
// What an image file's first bytes say it is.
ImageKind image_kind(const std::string& head);

// The image's pixels: (height, width) for grey, (height, width, channels) otherwise; a palette is
// expanded, a 16-bit PNG read as 8-bit. Throws InputError naming the file and what is wrong with it,
// or that this build has no decoder for its kind.
HostTensor read_image_file(const std::string& path, ImageKind kind);

}  // namespace attnreplay
