#include "backends/calibration_setup.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <utility>

#include "attention/v1/attention.pb.h"
#include "backends/calibration_runner.h"
#include "backends/cudnn_warmup.h"
#include "version.h"

namespace attn {

Status SetUpAutoCalibration(const ServerConfig& config, BuiltBackends* built) {
  // A bad --cudnn-warmup is a startup error in every build (not only where cuDNN is used).
  auto warm = ParseCudnnWarmup(config.cudnn_warmup);
  if (!warm.ok()) return warm.status();
  if (!config.calibrate && config.calibration_file.empty()) return Status::Ok();
  int candidates = 0;
  for (Backend* b : built->registry->All()) {
    if (b->available() && b->name() != "cpu") ++candidates;
  }
  if (candidates < 2) {
    spdlog::info(
        "auto: {} GPU backend(s) available, nothing to choose between: calibration "
        "skipped, static order kept",
        candidates);
    return Status::Ok();
  }
  const std::string key =
      CalibrationDeviceKey(built->facts.device_name, built->facts.cuda_driver_version, kAttnBuild);
  if (!config.calibrate) {
    auto t = LoadCalibration(config.calibration_file, key);
    if (!t.ok()) {
      spdlog::warn("auto keeps its static order: {}", t.status().message());
      return Status::Ok();
    }
    spdlog::info("auto: calibration table loaded from {} ({} buckets)", config.calibration_file,
                 t->choice.size());
    built->registry->SetCalibration(std::make_shared<CalibrationTable>(std::move(*t)));
    return Status::Ok();
  }
  CalibrationOptions opt;
  opt.reps = config.calibration_reps;
  spdlog::info("auto: calibrating {} buckets (--calibration-reps={})", GridShapes(opt.grid).size(),
               opt.reps);
  auto t = RunCalibration(built->registry->All(), opt, key);
  if (!t.ok()) return t.status();
  if (!config.calibration_file.empty()) {
    Status s = SaveCalibration(config.calibration_file, *t);
    if (!s.ok()) spdlog::warn("calibration not saved: {}", s.message());
  }
  built->registry->SetCalibration(std::make_shared<CalibrationTable>(std::move(*t)));
  return Status::Ok();
}

void FillCalibrationInfo(const CalibrationTable* t, attention::v1::GetServerInfoResponse* r) {
  if (t == nullptr) return;
  for (const auto& [bucket, samples] : t->samples) {
    auto* e = r->add_auto_calibration();
    e->set_bucket(bucket);
    auto c = t->choice.find(bucket);
    if (c != t->choice.end()) e->set_backend(c->second);
    for (const CalibrationSample& s : samples) {
      auto* p = e->add_samples();
      p->set_backend(s.backend);
      p->set_parity_ok(s.parity_ok);
      p->set_median_us(s.median_us);
      p->set_note(s.note);
    }
  }
}

}  // namespace attn
