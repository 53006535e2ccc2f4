"""attention_client.transformers_integration against the real attention-server (CPU KV cache,
cpu backend) with a tiny random Llama (2 layers, hidden 64, 4 heads / 2 kv heads, head dim 16,
float32): generate through the server equals the local model token for token; left-padded rows
equal single-row runs; sampling runs; unsupported attention is refused; lost sequences are
rebuilt; the server's own counters and sequence lengths moved by what was sent.

Run: ATTN_SERVER_BIN=build/server/attention-server PYTHONPATH=client/python \
     python3 -m pytest -q -rs tests/python/test_transformers_integration.py
Skips (whole module) when torch or transformers is not installed.
"""
import inspect
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

torch = pytest.importorskip("torch", reason="torch and transformers are needed for the "
                            "transformers integration test (pip install torch transformers)")
transformers = pytest.importorskip("transformers", reason="torch and transformers are needed "
                                   "for the transformers integration test (pip install torch "
                                   "transformers)")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
from attention_client import AttentionClient, NotFound  # noqa: E402
from attention_client.session import SequenceLost  # noqa: E402
from attention_client.transformers_integration import UnsupportedModel, attach  # noqa: E402

SERVER = os.environ.get("ATTN_SERVER_BIN", "build/server/attention-server")
LAYERS, VOCAB = 2, 97


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """(target, metrics_url) of a CPU-only server on loopback."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        mport = _free_port()
        proc = subprocess.Popen([SERVER, "--listen", "127.0.0.1:0", "--port-file", port_file,
                                 "--kv-device", "cpu", "--default-backend", "cpu",
                                 "--metrics-address", f"127.0.0.1:{mport}",
                                 "--log-level", "warn"], stderr=subprocess.PIPE)
        try:
            for _ in range(300):
                if os.path.exists(port_file) and open(port_file).read().strip():
                    break
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
            yield f"127.0.0.1:{int(open(port_file).read())}", f"http://127.0.0.1:{mport}/metrics"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def client(server):
    with AttentionClient(server[0], timeout=30) as c:
        yield c


def _config(cls=transformers.LlamaConfig, **kw):
    args = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, max_position_embeddings=256, pad_token_id=0)
    args.update(kw)
    return cls(**args)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1234)
    return transformers.LlamaForCausalLM(_config()).eval()


def _padded(lengths, seed=7):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = p
        mask[b, width - len(p):] = 1
    return prompts, ids, mask


def _greedy(model, ids, mask=None, n=6, **kw):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, **kw)
    return out[:, ids.shape[1]:].tolist()


def _extend_batch_ok(metrics_url):
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    m = re.search(r'^attn_requests_total\{[^}]*code="OK"[^}]*method="ExtendBatch"[^}]*\} (\S+)',
                  text, re.M)
    assert m, "attn_requests_total{method=ExtendBatch,code=OK} not exported"
    return float(m.group(1))


def test_greedy_b1_equals_local(model, client):
    prompts, ids, _ = _padded([9])
    local = _greedy(model, ids, n=10)
    with attach(model, client) as am:
        served = _greedy(model, ids, n=10)
        assert am.session.stats.extend_calls == LAYERS * 10  # prefill + 9 decode forwards
    assert served == local
    assert client.load().sequences == 0  # released when generate returned


def test_left_padded_rows_equal_single_rows(model, client):
    prompts, ids, mask = _padded([5, 11, 2])
    with attach(model, client) as am:
        singles = [_greedy(model, p[None])[0] for p in prompts]
        batched = _greedy(model, ids, mask)
        # padding never reaches the server: prefill sends only the 18 real tokens per layer
        assert am.session.stats.tokens == LAYERS * (5 + 11 + 2) * 2 + LAYERS * 3 * 5 * 2
    assert batched == singles
    assert singles == [_greedy(model, p[None])[0] for p in prompts]  # local single rows
    # a prefill split into many small ExtendBatch calls gives the same tokens
    with attach(model, client, max_call_bytes=3000) as am:
        assert _greedy(model, ids, mask) == singles
        assert am.session.stats.extend_calls == LAYERS * 6


def test_sampling_with_fixed_seed(model, client):
    _, ids, mask = _padded([4, 7])
    with attach(model, client) as am:
        runs = []
        for _ in range(2):
            torch.manual_seed(99)
            out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=True,
                                 top_k=20, temperature=1.3)
            runs.append(out[:, ids.shape[1]:].tolist())
        assert am.session.stats.extend_calls == 2 * LAYERS * 8
    assert runs[0] == runs[1]
    assert all(len(r) == 8 and all(0 <= t < VOCAB for t in r) for r in runs[0])


def test_refuses_attention_sequences_cannot_express(client):
    cases = [
        (transformers.MistralForCausalLM,
         _config(transformers.MistralConfig, sliding_window=8), "sliding_window=8"),
        (transformers.Gemma2ForCausalLM,
         _config(transformers.Gemma2Config, attn_logit_softcapping=50.0), "soft"),
        (transformers.GptOssForCausalLM,
         _config(transformers.GptOssConfig, num_local_experts=2, num_experts_per_tok=1,
                 intermediate_size=32), "sinks"),
    ]
    for cls, cfg, needle in cases:
        m = cls(cfg).eval()
        with pytest.raises(UnsupportedModel, match=needle):
            attach(m, client)
        assert m.config._attn_implementation != "attention_server"
    # the same Mistral without a window is fine and matches its local greedy output
    torch.manual_seed(5)
    m = transformers.MistralForCausalLM(_config(transformers.MistralConfig,
                                                sliding_window=None)).eval()
    _, ids, _ = _padded([6])
    local = _greedy(m, ids)
    with attach(m, client):
        assert _greedy(m, ids) == local


def test_static_cache_config_served_and_beam_search_refused(model, client):
    _, ids, _ = _padded([7, 7])
    local = _greedy(model, ids)
    with attach(model, client) as am:
        # a requested static cache is replaced by the server's (and generate never compiles)
        assert _greedy(model, ids, cache_implementation="static") == local
        assert am.session.stats.extend_calls == LAYERS * 6
        with pytest.raises(NotImplementedError, match="beam search"):
            model.generate(ids, max_new_tokens=3, num_beams=2, do_sample=False)
    assert client.load().sequences == 0


def test_without_attach_the_implementation_refuses(client):
    torch.manual_seed(3)
    m = transformers.LlamaForCausalLM(_config()).eval()
    with attach(m, client):
        pass
    m.set_attn_implementation("attention_server")
    with pytest.raises(RuntimeError, match="attach"):
        m(torch.tensor([[1, 2, 3]]))
    # attached, but the attention switched back to a local implementation: refused, not
    # silently run locally
    with attach(m, client) as am:
        m.set_attn_implementation("sdpa")
        with pytest.raises(RuntimeError, match="no silent local fallback"):
            m(torch.tensor([[1, 2, 3]]))
        assert am.session.stats.extend_calls == 0


class _ForgetAt(transformers.LogitsProcessor):
    """Releases row `row`'s sequence through another client after the n-th forward."""

    def __init__(self, am, other, n, row):
        self.am, self.other, self.n, self.row, self.calls = am, other, n, row, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.n:
            self.other.sequence(self.am.session.sequence_ids()[self.row]).release()
        return scores


