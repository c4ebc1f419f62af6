#include <sched.h>
#include <time.h>

#include "poll.h"

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

uint64_t mr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t mr_poll_byte(const volatile uint8_t *p, uint8_t want, uint64_t timeout_ns)
{
    uint64_t t0 = mr_now_ns(), now = t0;
    unsigned spins = 0;
    while (*p != want) {
        cpu_relax();
        if (++spins % 32 == 0) {
            now = mr_now_ns();
            if (now - t0 > timeout_ns)
                return -1;
            /* the daemon that moves our packets may need this CPU: let it run (a pure spin
             * starves it until the scheduler's tick, milliseconds on a 2-vCPU machine; the
             * scheduler gives a yielding spinner's CPU to the other runnable one, so the
             * interval is how long the daemon may wait for it) */
            sched_yield();
        }
    }
    return (int64_t)(mr_now_ns() - t0);
}
