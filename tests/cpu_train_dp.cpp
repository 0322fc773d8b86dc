// ditto-train's data parallelism end to end on simulated CPU ranks: --gpus 1, 2, 4 with the same
// --dp-groups end bit-identical (fixed-order), the manifest states the buckets, the all-reduce
// choices and the batch-norm mode; a data-parallel run resumes bit-identically and refuses to go
// on with another rank count; traced runs of 1 and 4 ranks compare equal under fixed-order, and
// under the ring the trace comparison names the all-reduce; the noise lab lists the buckets as
// candidates; the stream-folder dataset trains.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "datasets/dataset.h"
#include "engine/error.h"
#include "experiments/attribute.h"
#include "experiments/cli.h"
#include "experiments/diverge.h"
#include "experiments/train.h"
#include "train_support.h"
#include "engine/collective.h"

using namespace ditto;
namespace fs = std::filesystem;

namespace {

std::string scratch(const std::string& name) { return test::scratch("train_dp", name); }

TrainConfig dp_config(int gpus, int groups, const std::string& out = "") {
  TrainConfig c = test::synthetic_config("smallcnn-bn", 72, 24, 16, 16);
  c.epochs = 2;
  c.deterministic_init = c.deterministic_input = true;
  c.augment = true;
  c.gpus = gpus;
  c.dp_groups = groups;
  if (!out.empty()) {
    fs::remove_all(scratch(out));
    c.out = scratch(out);
  }
  return c;
}

nlohmann::json manifest_of(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("train --gpus: 1, 2 and 4 simulated ranks with the same groups end bit-identical") {
  // 72 examples in batches of 16: four full batches and one of 8, split into 4 groups of 2.
  const auto one = train(dp_config(1, 4, "g1"));
  const auto two = train(dp_config(2, 4, "g2"));
  const auto four = train(dp_config(4, 4));
  CHECK(two.weights_fingerprint == one.weights_fingerprint);
  CHECK(four.weights_fingerprint == one.weights_fingerprint);
  CHECK(two.predictions == one.predictions);
  // The logged loss sums every rank's rows (the same examples, in another order of addition).
  REQUIRE(two.log.size() == 2);
  CHECK(two.log[0].loss == Approx(one.log[0].loss).epsilon(1e-5));
  CHECK(two.log[0].train_acc == Approx(one.log[0].train_acc));

  const auto m = manifest_of(scratch("g2"));
  REQUIRE(m.contains("data_parallel"));
  const auto& dp = m["data_parallel"];
  CHECK(dp["ranks"] == 2);
  CHECK(dp["groups"] == 4);
  CHECK(dp["devices"] == nlohmann::json::array({"cpu", "cpu"}));
  CHECK(dp["rank_count_independent"] == true);
  CHECK(dp["batchnorm"].get<std::string>().rfind("local", 0) == 0);
  CHECK(dp["buckets"][0]["algo"] == "fixed-order");
  CHECK(m["flags"]["--gpus"] == "2");
  CHECK(m["flags"]["--dp-groups"] == "4");
  CHECK(m["replay"].get<std::string>().find("--gpus 2 --dp-groups 4") != std::string::npos);
  bool bucket_op = false;
  for (const auto& op : m["ops"])
    if (op["layer"] == "bucket0" && op["knob"] == "algo") {
      bucket_op = true;
      CHECK(op["op"] == "allreduce");
      CHECK(op["variant"] == "fixed-order");
      CHECK(op["guarantee"] == "gpu_to_gpu");
    }
  CHECK(bucket_op);

  // One group on one rank is the plain trainer, bit for bit.
  auto plain = dp_config(1, 0);
  auto single = dp_config(1, 1);
  CHECK(train(single).weights_fingerprint == train(plain).weights_fingerprint);
  CHECK(train(plain).weights_fingerprint != one.weights_fingerprint);  // four groups sum in another order
}

TEST_CASE("train --gpus: resumes bit-identically, and only with the same data-parallel flags") {
  const auto full = train(dp_config(2, 2, "full"));
  auto part = dp_config(2, 2, "part");
  part.epochs = 1;
  train(part);
  auto cont = dp_config(2, 2);
  cont.resume = scratch("part");
  CHECK(train(cont).weights_fingerprint == full.weights_fingerprint);

  auto other = dp_config(1, 0);
  other.resume = scratch("full");
  other.epochs = 3;
  CHECK(test::error_of([&] { train(other); }).find("--gpus") == 0);
  auto fewer = dp_config(1, 2);
  fewer.resume = scratch("full");
  fewer.epochs = 3;
  CHECK(test::error_of([&] { train(fewer); }).find("--gpus") == 0);
}

TEST_CASE("train --gpus: bad data-parallel flags are errors naming the flag") {
  auto c = dp_config(2, 3);
  CHECK(test::error_of([&] { train(c); }).find("--dp-groups") == 0);
  c = dp_config(2, 4);
  c.graph = true;
  CHECK(test::error_of([&] { train(c); }).find("--graph") == 0);
  c = dp_config(2, 4);
  c.batchnorm = "sync";
  CHECK(test::error_of([&] { train(c); }).find("--batchnorm sync") == 0);
  c = dp_config(2, 4);
  c.pins = {"bucket7.algo=ring"};
  CHECK(test::error_of([&] { train(c); }).find("bucket7") != std::string::npos);
  c = dp_config(2, 4);
  c.pins = {"bucket0.algo=nccl-default"};
  CHECK(test::error_of([&] { train(c); }).find("NCCL needs CUDA devices") != std::string::npos);
  c = dp_config(2, 4);
  c.synthetic_train = 66;  // a last batch of 2 rows for 4 groups
  CHECK(test::error_of([&] { train(c); }).find("--batch-size") == 0);
  c = dp_config(2, 2);
  c.batchnorm = "sync";
  CHECK_NOTHROW(train(c));
}

TEST_CASE("traces of 1 and 4 ranks: equal under fixed-order; under the ring the comparison names the all-reduce") {
  auto traced = [](int gpus, const std::string& algo, const std::string& name) {
    auto c = dp_config(gpus, 4);
    c.epochs = 1;
    c.max_steps = 2;
    c.pins = {"*.algo=" + algo};
    record_trace(c, scratch(name));
    return scratch(name);
  };
  const auto same = compare_trace_files(traced(1, "fixed-order", "f1.trace"), traced(4, "fixed-order", "f4.trace"));
  CHECK_FALSE(same.first.found);
  CHECK_FALSE(same.first.structure_mismatch);
  const auto ring = compare_trace_files(traced(1, "ring", "r1.trace"), traced(4, "ring", "r4.trace"));
  REQUIRE(ring.first.found);
  CHECK(ring.first.event_a.phase == "allreduce");
  CHECK(ring.first.event_a.layer == "bucket0");
  CHECK(ring.first.inputs_identical);
  CHECK(format_comparison(ring).find("bucket0 (allreduce/ring)") != std::string::npos);
}

TEST_CASE("noise lab: a data-parallel run's buckets are candidates") {
  auto c = dp_config(2, 2);
  c.model = "resnet18";  // 45 MB of gradients in 1 MiB buckets
  c.bucket_mb = 1;
  const auto cands = data_parallel_candidates(c, 10, 3);
  REQUIRE(cands.size() >= 2);
  CHECK(cands.front().name == "bucket0.algo=nccl-default");
  CHECK(cands.front().op == op::allreduce);
  CHECK(cands.back().group == (cands.size() > 2));
  c.gpus = 1;
  c.dp_groups = 0;
  CHECK(data_parallel_candidates(c, 10, 3).empty());
}

TEST_CASE("train --dataset stream-folder: JPEGs of varied sizes, cropped on the fly") {
  const std::string root = scratch("jpegs");
  int k = 0;
  for (const char* split : {"train", "test"})
    for (int label = 0; label < 2; ++label)
      for (int i = 0; i < (std::string(split) == "train" ? 8 : 4); ++i, ++k) {
        const int h = 20 + (k * 7) % 30, w = 24 + (k * 11) % 40;
        std::vector<uint8_t> px(static_cast<std::size_t>(3) * h * w);
        for (std::size_t j = 0; j < px.size(); ++j) px[j] = static_cast<uint8_t>((j * (label + 3) + k) % 251);
        const auto bytes = encode_jpeg(px.data(), 3, h, w, 90);
        const fs::path p = fs::path(root) / split / ("c" + std::to_string(label)) / (std::to_string(k) + ".jpg");
        fs::create_directories(p.parent_path());
        std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
      }
  TrainConfig c = test::synthetic_config("smallcnn", 0, 0, 16, 4);
  c.dataset = "stream-folder";
  c.data = root;
  c.image_size = 16;
  c.resize = 18;
  c.augment = true;
  c.epochs = 1;
  c.deterministic_init = c.deterministic_input = true;
  fs::remove_all(scratch("stream_run"));
  c.out = scratch("stream_run");
  const auto a = train(c);
  c.out.clear();
  c.loader_threads = 3;
  CHECK(train(c).weights_fingerprint == a.weights_fingerprint);  // any number of loader threads
  CHECK(a.predictions.size() == 8);
  const auto m = manifest_of(scratch("stream_run"));
  CHECK(m["data"]["streamed"].get<std::string>().find("RandomResizedCrop(16") != std::string::npos);
  CHECK(m["flags"]["--image-size"] == "16");
  CHECK(m["data"]["normalization"]["mean"][0] == Approx(0.485));
}

TEST_CASE("flags: --gpus is the data-parallel rank count in ditto-train, --dp-gpus where --gpus means replicas") {
  auto parse = [](unsigned groups, std::vector<std::string> args) {
    CLI::App app;
    TrainConfig c;
    TrainFlags f;
    add_train_flags(app, c, f, groups);
    std::reverse(args.begin(), args.end());
    app.parse(args);
    return c;
  };
  const TrainConfig a = parse(kFlagsAll, {"--gpus", "4", "--dp-groups", "8", "--batchnorm", "sync", "--bucket-mb", "5"});
  CHECK(a.gpus == 4);
  CHECK(a.dp_groups == 8);
  CHECK(a.batchnorm == "sync");
  CHECK(a.bucket_mb == 5);
  CHECK(a.data_parallel());
  CHECK(parse(kFlagsAll, {"--dp-gpus", "2"}).gpus == 2);
  CHECK(parse(kFlagsDataParallel, {"--dp-gpus", "3"}).gpus == 3);
  CHECK_THROWS(parse(kFlagsDataParallel, {"--gpus", "3"}));  // left to the front end's own --gpus
  CHECK_THROWS(parse(kFlagsAll, {"--gpus", "0"}));
  CHECK_FALSE(parse(kFlagsAll, {}).data_parallel());
  // Ranks as processes: ditto-train's flags; a front end without the group refuses them.
  const TrainConfig p = parse(kFlagsAll, {"--dp-launch", "slurm", "--dp-timeout", "30"});
  CHECK(p.dp_launch == "slurm");
  CHECK(p.dp_timeout == 30);
  CHECK(p.data_parallel());
  CHECK_THROWS(parse(kFlagsAll, {"--dp-launch", "mpi"}));
  CHECK_THROWS(parse(kFlagsAll & ~unsigned(kFlagsDpProcesses), {"--dp-launch", "slurm"}));
  const TrainConfig s = parse(kFlagsAll, {"--dataset", "stream-folder", "--image-size", "160", "--resize", "182"});
  CHECK(s.image_size == 160);
  CHECK(s.resize == 182);
}
