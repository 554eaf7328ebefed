#include "row-pool.h"

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unistd.h>

struct pyllama_so_row_pool {
    std::mutex mu;
    std::condition_variable wake; // a job was posted, or stop
    std::condition_variable done; // the job's last part ended, or a worker exited
    void (*fn)(void * arg, int part) = nullptr;
    void * arg = nullptr;
    uint64_t job = 0; // counts the jobs posted
    int n_parts = 0;  // parts of the current job: part 0 runs on the caller, part w + 1 on worker w
    int n_left = 0;   // parts the workers have not finished
    int n_workers = 0;
    int n_running = 0; // workers that have not exited
    bool stop = false;
    pid_t pid = getpid(); // a forked child has none of these threads: it must not wait for them
};

// seen: the jobs posted before the worker was started (it takes part from the next one on, which may be posted
// before the worker first gets the lock)
static void pyllama_so_row_pool_worker(pyllama_so_row_pool * pool, int w, uint64_t seen) {
    std::unique_lock<std::mutex> lock(pool->mu);
    for (;;) {
        pool->wake.wait(lock, [&] { return pool->stop || pool->job != seen; });
        if (pool->stop) {
            break;
        }
        seen = pool->job;
        if (w + 1 >= pool->n_parts) {
            continue;
        }
        void (*fn)(void *, int) = pool->fn;
        void * arg = pool->arg;
        lock.unlock();
        fn(arg, w + 1);
        lock.lock();
        if (--pool->n_left == 0) {
            pool->done.notify_all();
        }
    }
    pool->n_running--;
    pool->done.notify_all();
}

pyllama_so_row_pool * pyllama_so_row_pool_new() {
    return new pyllama_so_row_pool();
}

void pyllama_so_row_pool_free(pyllama_so_row_pool * pool) {
    if (pool == nullptr || pool->pid != getpid()) {
        return;
    }
    {
        std::unique_lock<std::mutex> lock(pool->mu);
        pool->stop = true;
        pool->wake.notify_all();
        pool->done.wait(lock, [&] { return pool->n_running == 0; });
    }
    delete pool;
}

void pyllama_so_row_pool_run(pyllama_so_row_pool * pool, int n_parts, void (*fn)(void *, int), void * arg) {
    if (n_parts <= 1 || pool == nullptr || pool->pid != getpid()) {
        for (int part = 0; part < n_parts; part++) {
            fn(arg, part);
        }
        return;
    }
    {
        std::lock_guard<std::mutex> lock(pool->mu);
        for (; pool->n_workers < n_parts - 1; pool->n_workers++) {
            std::thread(pyllama_so_row_pool_worker, pool, pool->n_workers, pool->job).detach();
            pool->n_running++;
        }
        pool->fn      = fn;
        pool->arg     = arg;
        pool->n_parts = n_parts;
        pool->n_left  = n_parts - 1;
        pool->job++;
    }
    pool->wake.notify_all();
    fn(arg, 0);
    std::unique_lock<std::mutex> lock(pool->mu);
    pool->done.wait(lock, [&] { return pool->n_left == 0; });
}
