"""The transformers integration through a CUDA IPC region on one GPU (attach(...,
transport_region="cuda" | "auto"); ctest transformers_cuda_ipc_gpu_py, label gpu): a tiny random
Llama (2 layers, hidden 256, 4 heads / 2 kv heads, head dim 64: what the GPU KV cache serves;
float16) in this pytest process on the GPU, the attention-server (--kv-device gpu) a second
process on the same GPU. Checked:
- greedy generate of a left-padded batch through the region gives the bytes path's tokens and
  per-step logits (within 1e-3 of their largest magnitude), every ExtendBatch through the region (stats.region_calls
  == the client's ExtendBatch calls == the server's attn_requests_total delta, byte_calls 0),
  one lease for the attached model, kept across two generate calls and closed at detach
  (attn_shared_memory_regions/_leases back to 0);
- a padded forward pass (tokens gathered with index_select into the region) gives logits
  close to the local model's (sdpa) at every real token (2e-2, argmax 90 %), and the bytes
  path's (1e-3);
- a prefill split by max_call_bytes into many calls goes through the region (the region stays
  sized for the biggest call), and a longer prompt later re-leases a bigger region: same
  tokens as the bytes path with the same split;
- a sequence the server lost mid-generate is rebuilt through the region (recovery), same tokens;
- "auto" picks the region against this server with no warning; against a server whose KV cache
  is on the CPU it sends bytes with one RuntimeWarning and stats.transport_fallback, while
  "cuda" is refused at attach with FailedPrecondition.
Skips (saying why) without torch, a CUDA device, libcuda or transformers.
Run: ATTN_SERVER_BIN=build/server/attention-server PYTHONPATH=client/python \\
     python3 -m pytest -q -rs tests/integration/test_transformers_cuda_ipc_gpu.py
"""
import ctypes
import os
import sys
import warnings

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
torch = pytest.importorskip("torch", reason="torch is not installed: transformers CUDA IPC test "
                            "skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch: transformers CUDA IPC test skipped",
                allow_module_level=True)
try:
    ctypes.CDLL("libcuda.so.1")
except OSError:
    pytest.skip("no libcuda.so.1: transformers CUDA IPC test skipped", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed: "
                                   "transformers CUDA IPC test skipped")

import metrics_testlib as mt  # noqa: E402
import attention_client as ac  # noqa: E402
from attention_client.transformers_integration import attach  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())
LAYERS, VOCAB = 2, 97


@pytest.fixture(scope="module")
def server():
    s = mt.Server("--kv-device", "gpu", "--kv-cache-bytes", str(1 << 30), "--log-level", "info")
    yield s
    code = s.stop()
    log = s.read_log()
    s.tmp.cleanup()
    assert code == 0, log[-4000:]


@pytest.fixture(scope="module")
def client(server):
    with ac.AttentionClient(server.target, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1234)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
        pad_token_id=0, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).to(DEV, torch.float16).eval()


def padded(lengths, seed=7):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[b, width - n:] = 1
    return ids.to(DEV), mask.to(DEV)


def greedy(model, ids, mask, n=8, **kw):
    """(new tokens as lists, per-step logits (steps, B, vocab) float32)."""
    out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:].tolist(), torch.stack(out.logits).float()


def gauges(server):
    samples, _ = mt.parse(server.scrape())
    return {k: mt.value(samples, "attn_shared_memory_" + k) for k in ("regions", "leases")}


def extend_batch_ok(server):
    samples, _ = mt.parse(server.scrape())
    return mt.value(samples, "attn_requests_total", method="ExtendBatch", code="OK")


def assert_close(a, b, tol):
    """max |a - b| <= tol x max |b| (float32 copies)."""
    a, b = a.float(), b.float()
    d, scale = float((a - b).abs().max()), float(b.abs().max())
    assert d <= tol * scale, (d, scale)


def through_region_only(am):
    st = am.session.stats
    return st.region_calls == am.session.calls.rpcs > 0 and st.byte_calls == 0


def test_generate_through_the_region_equals_the_bytes_path(model, client, server):
    ids, mask = padded([5, 11, 2])
    with attach(model, client) as am:
        want_tokens, want_logits = greedy(model, ids, mask)
        assert am.session.stats.region_calls == 0 and am.session.calls.transport is None
    before = extend_batch_ok(server)
    with attach(model, client, transport_region="cuda") as am:
        tokens, logits = greedy(model, ids, mask)
        assert tokens == want_tokens
        assert_close(logits, want_logits, 1e-3)
        assert through_region_only(am)
        assert extend_batch_ok(server) - before == am.session.calls.rpcs == LAYERS * 8
        assert gauges(server) == {"regions": 1, "leases": 1}  # kept across generate calls
        assert greedy(model, ids, mask)[0] == want_tokens
        st = am.session.stats
        assert st.region_leases == 1 and st.transport_fallback is None
    assert gauges(server) == {"regions": 0, "leases": 0}  # detach ended the lease
    assert client.load().sequences == 0


