// Every network's bits, pinned: the parameter and buffer names and shapes, the knob layers (in
// order), the initial weights (Philox streams keyed by name), and one CPU training step's forward
// and backward — logits, loss, every gradient, the batch-norm running statistics after it — and
// one evaluation forward. The values were recorded before the seven nets of nets/nets.cpp moved
// onto the ZooNet builder and must not change: a refactor of how nets are built that
// moves a bit of any of them is a different network (only smallcnn-bn's knob order changed: see
// its row). A deliberate change (a new init rule, a renamed layer) updates the table and says
// why. DITTO_PRINT_FINGERPRINTS=1 prints the rows instead of checking them.
//
// Inputs are small (the CPU reference convolution is loops in double): each model runs at the
// smallest side its layers document that keeps every batch norm above one value per channel.
// VGG takes only 224..255 a side, and the deeper models take seconds each on the 2-core CI host,
// so their steps (and VGG-19 / VGG-16-BN altogether) are in the hidden test "[.fingerprint-slow]";
// run it with `cpu_net_fingerprints "[.fingerprint-slow]"` (about 2 CPU minutes) after touching
// how nets are built.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/context.h"
#include "kernels/loss.h"
#include "nets/nets.h"

using namespace ditto;

namespace {

struct Probe {
  const char* model;
  int classes, channels, side, batch;
};

// A fixed input with no generator behind it (the same bits on every platform): a slow sine.
std::vector<float> probe_input(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(std::sin(0.37 * double(i) + 0.11));
  return v;
}

// The table was pinned with ditto's former tensor hash (FNV-1a over 64-bit words, then the tail
// bytes, over the shape, the dtype's enum value and the bytes). It lives on here so the pinned
// values keep their meaning: this test checks the networks' bits, not the hash that ditto's files
// use now (engine/fingerprint.h). Nothing outside this test trusts it.
uint64_t fnv(const void* data, std::size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t pinned_hash(const Tensor& t) {
  if (!t.defined()) return 0;
  REQUIRE((t.dtype() == DType::F32 || t.dtype() == DType::I32));
  std::vector<float> f;
  std::vector<int32_t> i;
  const void* bytes = nullptr;
  if (t.dtype() == DType::F32) {
    f = t.to_host_f32();
    bytes = f.data();
  } else {
    i = t.to_host_i32();
    bytes = i.data();
  }
  const DType dtype = t.dtype();
  uint64_t h = fnv(t.shape().data(), t.shape().size() * sizeof(int64_t));
  h = fnv(&dtype, sizeof dtype, h);
  return fnv(bytes, static_cast<std::size_t>(t.numel()) * 4, h);
}

// Chains hashes (and strings) in order.
struct Chain {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(uint64_t v) { h = fnv(&v, sizeof v, h); }
  void add(const std::string& s) { h = fnv(s.data(), s.size(), h); }
  std::string hex() const { return hex64(h); }
};

// The knob chain was pinned when op kinds were an enum: each kind enters as its number then, so
// the pinned fingerprints keep their meaning.
std::string kind_str(OpKind k) {
  static const char* const kinds[] = {"conv2d",     "linear",      "maxpool2d",   "batchnorm",
                                      "softmax_xent", "scatter_add", "embedding",   "upsample",
                                      "pixel_xent", "reduce",      "grid_sample", "affine_grid",
                                      "roi_align",  "ctc_loss",    "spmm",        "allreduce"};
  for (int i = 0; i < 16; ++i)
    if (std::string(kinds[i]) == k.name) return std::to_string(i);
  FAIL("op kind " << k.name << " has no number in the pinned knob chain");
  return "";
}

// "structure init" of a freshly built and initialised net.
std::string static_prints(Net& net) {
  Chain structure, knobs, init;
  for (const auto& p : net.params()) structure.add(p.name + shape_str(p.var.value().shape()));
  for (const auto& b : net.buffers()) structure.add(b.name + shape_str(b.tensor->shape()));
  for (const auto& [name, kind] : net.knob_layers()) knobs.add(name + "/" + kind_str(kind));
  for (const auto& p : net.params()) init.add(pinned_hash(p.var.value()));
  for (const auto& b : net.buffers()) init.add(pinned_hash(*b.tensor));
  return fmt::format("params={} structure={} knobs={} init={}", net.param_count(), structure.hex(), knobs.hex(),
                     init.hex());
}

// "logits loss grads buffers eval" of one training step and one evaluation forward.
std::string step_prints(Context& ctx, Net& net, const Probe& p) {
  const Shape xs{p.batch, p.channels, p.side, p.side};
  Tensor x = ctx.from_host(probe_input(std::size_t(shape_numel(xs))), xs);
  std::vector<int32_t> labels(std::size_t(p.batch));
  for (int i = 0; i < p.batch; ++i) labels[std::size_t(i)] = (3 * i + 1) % p.classes;
  net.begin_step(7, 1);
  Var logits = net.forward(ctx, Var(x), true);
  Var loss = softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(labels, {p.batch}));
  ctx.tape().backward(ctx, loss);
  Chain grads, buffers;
  for (const auto& prm : net.params())
    grads.add(prm.var.grad().defined() ? pinned_hash(prm.var.grad()) : uint64_t(0));
  for (const auto& b : net.buffers()) buffers.add(pinned_hash(*b.tensor));
  std::string eval;
  {
    NoGradGuard ng(ctx);
    eval = hex64(pinned_hash(net.forward(ctx, Var(x), false).value()));
  }
  return fmt::format("logits={} loss={} grads={} buffers={} eval={}", hex64(pinned_hash(logits.value())),
                     hex64(pinned_hash(loss.value())), grads.hex(), buffers.hex(), eval);
}

std::string prints_of(const Probe& p, bool step) {
  Context ctx;
  auto net = make_net(ctx, {p.model, p.classes, p.channels});
  net->init(ctx, 42);
  std::string s = static_prints(*net);
  if (step) s += " " + step_prints(ctx, *net, p);
  return s;
}

// The recorded values. "<model>@static" rows are a model's structure and initial weights alone (the
// default tests of the slow models); "<model>" rows add the step.
const std::map<std::string, std::string>& pinned() {
  static const std::map<std::string, std::string> m = {
      {"smallcnn",
       "params=15722 structure=758103907cc874ea knobs=b91dc1e8a9c7940c init=85abad7e093a7880 "
       "logits=375041071cb460ac loss=ed2bc3381d18fb6e grads=7e6bc06fc7f3c0ae "
       "buffers=cbf29ce484222325 eval=375041071cb460ac"},
      // knobs= changed once, on purpose, when SmallCNN moved onto ZooNet: the knob
      // layers are the same, listed in creation order (conv1, bn1, pool1, ...) where the old class
      // listed the batch norms last, after "loss". Every other value is the old class's.
      {"smallcnn-bn",
       "params=15882 structure=6ce5889a2c9012cb knobs=297ee23a08308502 init=8fa82733d1fc29f4 "
       "logits=7b2595775f3ce49c loss=4c7f166189b50652 grads=031d955b02dcaf04 "
       "buffers=326f7bb70b275efc eval=6eda29b2dc07aeb5"},
      {"two-conv",
       "params=5418 structure=fac66d3906cbfc37 knobs=f7c2d57980597729 init=8dbfa22e24386269 "
       "logits=5ec91fbfe1edc11d loss=4b7b76f9b8453832 grads=7685ae474080a16b "
       "buffers=cbf29ce484222325 eval=5ec91fbfe1edc11d"},
      {"resnet18",
       "params=11173962 structure=2544658ee49ccfb9 knobs=75d3434f38538d1c init=874796f302b0a13a "
       "logits=63d26a12f5c760a5 loss=47847ec01830fac6 grads=bbff3613491e683f "
       "buffers=fc18de48b13d78e6 eval=d6e8ed34a241bd00"},
      {"resnet18-imagenet",
       "params=11181642 structure=99da25eae49ccfb9 knobs=2cd3c28d051bc74a init=94c9ffc90bc66b0b "
       "logits=f4664f20ee6207a5 loss=416cc94965c2d635 grads=e8a0b2ec60b527f9 "
       "buffers=841173117c78c4e7 eval=47f3fa8a8ebe1b13"},
      {"mnist-cnn",
       "params=1199882 structure=503779ba388f5863 knobs=e4d35e9ab89eb7e1 init=062e57f9e3a911a1 "
       "logits=58f466f5061be76d loss=5b00c3463888d729 grads=55c66cc6203c2a8d "
       "buffers=cbf29ce484222325 eval=a9d437abac5f7fc9"},
      {"resnet50",
       "params=23522375 structure=f9fdc6006b598ffd knobs=52b4ee832ac308e6 init=69a8ce6703c04a2c "
       "logits=39b668c6c8287fde loss=770ded7080bbfc41 grads=5b5a532df83002f1 "
       "buffers=87cba7270b4e6881 eval=0e175c2d29f26613"},
      {"resnet101",
       "params=42500035 structure=5d1058d2644dc7c0 knobs=c3b7fd0422afef18 init=9f2bf970eb68e331 "
       "logits=fb661088c1ee531e loss=206a9a5ed8f1014c grads=1f1064421a037f0c "
       "buffers=64ba49e9656b139c eval=2d31c7fbd77db813"},
      {"resnet152",
       "params=58152004 structure=312bc737aeb9528d knobs=dd239a86e925c020 init=42f47a423056ab72 "
       "logits=a975c7531e0b8e5a loss=44146000c1df6a0e grads=ded75291a4d92c06 "
       "buffers=e4e4585a8bd4727e eval=f7daa435d458f952"},
      {"mediumcnn-k1",
       "params=182794 structure=2ef8837b373ec9e3 knobs=b0c47d9910ff28df init=df50f658cca0b236 "
       "logits=f2c13e0d9545d14e loss=6a7433eb7bff2f7f grads=29ae61cd06b4f03d "
       "buffers=65fe7916ecd0bb88 eval=70045d4094c38ea4"},
      {"mediumcnn-k3",
       "params=1579914 structure=53dbfffeaecd6955 knobs=b0c47d9910ff28df init=4089ed77c406756e "
       "logits=a87f7f6a66b015d1 loss=ffd23ad342fdb875 grads=8c3e0642886803ed "
       "buffers=a2e9719e626f0d41 eval=8e3760cc070ac7a2"},
      {"mediumcnn-k5",
       "params=4370789 structure=03441c9a64fbde3d knobs=b0c47d9910ff28df init=1ffd574f36d91871 "
       "logits=2cd57fc825d4973c loss=a323b9a37d25e2a6 grads=94883126eea044ae "
       "buffers=9a3cb2029818dac6 eval=55fa817dc8e0f725"},
      {"mediumcnn-k7",
       "params=8565514 structure=167b84ffc23dbfb1 knobs=b0c47d9910ff28df init=310cbd9b88290cb1 "
       "logits=327bca83e7a07f8d loss=70aae145f088cfab grads=63f1b369d628e9dd "
       "buffers=59aa4628ed772bcb eval=63757c42a80cbf9e"},
      {"densenet121",
       "params=6964106 structure=203baa84e0ef50f0 knobs=14164ff21e117b35 init=84ccb3462d173c95 "
       "logits=086f7723b9342bad loss=5e326fa06aab2a57 grads=6075b16e9a30dfd8 "
       "buffers=67c9630397e2c838 eval=3895d81eb69bc669"},
      {"densenet201",
       "params=18102533 structure=869c7a3b89beb514 knobs=f036f25a191e4825 init=7146f12742186d10 "
       "logits=ce5c00637ca168e5 loss=e89be917f8a1359d grads=c679a9823b00f99d "
       "buffers=5e8187ae9d577194 eval=e4676426470e22ce"},
      {"mobilenet-v2",
       "params=2236682 structure=a885ab30e61f7ec3 knobs=73169f849e447a1e init=5760708a3a08c2bd "
       "logits=be2ac71134a6dbfb loss=5811d51d91cc0764 grads=92ed204b11d1b3ab "
       "buffers=628916dee4deaab9 eval=4f7d773c8e203f06"},
      {"efficientnet-b0",
       "params=4020358 structure=e818418ab30660c9 knobs=2f7306bd07b86946 init=66fc2d4586aed237 "
       "logits=c3a91a9dc2182a32 loss=9526c4d218cab247 grads=744308c22ce01fdb "
       "buffers=03c99807be1e9adc eval=ee1eade8013eb9d9"},
      {"resnet101@static",
       "params=42500035 structure=5d1058d2644dc7c0 knobs=c3b7fd0422afef18 init=9f2bf970eb68e331"},
      {"resnet152@static",
       "params=58152004 structure=312bc737aeb9528d knobs=dd239a86e925c020 init=42f47a423056ab72"},
      {"vgg16@static", "params=134301514 structure=d90391b907a48bde knobs=e61848eb8abdec40 init=ce3a6cbdb60ad14e"},
      {"vgg19-bn@static", "params=139621066 structure=6b4009068f690cf7 knobs=9331eb621f3ccdeb init=7bb893452cd12840"},
      {"inception-v3@static",
       "params=21806058 structure=7a57051e10079d20 knobs=5d553de869b1ea6b init=adaa501bd9f32932"},
      {"xception@static", "params=20827442 structure=53e5576a5ef3770d knobs=3d8e3f55dd6212b3 init=c4aae0502bdb6e5c"},
      // Added with the last two models of the overhead list, after the move onto ZooNet.
      {"densenet169",
       "params=12501130 structure=55a4aac09a532978 knobs=03620c2b19043165 init=365a129303b3e2a4 "
       "logits=e06503f101d925ac loss=e38d0692c50b28f2 grads=9621183461ae9ecc "
       "buffers=371f427d1d8b9df3 eval=71053934e1af5042"},
      {"mobilenet",
       "params=3217226 structure=9bd35f8dcd686f44 knobs=27386c11190bf563 init=ec683528a46e9965 "
       "logits=502017c7203ac32e loss=319320c7aa40608e grads=b104b7ed53a61b6d "
       "buffers=ffc455c76e0c91ec eval=35f6a41e2e694657"},
      // Recorded when resnet34 was added, after cpu_zoo_nets checked its structure against
      // torchvision's (count, state_dict names and order, shapes) and its initial weights against
      // resnet50's where the two share a parameter's name and shape.
      {"resnet34",
       "params=21289802 structure=d4c9d35bb86cb413 knobs=b4eb985ebf44cd64 init=bb07d8f44406cb54 "
       "logits=e25a47eb73045cf9 loss=226f4ab1589ed630 grads=31021d6d88362c0c "
       "buffers=209bedff5dc1c17d eval=0c396514d04e03cb"},
      {"vgg16",
       "params=134301514 structure=d90391b907a48bde knobs=e61848eb8abdec40 init=ce3a6cbdb60ad14e "
       "logits=1e9d7ff8842933f4 loss=6910cba98e2974e9 grads=51d32724defa0605 "
       "buffers=cbf29ce484222325 eval=5197dbe345d0a32d"},
      {"vgg19",
       "params=139611210 structure=fda8dc0705ca9215 knobs=4871e4c93ed2e3df init=3b6f369766dd6ba0 "
       "logits=197307d01f2b7384 loss=aeb39d22f2eeef6c grads=82086f21cc398b8c "
       "buffers=cbf29ce484222325 eval=ef48c3970438fc80"},
      {"vgg16-bn",
       "params=134309962 structure=292fb1da488c6531 knobs=7a35aa838b56f66f init=948c1afb8f2e141d "
       "logits=4feab599d6ead785 loss=278ca9a847db585f grads=a5e3e54f8602d55c "
       "buffers=44b3e03019c2c3ec eval=b3413b7d3ccecc97"},
      {"vgg19-bn",
       "params=139621066 structure=6b4009068f690cf7 knobs=9331eb621f3ccdeb init=7bb893452cd12840 "
       "logits=498b29549ec69754 loss=90728fbfba39c94e grads=73493c335c8e7652 "
       "buffers=e0ded83ec101f5bb eval=64eb1bd59c2da29f"},
      {"inception-v3",
       "params=21806058 structure=7a57051e10079d20 knobs=5d553de869b1ea6b init=adaa501bd9f32932 "
       "logits=6de648abd0afc7ba loss=a37cbcf849fe71de grads=711770bc2bdfdfb8 "
       "buffers=49679e05dbd07f6a eval=1e6b2bddd682072a"},
      {"xception",
       "params=20827442 structure=53e5576a5ef3770d knobs=3d8e3f55dd6212b3 init=c4aae0502bdb6e5c "
       "logits=37e8f05601185c98 loss=38427546c8d8fe9b grads=d9d7cf3311d34b9b "
       "buffers=759ee043753b161e eval=c58bf3a47ec462fe"},
  };
  return m;
}

void check_probe(const Probe& p, bool step) {
  const std::string got = prints_of(p, step);
  INFO(p.model << ": " << got);
  // DITTO_PRINT_FINGERPRINTS=1 prints the table's rows instead of checking them.
  if (std::getenv("DITTO_PRINT_FINGERPRINTS")) {
    std::printf("      {\"%s%s\", \"%s\"},\n", p.model, step ? "" : "@static", got.c_str());
    return;
  }
  auto it = pinned().find(std::string(p.model) + (step ? "" : "@static"));
  REQUIRE(it != pinned().end());
  CHECK(got == it->second);
}

// One CPU step by default.
const std::vector<Probe> kFast = {
    {"smallcnn", 10, 3, 16, 2},         {"smallcnn-bn", 10, 3, 16, 2},   {"two-conv", 10, 3, 16, 2},
    {"resnet18", 10, 3, 16, 2},         {"resnet18-imagenet", 10, 3, 32, 2}, {"mnist-cnn", 10, 1, 28, 2},
    {"resnet50", 7, 3, 32, 2},          {"mediumcnn-k1", 10, 3, 64, 2},  {"mediumcnn-k3", 10, 3, 64, 2},
    {"mediumcnn-k5", 5, 1, 64, 2},      {"mediumcnn-k7", 10, 3, 64, 2},  {"densenet121", 10, 3, 32, 2},
    {"densenet201", 5, 3, 32, 2},       {"mobilenet-v2", 10, 3, 32, 2},  {"efficientnet-b0", 10, 3, 32, 2},
    {"densenet169", 10, 3, 32, 2},      {"mobilenet", 10, 3, 32, 2},     {"resnet34", 10, 3, 32, 2},
};
// Structure and initial weights by default, the step in the slow test: the deeper bottleneck
// ResNets (resnet50's code, seconds more), VGG (224x224), Inception-v3 and Xception.
const std::vector<Probe> kLarge = {
    {"resnet101", 3, 1, 32, 2},  {"resnet152", 4, 3, 32, 2},     {"vgg16", 10, 3, 224, 1},
    {"vgg19-bn", 10, 1, 224, 1}, {"inception-v3", 10, 3, 75, 2}, {"xception", 10, 3, 71, 2},
};
// Only in the slow test: VGG's other two variants (the same code as vgg16 and vgg19-bn, and
// seconds of initial weights each).
const std::vector<Probe> kSlowOnly = {
    {"vgg19", 10, 3, 224, 1},
    {"vgg16-bn", 10, 3, 224, 1},
};

}  // namespace

TEST_CASE("net fingerprints: structure, initial weights and one CPU step of every small model") {
  for (const Probe& p : kFast) check_probe(p, true);
}

TEST_CASE("net fingerprints: structure and initial weights of the large models") {
  for (const Probe& p : kLarge) check_probe(p, false);
}

TEST_CASE("net fingerprints: one CPU step of the large models (slow)", "[.fingerprint-slow]") {
  for (const auto* list : {&kLarge, &kSlowOnly})
    for (const Probe& p : *list) check_probe(p, true);
}

TEST_CASE("net fingerprints: every known image classifier is pinned") {
  // The other task kinds' nets (nets/detail/tasks.h) have other losses and inputs; cpu_task_nets checks
  // their structure and that their steps repeat bit for bit.
  for (const auto& m : known_models()) {
    INFO(m);
    if (is_task_model(m)) continue;
    bool probed = false;
    for (const auto* list : {&kFast, &kLarge, &kSlowOnly})
      for (const Probe& p : *list) probed = probed || m == p.model;
    CHECK(probed);
  }
}
