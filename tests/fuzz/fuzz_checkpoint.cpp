// What --resume reads from a run folder: the checkpoint (safetensors with the trainer's metadata:
// epoch, steps, seeds, fingerprints), the manifest and log.csv, checked against each other
// (experiments/run_dir.h read_resume_point), then compared with a configuration as a resume does.
// The input is three files separated by "\n--ditto-fuzz--\n": checkpoint, manifest, log.
#include <algorithm>

#include "experiments/run_dir.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch() / "run";
  const auto parts = fuzz::split(data, size, 3);
  fuzz::write(dir / "checkpoint.safetensors", parts[0]);
  fuzz::write(dir / "manifest.json", parts[1]);
  fuzz::write(dir / "log.csv", parts[2]);
  fuzz::expect_success_or_error([&] {
    const ditto::ResumePoint r = ditto::read_resume_point(dir.string());
    ditto::TrainConfig c;
    c.epochs = std::min(r.meta.epoch, 1000) + 1;  // a resume asks for more epochs than were done
    ditto::check_resume_flags(r, c);
    ditto::check_resume_schedule(r, c, 3);
  });
  return 0;
}
