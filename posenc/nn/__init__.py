"""The model: a decoder-only transformer whose only positional machinery is its encoding
(``encodings/``, the contract in ``encodings/base.py``), the attention kernels chosen from what an
encoding offers (SDPA, FlexAttention, fla), the masks and layer layouts, and the recurrent layer kinds."""
