// Worker threads that sample a step's output rows (pyllama_so_sample_rows), kept for the life of a Context:
// a step used to start and join its threads, about 20-30 us a thread, on the path from one step's logits
// to the next step's launch, while the devices wait.
#pragma once

struct pyllama_so_row_pool;

pyllama_so_row_pool * pyllama_so_row_pool_new();

// Stops and frees the pool; in a forked child (whose copy has no threads) the copy is left as it is.
void pyllama_so_row_pool_free(pyllama_so_row_pool * pool);

// Runs fn(arg, part) for part in [0, n_parts): part 0 on the calling thread, the others on the pool's workers
// (started when first needed), and returns when all have ended. One caller at a time.
void pyllama_so_row_pool_run(pyllama_so_row_pool * pool, int n_parts, void (*fn)(void * arg, int part), void * arg);
