// Runs a tvm-roialign detector artifact on a photo with TVM's runtime alone (no Python).
//
//   detect model.so photo.ppm [result.json]
//
// The artifact's function `detect_photo` takes the photo as it is ([H, W, 3] uint8 RGB) and returns
// boxes [D, 4] (x1, y1, x2, y2 in the photo's pixels), labels [D], scores [D] and, for Mask R-CNN,
// masks [D, H, W] (uint8, 0 or 1), for Keypoint R-CNN keypoints [D, K, 3] (x, y, 1) and their
// scores [D, K]. The program writes them as JSON (stdout without a third argument); each mask as
// its pixel count and a run-length code of its rows (row-major counts of alternating 0 and 1 runs,
// starting with 0), each keypoint as [x, y, score].
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Photo {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]
};

// The next header token of a binary PPM, skipping whitespace and comments.
std::string PpmToken(std::istream& in) {
  std::string token;
  int c;
  while ((c = in.get()) != EOF) {
    if (c == '#') {
      while ((c = in.get()) != EOF && c != '\n') {
      }
    } else if (!isspace(c)) {
      token.push_back(static_cast<char>(c));
      while ((c = in.peek()) != EOF && !isspace(c) && c != '#') token.push_back(static_cast<char>(in.get()));
      return token;
    }
  }
  return token;
}

// A binary PPM (P6, 8 bits a sample) as [H, W, 3] RGB.
Photo ReadPpm(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("photo '" + path + "' cannot be opened");
  if (PpmToken(in) != "P6") throw std::runtime_error("photo '" + path + "' is not a binary PPM (P6)");
  Photo photo;
  photo.width = std::stoll(PpmToken(in));
  photo.height = std::stoll(PpmToken(in));
  if (std::stoll(PpmToken(in)) != 255) throw std::runtime_error("photo '" + path + "' is not 8-bit");
  in.get();  // the one whitespace byte before the pixels
  photo.rgb.resize(static_cast<size_t>(photo.height * photo.width * 3));
  in.read(reinterpret_cast<char*>(photo.rgb.data()), static_cast<std::streamsize>(photo.rgb.size()));
  if (!in) throw std::runtime_error("photo '" + path + "' is truncated");
  return photo;
}

