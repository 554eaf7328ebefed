# Exceptions, llama.cpp's log callback, and the one place where C return codes become exceptions.
# Included by _llama.pyx.

class LlamaError(RuntimeError):
    """An error reported by llama.cpp."""


class ModelLoadError(LlamaError, ValueError):
    """The model file (or metadata) could not be turned into a model."""


class ContextFullError(LlamaError):
    """The KV cache has no room for the batch: raise n_ctx or clear the context."""


class PromptTooLongError(ContextFullError, ValueError):
    """A prompt that leaves the context no room for a completion (llama-cpp-python raises ValueError there)."""


class DecodeError(LlamaError):
    """llama_decode failed for a reason other than a full context."""


class QuantizeError(LlamaError):
    """llama_model_quantize failed (unreadable input, unwritable output, unsupported tensor...)."""


# ---------------------------------------------------------------------------------------------
# logging: llama.cpp logs from any thread, so the callback touches no Python object. It keeps the thread's
# error lines in _last_error (last-error.h) for the exception that reports the failed call.

cdef int _log_threshold = GGML_LOG_LEVEL_WARN
cdef bint _log_last_shown = False

cdef void _log_callback(ggml_log_level level, const char * text, void * user_data) noexcept nogil:
    global _log_last_shown
    cdef bint show
    if level == GGML_LOG_LEVEL_CONT:
        show = _log_last_shown
    else:
        show = level != GGML_LOG_LEVEL_NONE and <int> level >= _log_threshold
        if level == GGML_LOG_LEVEL_ERROR:  # all of them: the first is the cause, the last the failed call
            strncat(_last_error, text, sizeof(_last_error) - 1 - strlen(_last_error))
    if show:
        fputs(text, stderr)
        fflush(stderr)
    _log_last_shown = show

cdef int _LOG_NONE = 99  # above every level: nothing shown
_LOG_LEVELS = {"debug": GGML_LOG_LEVEL_DEBUG, "info": GGML_LOG_LEVEL_INFO, "warn": GGML_LOG_LEVEL_WARN,
               "error": GGML_LOG_LEVEL_ERROR, "none": _LOG_NONE}


# the level the user chose with set_log_level, or -1 for none: Llama's verbose= must not override it
cdef int _log_explicit = -1
cdef bint _quiet_loads = False  # Llama(verbose=False): model loads and context creation show no log line


def set_log_level(level):
    """Show llama.cpp log lines at this level and above: debug, info, warn (default), error, none.

    A level set here stays until the next call: Llama(verbose=True) may only lower it to info.
    None forgets it (back to warn, and to what verbose= asks for).
    """
    global _log_threshold, _log_explicit, _quiet_loads
    if level is None:
        _log_explicit = -1
        _log_threshold = GGML_LOG_LEVEL_WARN
        _quiet_loads = False
        return
    if not isinstance(level, str) or level not in _LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {sorted(_LOG_LEVELS)} or None")
    _log_explicit = _log_threshold = _LOG_LEVELS[level]


def set_verbose(bint verbose):
    """Llama's verbose=: info lines and above when True; when False error lines only, and none while a
    model loads or a context is made (their errors go into the exception), as llama-cpp-python's
    verbose=False. A level set with set_log_level is kept, except that verbose=True lowers it to info."""
    global _log_threshold, _quiet_loads
    cdef int base = _log_explicit if _log_explicit >= 0 else <int> GGML_LOG_LEVEL_ERROR
    _log_threshold = min(base, <int> GGML_LOG_LEVEL_INFO) if verbose else base
    _quiet_loads = not verbose


cdef int _quiet_load_begin() noexcept:
    """Around a model load or context creation: no log line after Llama(verbose=False) (but with a level
    set by set_log_level). Returns the threshold for _quiet_load_end."""
    global _log_threshold
    cdef int saved = _log_threshold
    if _quiet_loads and _log_explicit < 0:
        _log_threshold = _LOG_NONE
    return saved


cdef void _quiet_load_end(int saved) noexcept:
    global _log_threshold
    _log_threshold = saved


cdef str _take_last_error():
    """The error lines the calling thread logged since the last call, joined by "; " (empty if none),
    cleared."""
    text = (<bytes> _last_error).decode("utf-8", "replace")
    _last_error[0] = 0
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


cdef list _take_errors():
    """The error lines the calling thread logged since the last take, in order (for failures llama.cpp
    reports in several lines: the cause first); cleared."""
    text = (<bytes> _last_error).decode("utf-8", "replace")
    _last_error[0] = 0
    return [line.strip() for line in text.splitlines() if line.strip()]


cdef _check_decode(int rc, str what, str call="llama_decode"):
    """The one place where llama_decode's (and llama_encode's) return codes become exceptions."""
    detail = _take_last_error()  # on success too: a later call's detail must be its own
    if rc == 0:
        return
    if rc == 1:
        raise ContextFullError(f"{what}: no KV-cache slot for the batch (the context is full; raise n_ctx)")
    if rc == 2:
        raise DecodeError(f"{what}: aborted")
    if rc == -1:
        raise ValueError(f"{what}: invalid batch" + (f" ({detail})" if detail else ""))
    raise DecodeError(f"{what}: {call} returned {rc}" + (f": {detail}" if detail else ""))


cdef _null_check(const void * ptr, exc_type, str what):
    detail = _take_last_error()
    if ptr == NULL:
        raise exc_type(what + (f": {detail}" if detail else ""))


cdef _check_quantize(uint32_t rc, str what):
    detail = _take_last_error()
    if rc != 0:
        raise QuantizeError(what + (f": {detail}" if detail else f" (llama_model_quantize returned {rc})"))