def test_recovery_after_the_server_forgets_a_sequence(model, client, server):
    _, ids, mask = _padded([5, 9, 3])
    expected = _greedy(model, ids, mask)
    with AttentionClient(server[0], timeout=30) as other:
        with attach(model, client) as am:
            forget = transformers.LogitsProcessorList([_ForgetAt(am, other, 3, 1)])
            assert _greedy(model, ids, mask, logits_processor=forget) == expected
            assert am.session.stats.recoveries == 1
            # lost in the middle of a step (before layer 1 of the 3rd forward): the rows that
            # appended are truncated back, the lost row re-prefilled, the step rerun
            real_extend, count = am.session.calls.extend_layer, [0]

            def extend(layer, seqs, *a, **k):
                count[0] += 1
                if count[0] == 2 * LAYERS + 2:
                    other.sequence(seqs[2].id).release()
                return real_extend(layer, seqs, *a, **k)
            am.session.calls.extend_layer = extend
            assert _greedy(model, ids, mask) == expected
            assert am.session.stats.recoveries == 2 and am.session.stats.rollbacks == 2
        with attach(model, client, recovery="raise") as am:
            forget = transformers.LogitsProcessorList([_ForgetAt(am, other, 2, 0)])
            with pytest.raises(SequenceLost, match="recovery='raise'") as err:
                _greedy(model, ids, mask, logits_processor=forget)
            assert err.value.rows == [0] and isinstance(err.value, NotFound)
    assert client.load().sequences == 0


def test_server_counters_moved(model, client, server):
    prompts, ids, mask = _padded([6, 3, 8, 1])
    new = 5
    before = _extend_batch_ok(server[1])
    with attach(model, client, release_after_generate=False) as am:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
        assert out.shape == (4, ids.shape[1] + new)
        forwards = new  # prefill + (new - 1) decode steps
        assert _extend_batch_ok(server[1]) - before == LAYERS * forwards
        assert client.load().sequences == 4
        for p, sid in zip(prompts, am.session.sequence_ids()):
            info = client.sequence(sid).info
            # every layer of every row holds exactly its real tokens: layers x steps x batch
            assert list(info.layer_lengths) == [len(p) + new - 1] * LAYERS
        assert am.session.stats.extend_steps == LAYERS * forwards * 4
    assert client.load().sequences == 0  # detach released them