// Host memory for tensors, aligned as TVM's kernels expect (64 bytes).
struct AlignedAlloc {
  void AllocData(DLTensor* tensor) {
    size_t size = (tvm::ffi::GetDataSize(*tensor) + 63) / 64 * 64;
    tensor->data = std::aligned_alloc(64, size ? size : 64);
    if (tensor->data == nullptr) throw std::bad_alloc();
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

template <typename T>
std::vector<T> Values(const tvm::ffi::Tensor& tensor) {
  const DLTensor* view = tensor.GetDLTensorPtr();
  if (view->device.device_type != kDLCPU || !tensor.IsContiguous()) {
    throw std::runtime_error("an output is not a contiguous host tensor");
  }
  size_t count = 1;
  for (int i = 0; i < view->ndim; ++i) count *= static_cast<size_t>(view->shape[i]);
  const T* data = reinterpret_cast<const T*>(static_cast<const char*>(view->data) + view->byte_offset);
  return std::vector<T>(data, data + count);
}

// Run lengths of a 0/1 mask in row-major order, starting with a run of zeros.
std::vector<int64_t> RunLengths(const uint8_t* mask, size_t size, int64_t* pixels) {
  std::vector<int64_t> runs;
  uint8_t current = 0;
  int64_t length = 0;
  *pixels = 0;
  for (size_t i = 0; i < size; ++i) {
    uint8_t value = mask[i] ? 1 : 0;
    *pixels += value;
    if (value != current) {
      runs.push_back(length);
      current = value;
      length = 0;
    }
    ++length;
  }
  runs.push_back(length);
  return runs;
}

bool IsMasks(const tvm::ffi::Tensor& tensor) {
  const DLDataType dtype = tensor.GetDLTensorPtr()->dtype;
  return dtype.code == kDLUInt && dtype.bits == 8;
}

std::string Json(const std::vector<tvm::ffi::Tensor>& out, const Photo& photo, double run_ms) {
  std::vector<float> boxes = Values<float>(out[0]), scores = Values<float>(out[2]);
  std::vector<int64_t> labels = Values<int64_t>(out[1]);
  std::vector<uint8_t> masks;
  std::vector<float> keypoints, keypoint_scores;
  int64_t num_keypoints = 0;
  if (out.size() == 4 && IsMasks(out[3])) masks = Values<uint8_t>(out[3]);
  if (out.size() == 5) {  // keypoints [D, K, 3], their scores [D, K]
    keypoints = Values<float>(out[3]);
    keypoint_scores = Values<float>(out[4]);
    num_keypoints = out[4].GetDLTensorPtr()->shape[1];
  }
  const size_t area = static_cast<size_t>(photo.height * photo.width);
  std::ostringstream json;
  json.precision(9);
  json << "{\"image_size\": [" << photo.height << ", " << photo.width << "], \"run_ms\": " << run_ms
       << ", \"num_detections\": " << labels.size() << ", \"detections\": [";
  for (size_t i = 0; i < labels.size(); ++i) {
    json << (i ? ",\n  " : "\n  ") << "{\"label\": " << labels[i] << ", \"score\": " << scores[i]
         << ", \"box\": [" << boxes[4 * i] << ", " << boxes[4 * i + 1] << ", " << boxes[4 * i + 2] << ", "
         << boxes[4 * i + 3] << "]";
    if (!masks.empty()) {
      int64_t pixels = 0;
      std::vector<int64_t> runs = RunLengths(masks.data() + i * area, area, &pixels);
      json << ", \"mask_pixels\": " << pixels << ", \"mask_rle\": [";
      for (size_t k = 0; k < runs.size(); ++k) json << (k ? ", " : "") << runs[k];
      json << "]";
    }
    if (num_keypoints > 0) {
      json << ", \"keypoints\": [";
      for (int64_t k = 0; k < num_keypoints; ++k) {
        const size_t at = i * static_cast<size_t>(num_keypoints) + static_cast<size_t>(k);
        json << (k ? ", " : "") << "[" << keypoints[3 * at] << ", " << keypoints[3 * at + 1] << ", "
             << keypoint_scores[at] << "]";
      }
      json << "]";
    }
    json << "}";
  }
  json << "\n]}\n";
  return json.str();
}

// Refuses a library this machine cannot load, in one line, before dlopen (which would report a
// foreign file as missing, and die of a bus error on a truncated one): not an ELF file, built for
// another architecture, or a size other than the one its metadata file (LIB.json, written by
// `tvm-roialign compile`) records.
void CheckLibrary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char header[20] = {0};
  if (!in.read(reinterpret_cast<char*>(header), sizeof(header)) || std::memcmp(header, "\x7f" "ELF", 4) != 0) {
    throw std::runtime_error("library '" + path + "' is not a shared library (no ELF header)");
  }
#if defined(__x86_64__)
  const int machine = 62, other = 183;  // EM_X86_64, EM_AARCH64
  const char *here = "x86_64", *there = "aarch64";
#elif defined(__aarch64__)
  const int machine = 183, other = 62;
  const char *here = "aarch64", *there = "x86_64";
#else
  const int machine = -1, other = -2;
  const char *here = "", *there = "";
#endif
  const int found = header[18] | (header[19] << 8);  // e_machine, little-endian
  if (machine > 0 && found != machine) {
    throw std::runtime_error("library '" + path + "' is built for " +
                             (found == other ? std::string(there) : "another CPU") +
                             "; this program runs on " + here);
  }
  std::ifstream meta(path + ".json");
  if (!meta) return;  // a library built elsewhere: nothing to compare with
  std::stringstream text;
  text << meta.rdbuf();
  const std::string json = text.str();
  const size_t record = json.find("\"library\"");
  const size_t key = record == std::string::npos ? record : json.find("\"size\"", record);
  if (key == std::string::npos) return;
  const unsigned long long recorded = std::strtoull(json.c_str() + json.find(':', key) + 1, nullptr, 10);
  const unsigned long long actual = std::filesystem::file_size(path);
  if (recorded != actual) {
    throw std::runtime_error("library '" + path + "' has " + std::to_string(actual) + " bytes, its " +
                             path + ".json records " + std::to_string(recorded) +
                             " (truncated or replaced: compile it again)");
  }
}

// The value of the first `"key": <integer>` in `json`, or -1.
long long JsonInteger(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + json.find(':', at) + 1, nullptr, 10);
}

