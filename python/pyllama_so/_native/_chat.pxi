# Chat templates: llama.cpp's built-in formats (no Jinja), chosen by name or detected in a model's
# template. Included by _llama.pyx.

def chat_builtin_templates():
    """Names of the chat templates llama.cpp formats itself ("chatml", "llama3", ...)."""
    cdef int32_t n = llama_chat_builtin_templates(NULL, 0)
    cdef const char ** names = <const char **> calloc(max(n, 1), sizeof(char *))
    try:
        n = llama_chat_builtin_templates(names, n)
        return [(<bytes> names[i]).decode() for i in range(n)]
    finally:
        free(names)


def chat_apply_template(str template, messages, bint add_assistant=True):
    """Format messages ({"role": ..., "content": ...} mappings, contents as str) with a chat template:
    a built-in name (chat_builtin_templates()) or a model's template text, which llama.cpp recognizes by
    its markers. add_assistant ends the text with the start of an assistant turn. ValueError for a
    template llama.cpp does not know."""
    cdef list keep = []  # the encoded strings, alive while C points into them
    cdef Py_ssize_t n = len(messages), i
    cdef llama_chat_message * chat = <llama_chat_message *> calloc(max(n, 1), sizeof(llama_chat_message))
    cdef bytes btmpl = template.encode()
    cdef bytes role, content
    cdef int32_t size = 256, got
    cdef char * buf = NULL
    try:
        for i in range(n):
            role = str(messages[i]["role"]).encode()
            content = str(messages[i]["content"]).encode()
            if b"\0" in role or b"\0" in content:
                raise ValueError("a chat message contains a NUL character")
            keep += [role, content]
            chat[i].role = role
            chat[i].content = content
            size += 2 * (len(role) + len(content))
        while True:
            buf = <char *> malloc(size)
            got = llama_chat_apply_template(btmpl, chat, n, add_assistant, buf, size)
            if got < 0:
                raise ValueError("llama_chat_apply_template cannot format these messages with the template "
                                 f"{template[:80]!r} (not one it knows, see chat_builtin_templates())")
            if got <= size:
                return PyBytes_FromStringAndSize(buf, got).decode("utf-8", "replace")
            free(buf)
            buf = NULL
            size = got
    finally:
        free(buf)
        free(chat)
