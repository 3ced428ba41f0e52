"""A tiny verifier/drafter pair whose drafts are often accepted (tests of tree eval and the
serve plan): see :func:`bigram_models`."""

import torch

from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel

AUX = [2, 3, 4]
V = 16


def bigram_models():
    """A bigram world where drafts are often accepted: a 6-layer random Llama over 16 tokens
    with its attention and MLP outputs zeroed (every hidden state is the token's embedding, so
    its head makes the greedy next token f(x) = x + 5 mod 16), and a drafter whose ``fc`` sends the verifier's
    features of x to 5·onehot(f(f(x))) with an identity head: its first draft is right on a
    greedy text; its small random layer makes the deeper drafts and the runners-up vary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                      tie_word_embeddings=False)
    verifier = LlamaForCausalLM(cfg).eval()
    drafter = Eagle3DraftModel(Eagle3Config.from_verifier(cfg, draft_vocab_size=V,
                                                          aux_layer_ids=tuple(AUX))).eval()
    with torch.no_grad():
        for layer in verifier.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = verifier.get_input_embeddings().weight  # [V, 64]
        f = (torch.arange(V) + 5) % V  # one cycle through all 16 tokens
        normed = verifier.model.norm(emb)  # [V, 64]
        verifier.lm_head.weight.copy_(normed[(torch.arange(V) - 5) % V])  # row f(x) = x's
        assert verifier(input_ids=torch.arange(V)[:, None]).logits[:, 0].argmax(-1).equal(f)
        drafter.embed_tokens.weight.copy_(emb)
        aux = emb.repeat(1, len(AUX))  # [V, 3*64]: the features of token x
        target = torch.zeros(V, 64)
        target[torch.arange(V), f[f]] = 5.0
        drafter.fc.weight.copy_(torch.linalg.lstsq(aux, target).solution.T)
        drafter.lm_head.weight.copy_(torch.eye(V, 64))
        drafter.midlayer.self_attn.o_proj.weight.mul_(0.3)
        drafter.midlayer.mlp.down_proj.weight.mul_(0.3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (5, 17, 9)]
    return verifier, drafter, prompts
