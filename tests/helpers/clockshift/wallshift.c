/* A wall clock that jumps, for one process: LD_PRELOAD this library and point
 * CELLACTORS_WALL_SHIFT_FILE at a file holding a signed 64-bit count of nanoseconds
 * (little-endian). CLOCK_REALTIME, gettimeofday() and time() read the real clock plus that
 * offset; every other clock (CLOCK_MONOTONIC, CLOCK_BOOTTIME) and every sleep are left
 * alone, as a real step of the wall clock (NTP, an operator, a VM resumed) leaves them. The
 * file is mapped once, so a test moves the clock of a running process by rewriting it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *shift_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void load(void) {
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("CELLACTORS_WALL_SHIFT_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) shift_ns = (volatile const int64_t *)map;
}

static void shifted(struct timespec *ts) {
    if (shift_ns == NULL) return;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + *shift_ns;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = real_clock_gettime(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shifted(ts);
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