def test_padded_forward_close_to_local_and_equal_to_bytes(model, client):
    ids, mask = padded([9, 4, 16], seed=3)
    real = mask.bool()
    with torch.no_grad():
        local = model(input_ids=ids, attention_mask=mask).logits.float()[real]
        with attach(model, client) as am:
            by_bytes = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        with attach(model, client, transport_region="cuda") as am:
            by_region = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            assert through_region_only(am)
    by_bytes, by_region = by_bytes.float()[real], by_region.float()[real]
    assert_close(by_region, by_bytes, 1e-3)
    assert_close(by_region, local, 2e-2)
    assert (by_region.argmax(-1) == local.argmax(-1)).float().mean() >= 0.9


def test_split_prefill_and_a_growing_region(model, client):
    small, _ = padded([6, 6])
    ids, mask = padded([300, 290, 310], seed=11)  # 900 tokens: 1.3 MiB of q, k, v and o a layer
    split = 64 << 10  # 64 KiB of q+k+v a call (1 KiB a token): 21 tokens of each of 3 rows
    with attach(model, client, max_call_bytes=split) as am:
        want = greedy(model, ids, mask, n=4)[0]
        split_rpcs = am.session.calls.rpcs
    assert split_rpcs == LAYERS * (15 + 3)  # prefill: 310 tokens in 15 calls; 3 decode steps
    with attach(model, client, transport_region="cuda", max_call_bytes=split) as am:
        assert greedy(model, ids, mask, n=4)[0] == want
        assert through_region_only(am) and am.session.calls.rpcs == split_rpcs
        assert am.session.calls.transport.region.nbytes == 1 << 20  # sized for one split call
        assert am.session.stats.region_leases == 1
    with attach(model, client) as am:
        want = greedy(model, ids, mask, n=4)[0]
    with attach(model, client, transport_region="cuda") as am:
        greedy(model, small, None, n=2)
        assert am.session.calls.transport.region.nbytes == 1 << 20
        assert greedy(model, ids, mask, n=4)[0] == want
        assert am.session.calls.transport.region.nbytes == 2 << 20  # re-leased bigger
        assert am.session.stats.region_leases == 2 and through_region_only(am)


class ForgetAt(transformers.LogitsProcessor):
    """Releases row `row`'s sequence through another client after the n-th forward."""

    def __init__(self, am, other, n, row):
        self.am, self.other, self.n, self.row, self.calls = am, other, n, row, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.n:
            self.other.sequence(self.am.session.sequence_ids()[self.row]).release()
        return scores


def test_lost_sequence_rebuilt_through_the_region(model, client, server):
    ids, mask = padded([5, 9, 3])
    with attach(model, client, transport_region="cuda") as am:
        want = greedy(model, ids, mask)[0]
        with ac.AttentionClient(server.target, timeout=60) as other:
            forget = transformers.LogitsProcessorList([ForgetAt(am, other, 3, 1)])
            assert greedy(model, ids, mask, logits_processor=forget)[0] == want
        assert am.session.stats.recoveries == 1 and through_region_only(am)


def test_auto_picks_the_region_here_and_falls_back_visibly_elsewhere(model, client):
    ids, mask = padded([4, 7])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with attach(model, client, transport_region="auto") as am:
            greedy(model, ids, mask, n=4)
            assert through_region_only(am) and am.session.stats.transport_fallback is None
    assert not [w for w in seen if "transport_region" in str(w.message)]
    cpu = mt.Server("--kv-device", "cpu", "--default-backend", "cpu", "--log-level", "info")
    try:
        with ac.AttentionClient(cpu.target, timeout=60) as c2:
            with pytest.raises(ac.FailedPrecondition, match="cuda_ipc_regions is false"):
                attach(model, c2, transport_region="cuda")
            assert model.config._attn_implementation == "sdpa"  # left as it was
            with pytest.warns(RuntimeWarning, match="transport_region='auto' sends q/k/v/o as "
                                                    "bytes: the server does not accept CUDA"):
                am = attach(model, c2, transport_region="auto")
            with am:
                assert len(greedy(model, ids, mask, n=4)[0][0]) == 4
                st = am.session.stats
                assert st.region_calls == 0 and st.byte_calls == am.session.calls.rpcs > 0
                assert "cuda_ipc_regions" in st.transport_fallback
    finally:
        assert cpu.close() == 0