// The integer lists of the first `"key": [[a, b], [c]]` in `json` (empty where there is none).
std::vector<std::vector<long long>> JsonIntegerRows(const std::string& json, const std::string& key) {
  std::vector<std::vector<long long>> rows;
  size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos || (at = json.find('[', at)) == std::string::npos) return rows;
  int depth = 0;
  for (size_t i = at; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '[' && ++depth == 2) rows.emplace_back();
    if (c == ']' && --depth == 0) break;
    if (depth == 2 && std::isdigit(static_cast<unsigned char>(c)) && !std::isdigit(static_cast<unsigned char>(json[i - 1]))) {
      rows.back().push_back(std::strtoll(json.c_str() + i, nullptr, 10));
    }
  }
  return rows;
}

// torchvision's MultiScaleRoIAlign scales (its _infer_scale, from heights only) of feature maps of
// `strides` for a batch padded to `padded` rows whose largest resized height is `height`.
std::vector<float> PoolerScales(const std::vector<long long>& strides, long long padded, long long height) {
  std::vector<float> scales;
  for (long long stride : strides) {
    const long long feature = (padded + stride - 1) / stride;
    scales.push_back(std::exp2(std::nearbyint(std::log2(static_cast<float>(double(feature) / double(height))))));
  }
  return scales;
}

// The smallest resized height in a batch padded to `padded` rows for which every pooler infers the
// scales it infers at `padded` (as tvm_roialign.runtime.transform.min_height_at).
long long MinHeightAt(const std::vector<std::vector<long long>>& rows, long long padded, long long divisor) {
  long long lowest = padded;
  for (long long height = padded; height > std::max(padded - divisor, 0LL); --height) {
    for (const auto& strides : rows) {
      if (PoolerScales(strides, padded, height) != PoolerScales(strides, padded, padded)) return lowest;
    }
    lowest = height;
  }
  return lowest;
}

// The resized height from which every height is served (tvm_roialign.runtime.transform.served_height).
long long ServedHeight(const std::vector<std::vector<long long>>& rows, long long divisor) {
  long long lowest = 1;
  for (long long padded = divisor; padded <= 64 * divisor; padded += divisor) {
    const long long need = MinHeightAt(rows, padded, divisor);
    if (need <= padded - divisor + 1) break;
    lowest = need;
  }
  return lowest;
}

