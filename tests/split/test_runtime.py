"""Split learning over the wire transport (actzip.split.runtime): in one process on loopback and on gloo ranks,
the same gradients as the one-process simulation, ModalShare's ratios reaching the client, metered bytes, SplitFed
averaging, mismatched configs refused on both ends."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.errors import ConfigError, WireConfigMismatchError
from actzip.split.runtime import SplitClient, SplitConfig, SplitServer, fed_average
from actzip.split.uplink import send
from actzip.wire.backends import LoopbackHub
from actzip.wire.transport import Transport

from gloo_ranks import run_ranks

DIMS, SIZES, CLASSES = (24, 6, 24), (16, 8, 16), 4


def data(seed, n=64):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    xs = [torch.randn(n, d, generator=g) for d in DIMS]
    xs[1][:, :CLASSES] += 3 * F.one_hot(y, CLASSES)  # the small modality carries the class
    return xs, y


def encoders(seed):
    torch.manual_seed(seed)
    return nn.ModuleList(nn.Sequential(nn.Linear(d, s), nn.ReLU()) for d, s in zip(DIMS, SIZES))


def head(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(sum(SIZES), 32), nn.ReLU(), nn.Linear(32, CLASSES))


def loopback(cfg, n_clients=1):
    hub = LoopbackHub()
    server_t = Transport(hub.backend(0), 0)
    model = head()
    server = SplitServer(model, server_t, list(range(1, n_clients + 1)), cfg, torch.optim.SGD(model.parameters(), 0.1))
    clients = []
    for r in range(1, n_clients + 1):
        enc = encoders(r)
        clients.append(SplitClient(enc, Transport(hub.backend(r), r), 0, cfg, torch.optim.SGD(enc.parameters(), 0.1)))
    server.check()
    for c in clients:
        c.check()
    return server, clients


@pytest.mark.parametrize("compressor", ["random", "topk", "dct", "quant"])
def test_one_step_gives_the_simulation_s_gradients(compressor):
    cfg = SplitConfig(SIZES, compressor=compressor, compression=2.0)
    server, (client,) = loopback(cfg)
    xs, y = data(0)
    # the simulation: the same encoders, head and seeds, the link in one autograd graph
    enc, model = encoders(1), head()
    acts = [e(x) for e, x in zip(enc, xs)]
    views = [send(a, r, compressor, seed=cfg.link(i, r, 1, 0).seed).view
             for i, (a, r) in enumerate(zip(acts, cfg.equal_ratios()))]
    F.cross_entropy(model(torch.cat(views, 1)), y).backward()
    client.forward(xs, y)
    server.serve(1)
    client.backward()
    # the gradients each end stepped with (optimizers leave them in .grad) are the simulation's, bit for bit
    for p, q in zip(client.encoders.parameters(), enc.parameters()):
        assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)
    for p, q in zip(server.model.parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("compressor", ["random", "topk", "dct"])
def test_clients_served_in_parallel_give_the_simulation_s_gradients_on_their_joint_batch(compressor):
    cfg = SplitConfig(SIZES, compressor=compressor, compression=2.0)
    server, clients = loopback(cfg, n_clients=2)
    batches = [data(10), data(11)]
    # the simulation: each client's link as it would send it, one loss over both batches together
    encs, model = [encoders(1), encoders(2)], head()
    views, ys = [[] for _ in SIZES], []
    for rank, (enc, (xs, y)) in enumerate(zip(encs, batches), start=1):
        for i, (e, x, r) in enumerate(zip(enc, xs, cfg.equal_ratios())):
            views[i].append(send(e(x), r, compressor, seed=cfg.link(i, r, rank, 0).seed).view)
        ys.append(y)
    F.cross_entropy(model(torch.cat([torch.cat(v) for v in views], 1)), torch.cat(ys)).backward()
    for c, (xs, y) in zip(clients, batches):
        c.forward(xs, y)
    server.serve_parallel()
    for c in clients:
        c.backward()
    for p, q in zip(server.model.parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad)  # one update on the joint batch
    for c, enc in zip(clients, encs):
        for p, q in zip(c.encoders.parameters(), enc.parameters()):
            assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)


def test_training_in_turn_meters_bytes_on_both_ends_and_modalshare_ratios_reach_the_clients():
    cfg = SplitConfig(SIZES, compressor="random", compression=4.0, policy="modalshare", refresh=10)
    server, clients = loopback(cfg, n_clients=2)
    losses = []
    for step in range(40):
        for c in clients:
            xs, y = data(100 * step + c.transport.rank)
            c.forward(xs, y)
            losses.append(server.serve(c.transport.rank))
            c.backward()
    assert sum(losses[-10:]) < sum(losses[:10])
    assert len(server.history) == 8 and all(c.ratios == server.ratios[c.transport.rank] for c in clients)
    assert all(c.ratios[1] > cfg.equal_ratios()[1] for c in clients)  # the small useful modality gets more
    sent = [c.transport.meter.total("sent", "fwd") for c in clients]
    assert sum(sent) == server.transport.meter.total("received", "fwd")  # every byte, counted at both ends
    budget = 64 * sum(SIZES) * 2 / cfg.compression  # bytes of values a step
    # values at about the budget, the int64 labels, a header and (now and then) a schema a step
    assert all(budget * 40 < s < (1.2 * budget + 64 * 8 + 48 + 200) * 40 for s in sent)


def test_heldout_scoring_batches_set_the_ratios_and_train_nothing():
    cfg = SplitConfig(SIZES, compressor="random", compression=4.0, policy="modalshare", score_on="heldout",
                      refresh=5)
    server, (client,) = loopback(cfg)
    held_xs, held_y = data(999)  # samples the client never trains on
    for step in range(20):
        if (step + 1) % cfg.refresh == 0:
            before = [p.detach().clone() for p in [*server.model.parameters(), *client.encoders.parameters()]]
            client.forward(held_xs, held_y, scoring=True)
            server.serve(1)
            client.backward()
            after = [*server.model.parameters(), *client.encoders.parameters()]
            assert all(torch.equal(a, b) for a, b in zip(after, before))  # scored, not trained on
            assert client.ratios == server.ratios[1] and server.history[-1]["step"] == step + 1
            continue
        xs, y = data(step)
        client.forward(xs, y)
        server.serve(1)
        client.backward()
    assert len(server.history) == 4  # only the scoring batches were scored
    assert client.ratios[1] > cfg.equal_ratios()[1]  # the small useful modality gets more
    plain = SplitConfig(SIZES, compressor="random", compression=4.0, policy="modalshare")
    _, (other,) = loopback(plain)
    with pytest.raises(ConfigError, match="score_on='heldout'"):
        other.forward(held_xs, held_y, scoring=True)
    with pytest.raises(ConfigError, match="score_on"):
        SplitConfig(SIZES, score_on="test")


def test_a_scoring_batch_served_in_parallel_is_left_out_of_the_joint_update():
    cfg = SplitConfig(SIZES, compressor="topk", compression=4.0, policy="modalshare", score_on="heldout")
    server, (scorer, trainer) = loopback(cfg, n_clients=2)
    frozen = [p.detach().clone() for p in scorer.encoders.parameters()]
    moving = [p.detach().clone() for p in trainer.encoders.parameters()]
    scorer.forward(*data(1), scoring=True)
    trainer.forward(*data(2))
    server.serve_parallel()
    scorer.backward()
    trainer.backward()
    assert all(torch.equal(p, q) for p, q in zip(scorer.encoders.parameters(), frozen))
    assert not all(torch.equal(p, q) for p, q in zip(trainer.encoders.parameters(), moving))
    assert [h["client"] for h in server.history] == [1]


def test_fed_average_in_one_process():
    a, b = encoders(1), encoders(2)
    nbytes = fed_average([a, b])
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert nbytes == sum(p.numel() * 4 for p in a.parameters())


def test_a_client_built_with_other_settings_is_refused_on_both_ends():
    hub = LoopbackHub()
    model = head()
    server = SplitServer(model, Transport(hub.backend(0), 0), [1], SplitConfig(SIZES, compression=4.0),
                         torch.optim.SGD(model.parameters(), 0.1))
    enc = encoders(1)
    client = SplitClient(enc, Transport(hub.backend(1), 1), 0, SplitConfig(SIZES, compression=2.0),
                         torch.optim.SGD(enc.parameters(), 0.1))
    for end in (server, client):
        with pytest.raises(WireConfigMismatchError, match="compression"):
            end.check()
    hub = LoopbackHub()  # the codes' rounding too: the ends would read each other's codes with another rule
    server = SplitServer(model, Transport(hub.backend(0), 0), [1], SplitConfig(SIZES, compressor="dct"),
                         torch.optim.SGD(model.parameters(), 0.1))
    client = SplitClient(enc, Transport(hub.backend(1), 1), 0, SplitConfig(SIZES, compressor="dct", rounding="nearest"),
                         torch.optim.SGD(enc.parameters(), 0.1))
    for end in (server, client):
        with pytest.raises(WireConfigMismatchError, match="rounding"):
            end.check()


def _ranks(rank, world):
    import torch.distributed as dist

    from actzip.wire.backends import DistBackend

    cfg = SplitConfig(SIZES, compressor="topk", compression=4.0)
    transport = Transport(DistBackend(), rank, timeout_s=20)
    clients = dist.new_group([1, 2])
    if rank == 0:
        model = head()
        server = SplitServer(model, transport, [1, 2], cfg, torch.optim.SGD(model.parameters(), 0.1))
        server.check()
        losses = [sum(server.step(parallel=i % 2 == 1)) for i in range(30)]  # in turn and in parallel, alternately
        server.finish()
        return losses[0], losses[-2], transport.meter.total("received", "fwd")
    enc = encoders(rank)
    client = SplitClient(enc, transport, 0, cfg, torch.optim.SGD(enc.parameters(), 0.1))
    client.check()
    for step in range(30):
        xs, y = data(100 * step + rank)
        client.step(xs, y)
    fed_average(enc, group=clients)
    return [p.sum().item() for p in enc.parameters()], transport.meter.total("sent", "fwd")


def test_a_server_and_two_clients_on_gloo_ranks_train_and_average():
    reports = run_ranks(_ranks, 3, timeout_s=30, deadline_s=90)
    assert all(r[0] == "ok" for r in reports), reports
    first, last, received = reports[0][1]
    assert last < first
    (p1, sent1), (p2, sent2) = reports[1][1], reports[2][1]
    assert p1 == p2  # the clients' encoders after SplitFed's averaging
    assert received == sent1 + sent2  # every byte the clients sent, and no other


def _client_dies(rank, world):
    import os

    from actzip.wire.backends import DistBackend

    cfg = SplitConfig(SIZES, compression=2.0)
    transport = Transport(DistBackend(), rank, timeout_s=5)
    if rank == 0:
        model = head()
        server = SplitServer(model, transport, [1], cfg, torch.optim.SGD(model.parameters(), 0.1))
        server.check()
        server.step()
        return "served"
    enc = encoders(rank)
    SplitClient(enc, transport, 0, cfg, torch.optim.SGD(enc.parameters(), 0.1)).check()
    os._exit(3)  # gone before its first batch


def test_a_client_that_disconnects_is_an_error_on_the_server_in_bounded_time():
    reports = run_ranks(_client_dies, 2, timeout_s=10, deadline_s=40)
    assert reports[0][0] == "error" and reports[0][1] in ("WirePeerError", "WireTimeoutError"), reports[0]
    assert reports[0][-1] < 15  # seconds
    assert reports[1][0] == "exited"


def test_scoring_at_equal_shares_sends_and_reads_the_scoring_batch_at_the_equal_ratios():
    cfg = SplitConfig(SIZES, compressor="topk", compression=4.0, policy="modalshare", score_on="heldout",
                      score_at="equal", refresh=5)
    server, (client,) = loopback(cfg)
    seen = []
    real = cfg.link

    def link(modality, ratio, client_rank, step):
        seen.append((step, modality, ratio))
        return real(modality, ratio, client_rank, step)

    cfg.link = link  # both ends hold this config: every link either end builds goes through here
    client.ratios = server.ratios[1] = [0.05, 0.9, 0.05]  # a low share for modalities 0 and 2, as ModalShare may set
    client.forward(*data(0), scoring=True)
    server.serve(1)
    client.backward()
    equal = cfg.equal_ratios()
    assert [r for s, _, r in seen if s == 0] == equal * 2  # the client's links, then the server's: equal ones
    assert client.ratios == server.ratios[1] and client.ratios != equal  # the scores set new ratios
    client.forward(*data(1))  # a training batch goes at the ratios set
    assert [r for s, _, r in seen if s == 1] == client.ratios
    with pytest.raises(ConfigError, match="score_at"):
        SplitConfig(SIZES, policy="modalshare", score_at="equal")  # only with score_on="heldout"
    with pytest.raises(ConfigError, match="score_at"):
        SplitConfig(SIZES, policy="modalshare", score_on="heldout", score_at="best")


def test_raised_scoring_ratios_lift_every_modality_to_its_equal_share_and_keep_the_payload():
    from actzip.split.runtime import scoring_ratios

    sizes, budget = (256, 8, 32, 32), 328 / 20
    current = [0.005, 1.0, 0.05, 0.05]
    raised = scoring_ratios("raised", current, sizes, budget)
    equal = scoring_ratios("equal", current, sizes, budget)
    assert sum(r * s for r, s in zip(raised, sizes)) == pytest.approx(budget)
    assert raised[0] / raised[2] == pytest.approx(1.0)  # the starved one now at the others' share
    assert raised[1] > 10 * equal[1]  # the one ModalShare favours stays favoured
    assert scoring_ratios("current", current, sizes, budget) == current


def test_both_ends_build_their_links_with_the_config_s_rounding():
    cfg = SplitConfig(SIZES, compressor="dct", compression=5.0, rounding="nearest")
    assert cfg.link(0, 0.2, 1, 3).rounding == "nearest"
    assert SplitConfig(SIZES, compressor="dct").link(0, 0.2, 1, 3).rounding == "stochastic"
    with pytest.raises(ConfigError, match="rounding"):
        SplitConfig(SIZES, compressor="dct", rounding="up")


def test_both_ends_build_their_links_with_the_config_s_levels():
    assert SplitConfig(SIZES, compressor="dct", levels="fitted").link(0, 0.2, 1, 3).levels == "fitted"
    assert SplitConfig(SIZES, compressor="dct").link(0, 0.2, 1, 3).levels == "uniform"
    with pytest.raises(ConfigError, match="levels"):
        SplitConfig(SIZES, compressor="random", levels="fitted")
