import pytest
import torch

from actzip.errors import ConfigError
from actzip.core.lr_schedule import lr_factor, lr_scheduler


def test_cosine_warms_up_then_decays_to_a_tenth_and_stays_there():
    f = [lr_factor("cosine", s, 100) for s in range(130)]
    assert f[0] == pytest.approx(0.2 * 1.0, rel=1e-3) and f[4] == pytest.approx(1.0, rel=1e-2)  # 5 warm-up steps
    assert all(a >= b for a, b in zip(f[4:], f[5:]))  # then it only falls
    assert f[50] == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-6) and f[100:] == [pytest.approx(0.1)] * 30
    assert [lr_factor("constant", s, None) for s in (0, 10**6)] == [1.0, 1.0]


def test_the_scheduler_sets_the_optimizer_rate_and_bad_settings_name_their_owner():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=1e-3)
    sched = lr_scheduler(opt, "cosine", 40)
    rates = []
    for _ in range(41):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[0] == pytest.approx(1e-3 * lr_factor("cosine", 0, 40)) and rates[40] == pytest.approx(1e-4)
    with pytest.raises(ConfigError, match="bench x.*lr_schedule"):
        lr_scheduler(opt, "linear", 10, "bench x")
    with pytest.raises(ConfigError, match="length"):
        lr_scheduler(opt, "cosine", None)