def test_frontend_bench_runs_tiny(tmp_path):
    """bench/frontend_bench.py end to end at tiny sizes (it starts its own server): exit 0,
    every case checked against the server's counters and sequence lengths."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    out = tmp_path / "fb.json"
    cmd = [sys.executable, os.path.join(root, "bench", "frontend_bench.py"), "--device", "cpu",
           "--dtype", "float32", "--kv-device", "cpu", "--layers", "2", "--hidden", "64",
           "--intermediate", "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
           "--vocab", str(VOCAB), "--batches", "1,3", "--prompts", "6", "--new-tokens", "3",
           "--local-loop", "dynamic", "--server-bin", SERVER, "--transports", "tcp",
           "--tf-rows", "2", "--tf-prompt", "5", "--tf-tokens", "4", "--baseline-calls", "20",
           "--max-call-mb", "0", "--server-compile", "tcp", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    import json
    doc = json.loads(out.read_text())
    assert doc["failures"] == []
    cases = doc["server"]["tcp"]["cases"]
    assert [(c["prompt"], c["batch"]) for c in cases] == [(6, 1), (6, 3)]
    for c in cases:
        ck = c["checks"]
        assert ck["extend_steps"] == ck["extend_steps_expected"] == LAYERS * 4 * c["batch"]
        assert ck["server_extendbatch_delta"] == ck["rpcs"] == LAYERS * (6 + 3)  # 1-token calls
        assert c["rows_with_wrong_length"] == []
    tf = doc["server"]["tcp"]["teacher_forced"]["server_vs_full"]
    assert tf["max_abs"] < 1e-4 and tf["argmax_agreement"] == 1.0  # float32: no noise to speak of
    assert "server p50 ms" in p.stdout  # the table was printed
    assert "decode layer call, client phases p50 ms: gather" in p.stdout
    for c in cases:  # the client call's own phases, per layer call (CallTiming.client)
        dc = c["decode_layer_calls"]
        assert all(dc[f"client_{ph}_us"]["p50"] > 0 for ph in
                   ("gather", "encode", "rpc", "decode", "scatter"))
        assert dc["client_rpc_us"]["p50"] < dc["client_call_us"]["p50"]
    # The same cases with model.forward under torch.compile (graph breaks at the attention
    # calls, which still go to the server): same checks, same logits as the local loop.
    compiled = doc["server"]["tcp"]["compiled_cases"]
    assert [(c["prompt"], c["batch"]) for c in compiled] == [(6, 1), (6, 3)]
    for c in compiled:
        assert "error" not in c, c.get("error")
        ck = c["checks"]
        assert ck["extend_steps"] == ck["extend_steps_expected"] == LAYERS * 4 * c["batch"]
        assert ck["server_extendbatch_delta"] == ck["rpcs"]
        assert c["prefill_logits_max_abs_vs_local"] < 1e-4
        assert c["loop"].startswith("torch.compile(model.forward")
    assert "tcp+compile" in p.stdout


def test_compiled_model_shares_one_graph_across_layers(client):
    """torch.compile(model.forward) on an attached model: the attention calls stay RPCs (the
    session's counters move by layers x forwards x rows), the logits equal the eager attached
    run's, and with 10 layers no frame hits dynamo's recompile limit (8): the attention
    frames are not specialised per layer (ServerCache.update ignores layer_idx, its layers
    have no first-call branch), so a 16-layer model compiles as a whole instead of falling
    back to eager after 8 layers."""
    import torch._dynamo as dynamo
    layers = 10
    torch.manual_seed(99)
    m = transformers.LlamaForCausalLM(_config(num_hidden_layers=layers)).eval()
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(5))

    def run(steps=3):
        logits, forwards = [], 0
        with attach(m, client) as am, torch.no_grad():
            out = m(input_ids=ids, use_cache=True)
            cache = getattr(out, "cache", None) or out.past_key_values
            kw = "cache" if "cache" in inspect.signature(m.forward).parameters \
                else "past_key_values"
            forwards += 1
            for _ in range(steps):
                logits.append(out.logits[:, -1].float())
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                out = m(input_ids=tok, use_cache=True, **{kw: cache})
                forwards += 1
            logits.append(out.logits[:, -1].float())
            assert am.session.stats.extend_steps == layers * forwards * ids.shape[0]
        return torch.stack(logits)

    eager = run()
    fwd0 = m.forward
    saved = dynamo.config.fail_on_recompile_limit_hit
    dynamo.reset()
    dynamo.config.fail_on_recompile_limit_hit = True  # a fallback to eager raises here
    try:
        m.forward = torch.compile(fwd0, mode="default", dynamic=False)
        for _ in range(2):  # the second conversation reuses the graphs
            compiled = run()
            assert torch.allclose(compiled, eager, atol=1e-5, rtol=1e-5), \
                (compiled - eager).abs().max()
    finally:
        m.forward = fwd0
        dynamo.config.fail_on_recompile_limit_hit = saved
        dynamo.reset()
