"""The project's backends inside Hugging Face transformers models, through its attention interface.

    from flash_attention_py.hf_attention import register_hf_backends
    register_hf_backends()                      # -> ['fa_ladder_torch', 'fa_ladder_triton', 'fa_ladder_cuda']
    model = LlamaForCausalLM(config)            # any model written against transformers.AttentionInterface
    model.set_attn_implementation("fa_ladder_triton")
    # or: AutoModelForCausalLM.from_pretrained(..., attn_implementation="fa_ladder_cuda")

Each name is registered twice: with ``transformers.AttentionInterface`` (the attention function) and with
``transformers.AttentionMaskInterface`` (the mask function). The mask function matters: a name that has no mask
function gets *no* mask at all from transformers, so padding would be silently ignored. Ours hands the attention
function ``None`` when the mask is plain causal (or plain bidirectional) with no padding, and the mask otherwise,
which the attention function then refuses with a ValueError (the backends express only "causal" or "full").

The attention function receives, from the model's attention module,
    query (B, Hq, Nq, D), key and value (B, Hkv, Nk, D), attention_mask (None here, or refused),
    scaling (the softmax scale), dropout (must be 0), and keyword arguments such as ``is_causal``;
it returns (attn_output (B, Nq, Hq, D), None): no attention weights (they are never materialised).

Grouped-query attention: the backends take as many K/V heads as query heads (GQA kernels are later work), so
K and V are expanded here to the query heads (head h reads K/V head h // (Hq // Hkv), as transformers'
``repeat_kv`` does). The expansion is a copy of K and V; gradients flow back through it to the shared heads.

transformers is imported only when a function here is called; the package never needs it.
"""
from __future__ import annotations

__all__ = ["HF_BACKENDS", "register_hf_backends", "attention_function", "mask_function"]

def _torch_split():
    from .torch_split import flash_attn_torch

    return flash_attn_torch


def _triton():
    from flash_attention_triton import flash_attn_triton

    return flash_attn_triton


def _cuda():
    from flash_attention_cuda import flash_attn_cuda

    return flash_attn_cuda


# attn_implementation name -> (the function that imports the backend and returns it, fixed keyword arguments);
# the imports run when a backend is registered, so that importing this module stays cheap
HF_BACKENDS = {
    "fa_ladder_torch": (_torch_split, {}),
    "fa_ladder_triton": (_triton, {}),
    "fa_ladder_cuda": (_cuda, {"kernel": "auto"}),
}


def _load(name: str):
    load, fixed = HF_BACKENDS[name]
    return load(), fixed


def _expand_kv(x, groups: int):
    """(B, Hkv, N, D) -> (B, Hkv * groups, N, D), head h taking K/V head h // groups."""
    if groups == 1:
        return x
    B, Hkv, N, D = x.shape
    return x[:, :, None].expand(B, Hkv, groups, N, D).reshape(B, Hkv * groups, N, D)


def attention_function(name: str):
    """The transformers attention function for backend ``name`` (a key of :data:`HF_BACKENDS`)."""
    if name not in HF_BACKENDS:
        raise ValueError(f"attention_function: unknown backend {name!r}; expected one of {', '.join(HF_BACKENDS)}")
    fn_name = f"{name} attention"
    try:  # resolved now, not in the call: torch.compile(fullgraph=True) cannot trace an import
        backend, fixed = _load(name)
        import_error = None
    except ImportError as exc:  # e.g. no triton on this platform: the call says so
        backend, fixed, import_error = None, {}, exc

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if import_error is not None:
            raise ImportError(f"{fn_name}: the {name!r} backend does not import here: {import_error}")
        if attention_mask is not None:
            kind = "a padding mask" if attention_mask.dim() == 2 else f"a {attention_mask.dim()}-D attention mask"
            raise ValueError(
                f"{fn_name}: got {kind} of shape {tuple(attention_mask.shape)}; expected none: this backend "
                "computes only causal or full attention, so padded batches, sliding windows, packed sequences "
                "and custom masks are refused (use attn_implementation='sdpa' for them, or batch sequences of "
                "equal length without padding)")
        if dropout:
            raise ValueError(f"{fn_name}: got attention dropout {dropout}; expected 0.0 (the backends have no "
                             "dropout): set the config's attention_dropout to 0.0")
        for arg in ("sliding_window", "softcap", "s_aux"):
            if kwargs.get(arg) is not None:
                raise ValueError(f"{fn_name}: got {arg}={kwargs[arg]!r}; expected None (not supported by the backend)")
        if kwargs.get("output_attentions"):
            raise ValueError(f"{fn_name}: output_attentions=True asks for the attention weights, which are never "
                             "materialised; expected output_attentions=False (or attn_implementation='eager')")
        Hq, Hkv = query.shape[1], key.shape[1]
        if Hq % Hkv or value.shape[1] != Hkv:
            raise ValueError(f"{fn_name}: query has {Hq} heads, key {Hkv} and value {value.shape[1]}; expected "
                             "key and value to have the same number of heads, dividing the query's")
        # GQA: the backends have no grouped K/V heads yet, so expand K/V to the query heads here
        key, value = _expand_kv(key, Hq // Hkv), _expand_kv(value, Hq // Hkv)
        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        # causal is bottom-right aligned (flash_attention_py.masks): what a KV cache needs
        out = backend(query, key, value, causal=bool(is_causal), softmax_scale=scaling, **fixed)
        return out.transpose(1, 2).contiguous(), None

    forward.__name__ = f"{name}_attention_forward"
    forward.__doc__ = f"transformers attention function running the project's {name!r} backend."
    return forward


_MASKING_UTILS = []


def _masking_utils():
    """transformers.masking_utils, imported once outside any traced code (torch.compile cannot trace the
    import of transformers' lazy module inside the mask function)."""
    if not _MASKING_UTILS:
        from transformers import masking_utils

        _MASKING_UTILS.append(masking_utils)
    return _MASKING_UTILS[0]


def mask_function(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                  attention_mask=None, **kwargs):
    """transformers mask function: None for plain causal/bidirectional attention without padding, else a mask.

    Plain causal or bidirectional patterns go through transformers' ``flash_attention_mask`` (None, or the 2-D
    padding mask when some token is padding); any other pattern (sliding window, packed sequences, custom
    ``or``/``and`` masks) goes through ``sdpa_mask``, which returns None only when the pattern needs no mask.
    The attention function refuses every mask it gets.
    """
    mu = _masking_utils()
    if mask_function is None:
        mask_function = mu.causal_mask_function
    if mask_function in (mu.causal_mask_function, mu.bidirectional_mask_function):
        return mu.flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                                       attention_mask)
    return mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, **kwargs)


def register_hf_backends(names=None) -> list:
    """Register the backends (all of :data:`HF_BACKENDS`, or ``names``) with transformers; returns the names.

    Registering imports the backends' modules. Registering a backend that cannot run here is harmless: a model
    set to it raises the backend's own error (no GPU, or an ImportError where triton is not installed) on its
    first forward.
    """
    from transformers import AttentionInterface, AttentionMaskInterface

    _masking_utils()  # imported now, before any model is compiled

    names = list(HF_BACKENDS) if names is None else list(names)
    for name in names:
        if name not in HF_BACKENDS:
            raise ValueError(f"register_hf_backends: unknown backend {name!r}; "
                             f"expected one of {', '.join(HF_BACKENDS)}")
        AttentionInterface.register(name, attention_function(name))
        AttentionMaskInterface.register(name, mask_function)
    return names
