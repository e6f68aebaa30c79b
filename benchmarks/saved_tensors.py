"""What PyTorch autograd keeps for the backward pass, measured on CPU: walk the loss's grad_fn
graph and sum every distinct saved tensor storage (parameters and buffers excluded), credited to
the backward op that saves it. The evidence behind the cold start's per-op rules
(docs/cold-start.md): dev tool, needs torch plus timm or transformers (never a runtime dependency).

    python benchmarks/saved_tensors.py timm xception                 # 224 and 299, batch 2
    python benchmarks/saved_tensors.py hf bert_base 12 1 512 sdpa 0.1  # model layers batch seq impl p
"""
import collections
import sys

import torch

M = 2**20


def saved_bytes(loss, params, extra_alive=()):
    """(total bytes, bytes by 'Op:saved_name', op counts) autograd keeps for ``loss``."""
    pptr = {p.untyped_storage().data_ptr() for p in params}
    seen = {}
    by = collections.Counter(); cnt = collections.Counter()
    stack = [loss.grad_fn]; visited = set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in visited: continue
        visited.add(fn)
        name = type(fn).__name__
        cnt[name] += 1
        for attr in dir(fn):
            if not attr.startswith('_saved_'): continue
            try: v = getattr(fn, attr)
            except Exception: continue
            vs = v if isinstance(v, (tuple, list)) else (v,)
            for t in vs:
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    ptr = st.data_ptr()
                    if ptr in pptr or ptr == 0 or ptr in seen: continue
                    seen[ptr] = st.nbytes()
                    by[name + ':' + attr[7:]] += st.nbytes()
        for nxt, _ in fn.next_functions:
            if nxt is not None: stack.append(nxt)
    for t in extra_alive:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen[ptr] = t.untyped_storage().nbytes(); by['(alive) output'] += seen[ptr]
    return sum(seen.values()), by, cnt


def timm_main(names):
    import timm

    torch.manual_seed(0)
    for name in names or ['xception']:
        m = timm.create_model(name, pretrained=False, num_classes=1000)
        m.train()
        for res in (224, 299):
            b = 2
            x = torch.randn(b, 3, res, res)
            y = torch.randint(0, 1000, (b,))
            out = m(x); loss = torch.nn.functional.cross_entropy(out, y)
            tot, by, cnt = saved_bytes(loss, list(m.parameters()) + list(m.buffers()))
            print(f"{name} res {res} b {b}: saved {tot/M:.1f} MiB  ({tot/M/b:.1f} MiB/sample)")
            for k, v in by.most_common(12): print(f"    {k:45s} {v/M/b:8.2f} MiB/sample")
            del out, loss
        print(type(m).__name__, sum(p.numel() for p in m.parameters()))


def hf_main(argv):
    import transformers as T

    torch.manual_seed(0)
    which, layers, b, s = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    impl = argv[4] if len(argv) > 4 else 'sdpa'
    attn_p = float(argv[5]) if len(argv) > 5 else 0.1
    if which == 'bert_base':
        cfg = T.BertConfig(attention_probs_dropout_prob=attn_p, vocab_size=28996, num_hidden_layers=layers, attn_implementation=impl)
        m = T.BertForMaskedLM(cfg)
    elif which == 'bert_large':
        cfg = T.BertConfig(attention_probs_dropout_prob=attn_p, vocab_size=28996, hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16, intermediate_size=4096, attn_implementation=impl)
        m = T.BertForMaskedLM(cfg)
    elif which == 'gpt2_large':
        cfg = T.GPT2Config(attn_pdrop=attn_p, n_embd=1280, n_layer=layers, n_head=20, attn_implementation=impl)
        m = T.GPT2LMHeadModel(cfg)
    elif which == 'gpt2_xl':
        cfg = T.GPT2Config(attn_pdrop=attn_p, n_embd=1600, n_layer=layers, n_head=25, attn_implementation=impl)
        m = T.GPT2LMHeadModel(cfg)
    elif which == 'xlnet_base':
        cfg = T.XLNetConfig(d_model=768, n_layer=layers, n_head=12, d_inner=3072, attn_implementation=impl)
        m = T.XLNetForSequenceClassification(cfg)
    elif which == 'xlnet_large':
        cfg = T.XLNetConfig(d_model=1024, n_layer=layers, n_head=16, d_inner=4096, attn_implementation=impl)
        m = T.XLNetForSequenceClassification(cfg)
    m.train()
    ids = torch.randint(0, 1000, (b, s)); mask = torch.ones(b, s, dtype=torch.long)
    if which.startswith('xlnet'):
        out = m(input_ids=ids, attention_mask=mask, labels=torch.randint(0, 2, (b,)))
    else:
        out = m(input_ids=ids, attention_mask=mask, labels=ids)
    tot, by, cnt = saved_bytes(out.loss, list(m.parameters()) + list(m.buffers()), extra_alive=[out.logits])
    print(f"{which} impl {impl} layers {layers} b {b} s {s}: saved+logits {tot/M:.1f} MiB; logits {out.logits.numel()*4/M:.1f} MiB; attn impl {m.config._attn_implementation}")
    for k, v in by.most_common(25): print(f"    {k:50s} {v/M:9.2f} MiB")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("timm", "hf"):
        sys.exit("usage: saved_tensors.py timm [MODEL...] | hf MODEL LAYERS BATCH SEQ [IMPL [P]]")
    (timm_main if sys.argv[1] == "timm" else hf_main)(sys.argv[2:])
