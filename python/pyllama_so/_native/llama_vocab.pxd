# cython: language_level=3
# llama.h, the vocabulary: special tokens, end of generation, tokenization and detokenization.

from libc.stdint cimport int32_t

from pyllama_so._native.llama cimport *


cdef extern from "llama.h" nogil:
    int32_t llama_vocab_n_tokens(const llama_vocab * vocab)
    llama_token llama_vocab_bos(const llama_vocab * vocab)
    llama_token llama_vocab_eos(const llama_vocab * vocab)
    llama_token llama_vocab_nl(const llama_vocab * vocab)
    llama_token llama_vocab_fim_pre(const llama_vocab * vocab)
    llama_token llama_vocab_fim_suf(const llama_vocab * vocab)
    llama_token llama_vocab_fim_mid(const llama_vocab * vocab)
    llama_token llama_vocab_fim_pad(const llama_vocab * vocab)
    llama_token llama_vocab_fim_rep(const llama_vocab * vocab)
    llama_token llama_vocab_fim_sep(const llama_vocab * vocab)
    bint llama_vocab_is_eog(const llama_vocab * vocab, llama_token token)
    bint llama_vocab_get_add_bos(const llama_vocab * vocab)
    int32_t llama_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len, llama_token * tokens,
                           int32_t n_tokens_max, bint add_special, bint parse_special)
    int32_t llama_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf, int32_t length,
                                 int32_t lstrip, bint special)
    int32_t llama_detokenize(const llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens, char * text,
                             int32_t text_len_max, bint remove_special, bint unparse_special)
