// The error lines llama.cpp logged on this thread since the bindings last took them (as many as fit): decodes
// run without the GIL, so two threads must not read each other's message. Written by the log callback,
// read and cleared by _take_last_error (_errors.pxi).
#pragma once

#define PYLLAMA_SO_LAST_ERROR_SIZE 1024

extern thread_local char pyllama_so_last_error[PYLLAMA_SO_LAST_ERROR_SIZE];
