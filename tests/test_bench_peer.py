"""`bench/throughput.py`'s peer: Hugging Face's DistilBERT distiller step, re-typed, as the memory and speed reference.

Its loss is the triple loss biodistil's objective computes (2·MLM + 5·T²·KL + cosine): the same number from two
independent codings, at every position and at the masked ones."""

from functools import partial

import pytest
import torch

from biodistil.data.batch import AsBatch
from biodistil.data.masking import StaticMaskedBlocks, collate_masked_blocks
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.models.student import student_from_teacher_layers
from biodistil.teachers.signal import OnlineTeacher

TINY = ["--teacher-layers", "2", "--hidden", "32", "--heads", "2", "--vocab", "300", "--seq", "16", "--batch", "4",
        "--repeats", "1", "--warmup", "0", "--compile", "false", "--device", "cpu"]


@pytest.fixture
def throughput(bench_script):
    return bench_script("throughput")


@pytest.mark.parametrize("positions", ["all", "masked"])
def test_the_peer_step_computes_the_triple_loss_biodistil_computes(throughput, positions):
    args = throughput.parse(TINY)
    teacher = throughput.bench_teacher(args).eval()
    student = student_from_teacher_layers(teacher).eval()  # no dropout: both sides see the same activations
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a student unlike its teacher: a KL and a cosine well above zero
        for param in student.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=generator))
    blocks, vocab = throughput.blocks_and_vocab(args)
    batch = AsBatch(partial(collate_masked_blocks, pad_id=0))(
        [StaticMaskedBlocks(blocks, vocab, throughput.MASKING)[i] for i in range(args.batch)])
    assert (batch.labels != -100).any() and (batch.labels == -100).any()
    peer, _ = throughput.PeerStep(student, teacher, positions)(batch)
    objective = Objective(throughput.objective_config(positions), student, teacher)
    ours, logs = MaskedLMModule(student, objective, OnlineTeacher(teacher))(batch)
    assert float(logs["loss_logit_kl"]) > 0.01 and float(logs["loss_hidden_cosine"]) > 0.01
    assert float(peer.detach()) == pytest.approx(float(ours.detach()), rel=1e-4)


@pytest.mark.slow
def test_the_bench_runs_the_peer_beside_biodistil(throughput):
    result = throughput.measure(throughput.parse([*TINY, "--modes", "mlm", "live-all", "peer-all", "peer-masked"]))
    assert set(result["tokens_per_s"]) == {"mlm", "live-all", "peer-all", "peer-masked"}
    assert all(result["peak_memory_mb"][mode] > 0 for mode in result["tokens_per_s"])
    peer_only = throughput.measure(throughput.parse([*TINY, "--only", "peer-all"]))
    assert peer_only["teacher"].endswith("float32") and peer_only["compile"].startswith("nothing")
    assert peer_only["process_max_rss_mb"] > 0
    assert len(peer_only["rss_after_round_mb"]) == 1 and peer_only["rss_growth_mb_per_round"] == 0.0


def test_the_bench_reports_the_process_rss_growth_per_round(throughput):
    grown = throughput.rss_growth([100 * 2**20, 112 * 2**20, 121 * 2**20, 136 * 2**20])
    assert grown["rss_after_round_mb"] == [100, 112, 121, 136]
    assert grown["rss_growth_mb_per_round"] == pytest.approx(11.7, abs=0.01)  # slope: (3·136 + 121 − 112 − 3·100) / 10
    assert throughput.rss_growth([5 * 2**20] * 3)["rss_growth_mb_per_round"] == 0.0
