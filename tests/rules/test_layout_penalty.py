"""CA401 layout-penalty: FP32 256^3 batch 8 in tn on the H100 (reports/h100/layouts/...-layouts)
takes 1.36x its nt time on the same kernel; bf16 1024x1024x140 batch 8 in nn
(reports/h100/checks/20261125-092057-k140-layouts) runs about 2.1x slower than in nt."""

from __future__ import annotations

from cublas_audit.judge.noise import NoiseModel
from tests.conftest import ZERO_NOISE
from tests.rules.recorded import case_ids, dataset, judged

LAYOUTS = "h100/layouts/20261123-225609-layouts"
K140 = "h100/checks/20261125-092057-k140-layouts"


def test_the_slow_layout_against_the_best() -> None:
    found = judged(dataset(LAYOUTS), "layout-penalty")
    assert sorted((f.api, f.sizes[0], f.severity) for f in found) == [
        ("cublas", "256 tn", "medium"),
        ("cublasLt", "256 tn", "medium"),
    ]
    cublas = next(f for f in found if f.api == "cublas")
    assert cublas.message.startswith("In layout tn the call takes 1.36x the time of layout nt")
    assert case_ids(dataset(LAYOUTS), cublas, "compared") == ["cublas.fp32.256x256x256.b8.nt"]
    assert round(cublas.effect, 3) == 0.262


def test_high_from_high_ratio_times_the_penalty_ratio() -> None:
    found = judged(dataset(K140), "layout-penalty")
    assert sorted((f.api, f.severity) for f in found) == [("cublas", "high"), ("cublasLt", "high")]
    # 1.36x is below layout_penalty_ratio 1.4: no finding on the FP32 run
    assert judged(dataset(LAYOUTS), "layout-penalty", layout_penalty_ratio=1.4) == []


def test_the_noise_model_the_audit_is_given_judges_the_pair() -> None:
    """1.36x on one kernel is beyond the shipped model's floor; a model (a map's, say) whose
    floor is 40 % at every time leaves it within noise, and one without noise keeps it. The rule
    used the shipped model whatever it was given."""
    wide = NoiseModel((float("inf"),), (0.4,), {"device": "a floor of 40 % at every time"})
    assert judged(dataset(LAYOUTS), "layout-penalty", ZERO_NOISE)
    assert judged(dataset(LAYOUTS), "layout-penalty", wide) == []
