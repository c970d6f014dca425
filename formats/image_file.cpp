#include "formats/image_file.h"

#include <fmt/format.h>

#include <csetjmp>
#include <cstdio>
#include <memory>

#ifdef ATTNREPLAY_WITH_PNG
#include <png.h>
#endif
#ifdef ATTNREPLAY_WITH_JPEG
#include <jpeglib.h>
#endif

#include "formats/errors.h"

namespace attnreplay {
namespace {

// (h, w) for one channel, else (h, w, c): how NumPy holds images.
std::vector<std::int64_t> image_shape(std::int64_t height, std::int64_t width, int channels) {
  if (channels == 1) return {height, width};
  return {height, width, channels};
}

#ifdef ATTNREPLAY_WITH_PNG
// libpng's simplified API: 8 bits a channel, its channels kept (grey, grey and alpha, RGB, RGBA).
HostTensor read_png(const std::string& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    throw InputError(fmt::format("{}: not a PNG libpng can read: {}", path, image.message));
  }
  image.format &= PNG_FORMAT_FLAG_COLOR | PNG_FORMAT_FLAG_ALPHA;
  const int channels = PNG_IMAGE_SAMPLE_CHANNELS(image.format);
  HostTensor pixels = HostTensor::allocate(DType::uint8, image_shape(image.height, image.width, channels));
  if (!png_image_finish_read(&image, nullptr, pixels.mutable_data(), 0, nullptr)) {
    const std::string message = image.message;
    png_image_free(&image);
    throw InputError(fmt::format("{}: a PNG whose pixels libpng cannot read: {}", path, message));
  }
  return pixels;
}
#endif

#ifdef ATTNREPLAY_WITH_JPEG
// libjpeg reports an error by calling error_exit, which must not return: it jumps back to the
// decoder's start with the message.
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf back;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  info->err->format_message(info, errors->message);
  std::longjmp(errors->back, 1);
}

HostTensor read_jpeg(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw InputError(fmt::format("{}: cannot open", path));
  jpeg_decompress_struct info{};
  JpegErrors errors{};
  info.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = jpeg_error_exit;
  // Allocated before the jump point, so that nothing with a destructor lies between it and a jump.
  HostTensor pixels;
  if (setjmp(errors.back)) {
    jpeg_destroy_decompress(&info);
    throw InputError(fmt::format("{}: a JPEG libjpeg cannot read: {}", path, errors.message));
  }
  jpeg_create_decompress(&info);
  jpeg_stdio_src(&info, file.get());
  jpeg_read_header(&info, TRUE);
  jpeg_start_decompress(&info);
  const int channels = info.output_components;
  pixels = HostTensor::allocate(DType::uint8, image_shape(info.output_height, info.output_width, channels));
  const std::size_t row_bytes = static_cast<std::size_t>(info.output_width) * channels;
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = reinterpret_cast<JSAMPROW>(pixels.mutable_data() + info.output_scanline * row_bytes);
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return pixels;
}
#endif

}  // namespace

ImageKind image_kind(const std::string& head) {
  if (head.rfind("\x89PNG\r\n\x1a\n", 0) == 0) return ImageKind::png;
  if (head.rfind("\xFF\xD8\xFF", 0) == 0) return ImageKind::jpeg;
  return ImageKind::none;
}

HostTensor read_image_file(const std::string& path, ImageKind kind) {
  switch (kind) {
    case ImageKind::png:
#ifdef ATTNREPLAY_WITH_PNG
      return read_png(path);
#else
      throw InputError(fmt::format("{}: a PNG image, and this build has no libpng (install libpng-dev and rebuild), "
                                   "or save the array (np.save)", path));
#endif
    case ImageKind::jpeg:
#ifdef ATTNREPLAY_WITH_JPEG
      return read_jpeg(path);
#else
      throw InputError(fmt::format("{}: a JPEG image, and this build has no libjpeg (install libjpeg-dev and "
                                   "rebuild), or save the array (np.save)", path));
#endif
    case ImageKind::none:
      break;
  }
  throw InputError(fmt::format("{}: not a PNG or JPEG image", path));
}

}  // namespace attnreplay