// One line for an error of the detect_photo call: a photo whose resized size the library does not
// serve fails the function's size check (a match_cast of the VM), said here with the reason, as
// torchvision's transform resizes the photo; other errors keep their first line.
std::string CallError(const std::string& what, const Photo& photo, const std::string& path) {
  if (what.find("match_cast") == std::string::npos) return what.substr(0, what.find('\n'));
  std::ifstream meta(path + ".json");
  std::stringstream buffer;
  buffer << meta.rdbuf();
  const std::string text = buffer.str();
  const long long low = JsonInteger(text, "min_side"), high = JsonInteger(text, "max_side");
  const long long min_size = JsonInteger(text, "min_size"), max_size = JsonInteger(text, "max_size");
  const long long divisor = std::max(JsonInteger(text, "size_divisible"), 1LL);
  const std::string size = std::to_string(photo.height) + "x" + std::to_string(photo.width);
  if (min_size <= 0 || max_size <= 0) return "photo " + size + ": the library does not serve its resized size";
  // GeneralizedRCNNTransform's resize (Python floats, as torchvision computes), then its padding
  const double scale = std::min(double(min_size) / double(std::min(photo.height, photo.width)),
                                double(max_size) / double(std::max(photo.height, photo.width)));
  const long long rh = static_cast<long long>(photo.height * scale), rw = static_cast<long long>(photo.width * scale);
  const long long ph = (rh + divisor - 1) / divisor * divisor, pw = (rw + divisor - 1) / divisor * divisor;
  const std::string resized = std::to_string(rh) + "x" + std::to_string(rw);
  const std::string padded = std::to_string(ph) + "x" + std::to_string(pw);
  const std::string transform = "torchvision's transform (min_size " + std::to_string(min_size) + ", max_size " +
                                std::to_string(max_size) + ") resizes it to " + resized + ", padded to " + padded;
  const auto rows = JsonIntegerRows(text, "pooler_strides");
  const long long need = rh < 1 ? 1 : rows.empty() ? 0 : MinHeightAt(rows, ph, divisor);
  if (rh < need) {
    std::string limit;
    if (!rows.empty()) {
      const long long served = ServedHeight(rows, divisor);
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.1f", double(max_size) / double(served));
      limit = " (every photo at most " + std::string(ratio) + " times as wide as high is served: a resized " +
              "height of " + std::to_string(served) + " or more)";
    }
    return "photo " + size + ": " + transform + ": at a height of " + std::to_string(rh) + " in " +
           std::to_string(ph) + " rows, torchvision's poolers infer other scales than the detector's (it needs a "
           "resized height of at least " + std::to_string(need) + " there); no build serves it" + limit;
  }
  const std::string sides = low > 0 && high > 0 ? " (any padded size from " + std::to_string(low) + " to " +
                                                      std::to_string(high) + " pixels a side)" : "";
  return "photo " + size + ": " + transform + ", outside the sizes this library serves" + sides +
         "; a build of that size (tvm-roialign compile --input-size " + size +
         ") runs under tvm-roialign run --image, not here (this program needs detect_photo, built for any size)";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::cerr << "usage: " << argv[0] << " model.so photo.ppm [result.json]\n";
    return 2;
  }
  try {
    Photo photo = ReadPpm(argv[2]);
    DLDevice cpu{kDLCPU, 0};
    // an absolute path: dlopen looks a bare file name up in the library search path
    const std::string path = std::filesystem::absolute(argv[1]).string();
    if (!std::filesystem::is_regular_file(path)) throw std::runtime_error("library '" + path + "' does not exist");
    CheckLibrary(path);
    tvm::ffi::Module library = tvm::ffi::Module::LoadFromFile(path);
    tvm::ffi::Module vm = library->GetFunction("vm_load_executable").value()().cast<tvm::ffi::Module>();
    const int pooled = 2;  // tvm::runtime::memory::kPooled
    vm->GetFunction("vm_initialization").value()(static_cast<int>(kDLCPU), 0, pooled);
    auto detect = vm->GetFunction("detect_photo");
    if (!detect.has_value()) {
      throw std::runtime_error(std::string("'") + argv[1] +
                               "' has no function detect_photo (compile the detector for any photo "
                               "size, without --input-size, for a CPU target)");
    }
    int64_t shape[3] = {photo.height, photo.width, 3};
    tvm::ffi::Tensor input = tvm::ffi::Tensor::FromNDAlloc(
        AlignedAlloc(), tvm::ffi::ShapeView(shape, 3), DLDataType{kDLUInt, 8, 1}, cpu);
    std::memcpy(input.data_ptr(), photo.rgb.data(), photo.rgb.size());
    // a library built by tvm-roialign stores 3x3 weights where its Winograd convolutions read
    // transformed ones: load_weights computes them once, and detect_photo takes them after the photo
    std::vector<tvm::ffi::Any> weights;
    if (auto load_weights = vm->GetFunction("load_weights")) {
      for (const tvm::ffi::Any& w : (*load_weights)().cast<tvm::ffi::Array<tvm::ffi::Any>>()) weights.push_back(w);
    }
    std::vector<tvm::ffi::AnyView> args{input};
    for (const tvm::ffi::Any& w : weights) args.emplace_back(w);
    auto start = std::chrono::steady_clock::now();
    tvm::ffi::Array<tvm::ffi::Any> result;
    try {
      tvm::ffi::Any out;
      detect.value().CallPacked(args.data(), static_cast<int32_t>(args.size()), &out);
      result = out.cast<tvm::ffi::Array<tvm::ffi::Any>>();
    } catch (const std::exception& err) {
      throw std::runtime_error(CallError(err.what(), photo, path));
    }
    double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::vector<tvm::ffi::Tensor> outputs;
    for (const tvm::ffi::Any& item : result) outputs.push_back(item.cast<tvm::ffi::Tensor>());
    std::string json = Json(outputs, photo, run_ms);
    if (argc == 4) {
      std::ofstream out(argv[3]);
      if (!(out << json) || !(out.flush())) {
        throw std::runtime_error(std::string("cannot write '") + argv[3] + "'");
      }
    } else {
      std::cout << json;
    }
  } catch (const std::exception& err) {
    std::cerr << "detect: error: " << err.what() << "\n";
    return 1;
  }
  return 0;
}
