"""PlannedGRPOMixin on TRL's GRPOTrainer: zero-advantage rows dropped with the full batch's gradient; the policy
planned at the first actor update."""

import copy
import warnings

import pytest
import torch

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("scipy")

from actzip.memory.planner import PlannerConfig, plan_of  # noqa: E402
from actzip.rl import PlannedGRPOMixin  # noqa: E402


class Trainer(PlannedGRPOMixin, trl.GRPOTrainer):
    pass


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    hf.padding_side = "left"
    return hf


def _model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=14, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   pad_token_id=0, eos_token_id=1, bos_token_id=1, hidden_act="relu2")
    return transformers.LlamaForCausalLM(cfg)


def _trainer(cls, model, loss_type="grpo", **kw):
    pairs = [(1, 2), (3, 4), (5, 6), (7, 8)] * 2
    ds = datasets.Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]})

    def reward(completions, answer, **_):
        return [float(c.strip().startswith(a)) for c, a in zip(completions, answer)]

    args = trl.GRPOConfig(output_dir="/tmp/actzip-grpo-test", max_steps=2, per_device_train_batch_size=4,
                          num_generations=4, max_completion_length=4, report_to=[], use_cpu=True, save_strategy="no",
                          loss_type=loss_type, logging_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=_tokenizer(), **kw)


def _inputs(batch=8, length=5):
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    advantages = torch.randn(batch, generator=g)
    advantages[:4] = 0.0  # the first group's rewards were all equal
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return {"prompt_ids": torch.randint(2, 14, (batch, 4), generator=g), "prompt_mask": torch.ones(batch, 4).long(),
            "completion_ids": torch.randint(2, 14, (batch, length), generator=g), "completion_mask": mask,
            "advantages": advantages, "num_items_in_batch": mask.sum().float()}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_dropping_zero_advantage_rows_keeps_the_gradient(loss_type):
    plain_model, model = _model(), _model()
    plain = _trainer(trl.GRPOTrainer, plain_model, loss_type)
    ours = _trainer(Trainer, model, loss_type)
    inputs = _inputs()
    grads = []
    for t, m in ((plain, plain_model), (ours, model)):
        m.train()
        t.current_gradient_accumulation_steps = 1  # set by training_step in a real update
        loss = t._compute_loss(m, dict(inputs))
        loss.backward()
        grads.append([p.grad for p in m.parameters()])
    assert ours.actzip_dropped_rows == 4
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_rows_are_kept_when_a_kl_penalty_gives_them_a_gradient():
    model = _model()
    t = _trainer(Trainer, model, "grpo")
    t.beta = 0.1
    with pytest.warns(UserWarning, match="KL penalty"):
        assert not t._actzip_droppable()


def test_the_policy_is_planned_at_the_first_update_and_trains():
    model = _model()
    t = _trainer(Trainer, model, "dapo", actzip_planner=PlannerConfig(budget_bytes=1 << 30, repeats=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.train()
    assert t.actzip_report is not None and len(t.actzip_report.swapped) == 2  # the two decoder layers
    plan = plan_of(model)
    # without a risk budget only the lossless options are open
    assert set(plan.options_for(plan.probe_tokens)) <= {"keep", "checkpoint", "lossless"}
    assert t.state.global_step == 2
    assert t._actzip_probe_exposure is not None and plan_of(model).chosen  # each update's exposure was handed on
