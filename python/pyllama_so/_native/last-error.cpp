#include "last-error.h"

thread_local char pyllama_so_last_error[PYLLAMA_SO_LAST_ERROR_SIZE];
