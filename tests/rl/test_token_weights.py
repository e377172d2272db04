"""token_weights against autograd through TRL's own GRPO loss (GRPOTrainer._compute_loss) on random batches."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from actzip.errors import ConfigError, InvalidValueError
from actzip.rl import LOSS_TYPES, nonzero_rows, token_weights

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


class _Accelerator:
    num_processes = 2
    sync_gradients = True

    @staticmethod
    def reduce(t, reduction="sum"):
        return t

    @staticmethod
    def gather(t):
        return t

    gather_for_metrics = gather


def _trainer(loss_type, logps, max_completion_length, accumulation):
    """The attributes GRPOTrainer._compute_loss reads, for one on-policy pass (old_logp = logp.detach())."""
    entropies = torch.zeros_like(logps)
    return SimpleNamespace(
        loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=0.0, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level="token", use_vllm=False,
        vllm_importance_sampling_correction=False, aux_loss_enabled=False, _entropy_bonus_enabled=False,
        max_completion_length=max_completion_length, current_gradient_accumulation_steps=accumulation,
        args=SimpleNamespace(delta=None, steps_per_generation=accumulation),
        accelerator=_Accelerator(), model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, entropies, None),
    )


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("accumulation", [1, 4])
def test_weights_are_the_gradient_of_trls_loss(loss_type, seed, accumulation):
    g = torch.Generator().manual_seed(seed)
    batch, length = 8, 13
    lengths = torch.randint(0, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    advantages = torch.randn(batch, generator=g)
    advantages[:2] = 0.0  # a group whose rewards were all equal
    logps = (-torch.rand(batch, length, generator=g) * 3).requires_grad_()
    items = int(mask.sum()) * 2  # the generation batch, over 2 processes
    inputs = {"prompt_ids": torch.zeros(batch, 3, dtype=torch.long), "prompt_mask": torch.ones(batch, 3),
              "completion_ids": torch.zeros(batch, length, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "num_items_in_batch": torch.tensor(float(items))}
    trainer = _trainer(loss_type, logps, 16, accumulation)
    loss = trl_grpo.GRPOTrainer._compute_loss(trainer, None, inputs)
    (grad,) = torch.autograd.grad(loss, logps)
    want = token_weights(advantages, mask, loss_type, max_completion_length=16, num_items_in_batch=items,
                         num_processes=2, gradient_accumulation_steps=accumulation)
    torch.testing.assert_close(want, grad, rtol=1e-6, atol=1e-9)
    assert torch.equal(nonzero_rows(want), (advantages != 0) & (lengths > 0))


def test_bad_input_is_named():
    mask = torch.ones(2, 3)
    with pytest.raises(ConfigError, match="loss_type 'sapo'"):
        token_weights(torch.zeros(2), mask, "sapo")
    with pytest.raises(ConfigError, match="max_completion_length"):
        token_weights(torch.zeros(2), mask, "dr_grpo")
    with pytest.raises(ConfigError, match="num_items_in_batch"):
        token_weights(torch.zeros(2), mask, "dapo")
    with pytest.raises(InvalidValueError, match="advantages of shape"):
        token_weights(torch.zeros(3), mask, "grpo")
    with pytest.raises(InvalidValueError, match="completion_mask"):
        token_weights(torch.zeros(2), torch.ones(6), "grpo")
